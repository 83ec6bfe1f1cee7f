"""config/fp8.yaml's 2.7B rungs beside benchmarks/fp8_plain.py, from one call on one GPU: per
recipe, profbench's untraced step (median, 95% CI) over the plain script's, and each FP8
rung's last loss over the bf16 rung's (the same steps, the same seed).

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


def compare(results: Path, plain: dict[str, Any]) -> list[dict[str, Any]]:
    with open(results / "summary.csv") as f:
        summary = {row["run"]: row for row in csv.DictReader(f)}
    bf16_loss = last_loss(results, RUNGS["bf16"])
    rows = []
    for recipe, run in RUNGS.items():
        row = summary.get(run, {})
        mine = float(row["step_ms"]) if row.get("step_ms") else None
        theirs = plain["recipes"].get(recipe, {}).get("step_ms")
        loss = last_loss(results, run) if row.get("status") == "ok" else None
        ratio = mine / theirs if mine and theirs else None
        loss_ratio = loss / bf16_loss if loss and bf16_loss else None
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
            }
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=Path("results/fp8"))
    p.add_argument("--plain", type=Path, required=True, help="fp8_plain.py's --out JSON")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    rows = compare(args.results, json.loads(args.plain.read_text()))
    for r in rows:
        step = "-" if r["step_ms"] is None else f"{r['step_ms']:.1f} [{r['ci'][0]}, {r['ci'][1]}]"
        ratio = (
            "-"
            if r["ratio"] is None
            else f"{r['ratio']:.3f} ({'ok' if r['within_5pct'] else 'OFF'})"
        )
        loss = "-" if r["loss_vs_bf16"] is None else f"{r['loss_vs_bf16']:.4f}"
        print(
            f"{r['recipe']:>10}: {r['status']}, profbench {step} ms, plain "
            f"{r['plain_ms'] or '-'} ms, ratio {ratio}, loss / bf16's {loss}"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
