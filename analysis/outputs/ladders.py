"""Ladder tables: what each standard optimization buys, rung by rung (docs/ladders.md).

    python -m analysis ladders --results R --plan R/plan.json --summary R/summary.csv -o R/ladders

One CSV per ladder and group (e.g. ``gpt_train_small.csv``): each rung's untraced step time
with its 95% CI, the speed-up over the rung before and over the first rung (each with its CI
and significance), MFU, peak memory (GiB the step held, and reserved), compile time, and the
status of rungs that did not run (``oom``, ``unsupported``, ...). A failed rung is skipped
when computing the next rung's gain: that rung is compared with the last rung that ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from analysis.metrics.timing import speedup
from analysis.outputs.runs import OK, read_timing

SUMMARY_COLUMNS = [
    "status", "message", "step_ms", "step_ci_low_ms", "step_ci_high_ms", "unstable", "mfu",
    "mfu_measured_peak", "tflops", "peak_memory_gib", "peak_reserved_gib", "peak_memory_bytes",
    "compile_s", "step_ms_traced",
    "profiler_overhead",
]  # fmt: skip


def ladder_groups(plan: dict[str, Any]) -> dict[str, list[tuple[int, str, str]]]:
    """table name -> [(rung index, rung name, run name)] in rung order."""
    groups: dict[str, list[tuple[int, str, str]]] = {}
    for run, info in plan["runs"].items():
        if "ladder" in info:
            table = f"{info['ladder']}_{info['ladder_group']}"
            groups.setdefault(table, []).append((info["rung_index"], info["rung"], run))
    return {t: sorted(rungs) for t, rungs in groups.items()}


def ladder_ends(plan: dict[str, Any]) -> set[str]:
    """The first and the last rung of each ladder group: the runs a ladder is read between."""
    return {run for rungs in ladder_groups(plan).values() for _, _, run in (rungs[0], rungs[-1])}


def _gain(results: Path, base: str | None, run: str, prefix: str) -> dict[str, Any]:
    cols = {f"{prefix}": None, f"{prefix}_ci_low": None, f"{prefix}_ci_high": None,
            f"{prefix}_significant": None}  # fmt: skip
    if base is None:
        return cols
    a, b = read_timing(results / base), read_timing(results / run)
    if a.status != OK or b.status != OK:
        return cols
    s = speedup(a.per_process_ms, b.per_process_ms)
    return {prefix: s.ratio, f"{prefix}_ci_low": s.ci_low, f"{prefix}_ci_high": s.ci_high,
            f"{prefix}_significant": s.significant}  # fmt: skip


def ladder_table(
    results: Path, rungs: list[tuple[int, str, str]], summary: pd.DataFrame
) -> pd.DataFrame:
    by_run = summary.set_index("run")
    rows, first_ok, last_ok = [], None, None
    for index, rung, run in rungs:
        row: dict[str, Any] = {"rung_index": index, "rung": rung, "run": run}
        src = by_run.loc[run] if run in by_run.index else pd.Series(dtype=object)
        row.update({c: src.get(c) for c in SUMMARY_COLUMNS})
        ran = row["status"] == OK
        row.update(_gain(results, last_ok if ran else None, run, "x_vs_prev"))
        row["prev_rung"] = by_run.loc[last_ok, "rung"] if ran and last_ok in by_run.index else None
        row.update(_gain(results, first_ok if ran else None, run, "x_vs_first"))
        if ran:
            first_ok = first_ok or run
            last_ok = run
        rows.append(row)
    return pd.DataFrame(rows)


def write_ladders(results: Path, plan: dict[str, Any], summary: pd.DataFrame, outdir: Path
                  ) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for table, rungs in ladder_groups(plan).items():
        path = outdir / f"{table}.csv"
        ladder_table(results, rungs, summary).to_csv(path, index=False)
        written.append(path)
    return written
