"""config/fp8.yaml's 2.7B rungs beside benchmarks/fp8_plain.py, from one call on one GPU: per
recipe, profbench's untraced step (median, 95% CI) over the plain script's, and each FP8
rung's last loss over the bf16 rung's (the same steps, the same seed), beside the plain
script's own FP8 loss over its bf16 loss (whether a gap is torchao's on this model); then
every FP8 run of the config (the other ladders, the whole-step graphs, the batch sweep) with
its last loss over its bf16 twin's, the run whose parameters differ in ``float8`` alone.

    python benchmarks/fp8_vs_plain.py --results results/fp8 --plain fp8_plain.json

A rung within 5% of the plain script, and an FP8 loss within 2% of bf16's, is what
config/fp8.yaml's acceptance asks; the table says yes or no for each.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

# plain script's recipe -> the rung of config/fp8.yaml's 2.7B ladder that runs it
RUNGS = {
    "bf16": "gpt_fp8_2.7B_0_bf16_compiled",
    "tensorwise": "gpt_fp8_2.7B_1_fp8_tensorwise",
    "rowwise": "gpt_fp8_2.7B_2_fp8_rowwise",
}
STEP_TOLERANCE, LOSS_TOLERANCE = 0.05, 0.02


def last_loss(results: Path, run: str) -> float | None:
    """The last measured loss of the run's first timing record."""
    records = sorted((results / run / "timing").glob("r*.json"))
    losses = json.loads(records[0].read_text()).get("losses") if records else None
    return losses[-1] if losses else None


def plain_last_loss(plain: dict[str, Any], recipe: str) -> float | None:
    """The plain script's last loss of one recipe."""
    losses = plain["recipes"].get(recipe, {}).get("losses")
    return losses[-1] if losses else None


def compare(results: Path, plain: dict[str, Any]) -> list[dict[str, Any]]:
    with open(results / "summary.csv") as f:
        summary = {row["run"]: row for row in csv.DictReader(f)}
    bf16_loss = last_loss(results, RUNGS["bf16"])
    plain_bf16_loss = plain_last_loss(plain, "bf16")
    rows = []
    for recipe, run in RUNGS.items():
        row = summary.get(run, {})
        mine = float(row["step_ms"]) if row.get("step_ms") else None
        theirs = plain["recipes"].get(recipe, {}).get("step_ms")
        loss = last_loss(results, run) if row.get("status") == "ok" else None
        ratio = mine / theirs if mine and theirs else None
        loss_ratio = loss / bf16_loss if loss and bf16_loss else None
        plain_loss = plain_last_loss(plain, recipe)
        rows.append(
            {
                "recipe": recipe,
                "run": run,
                "status": row.get("status"),
                "step_ms": mine,
                "ci": (row.get("step_ci_low_ms"), row.get("step_ci_high_ms")),
                "plain_ms": theirs,
                "ratio": ratio,
                "within_5pct": None if ratio is None else abs(ratio - 1) <= STEP_TOLERANCE,
                "loss": loss,
                "loss_vs_bf16": loss_ratio,
                "loss_within_2pct": None
                if loss_ratio is None
                else abs(loss_ratio - 1) <= LOSS_TOLERANCE,
                # the plain script's own FP8 loss over its bf16 loss (its steps): whether a
                # gap is torchao's on this model or profbench's
                "plain_loss_vs_bf16": plain_loss / plain_bf16_loss
                if plain_loss and plain_bf16_loss else None,
            }
        )
    return rows


def twin_losses(results: Path) -> list[dict[str, Any]]:
    """Every finished FP8 run's last loss over its bf16 twin's (plan.json: the same
    parameters but ``float8: none``), in the plan's order; a config run in parts (its
    ``select``s, scripts/fp8-on-gpu.sh) has the other parts' runs under ``unselected``."""
    plan = json.loads((results / "plan.json").read_text())
    runs = {**(plan.get("unselected") or {}), **plan["runs"]}
    with open(results / "summary.csv") as f:
        ok = {row["run"] for row in csv.DictReader(f) if row.get("status") == "ok"}

    def without_float8(run: str) -> str:
        params = {k: v for k, v in runs[run]["params"].items() if k != "float8"}
        return json.dumps(params, sort_keys=True)

    finished_fp8 = {r for r in runs if r in ok
                    and runs[r]["params"].get("float8", "none") != "none"}
    bf16 = {without_float8(r): r for r in runs if r in ok and r not in finished_fp8}
    rows = []
    for run in (r for r in runs if r in finished_fp8):
        twin = bf16.get(without_float8(run))
        if not twin:
            continue
        loss, twin_loss = last_loss(results, run), last_loss(results, twin)
        ratio = loss / twin_loss if loss and twin_loss else None
        rows.append({"run": run, "bf16_run": twin, "loss": loss, "bf16_loss": twin_loss,
                     "loss_vs_bf16": ratio,
                     "loss_within_2pct": None if ratio is None
                     else abs(ratio - 1) <= LOSS_TOLERANCE})
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=Path("results/fp8"))
    p.add_argument("--plain", type=Path, required=True, help="fp8_plain.py's --out JSON")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    rows = compare(args.results, json.loads(args.plain.read_text()))
    for r in rows:
        low, high = (float(c) if c else float("nan") for c in r["ci"])
        step = "-" if r["step_ms"] is None else f"{r['step_ms']:.1f} [{low:.1f}, {high:.1f}]"
        ratio = (
            "-"
            if r["ratio"] is None
            else f"{r['ratio']:.3f} ({'ok' if r['within_5pct'] else 'OFF'})"
        )
        loss, plain_loss = ("-" if r[k] is None else f"{r[k]:.4f}"
                            for k in ("loss_vs_bf16", "plain_loss_vs_bf16"))
        plain_ms = "-" if r["plain_ms"] is None else f"{r['plain_ms']:.1f}"
        print(
            f"{r['recipe']:>10}: {r['status']}, profbench {step} ms, plain {plain_ms} ms, "
            f"ratio {ratio}, loss / bf16's {loss} (plain script: {plain_loss})"
        )
    print("every FP8 run's last loss over its bf16 twin's:")
    for r in twin_losses(args.results):
        ratio = "-" if r["loss_vs_bf16"] is None else (
            f"{r['loss_vs_bf16']:.4f} ({'ok' if r['loss_within_2pct'] else 'OFF'})")
        print(f"  {r['run']}: {ratio}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
