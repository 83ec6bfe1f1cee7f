"""One summary table across runs: parameters, step times, GPU metrics and provenance.

Reads each run's ``times.json`` (written by ``python -m workloads``) and
``stats/metrics.json`` (written by ``python -m analysis all``) under a results folder.

    python -m analysis aggregate --results results --runs RUN [RUN ...] -o results/summary.csv
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

# Step-time columns first, in this order; the rest follow grouped by prefix.
TIMING_KEYS = ["mean_ms", "median_ms", "std_ms", "min_ms", "max_ms", "tokens_per_s"]
SKIPPED_KEYS = {"step_times_ms", "losses", "params", "provenance", "metrics"}


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    """Nested dicts become prefix_key columns; lists are left out (they live in the JSON)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(flatten(f"{prefix}_{key}" if prefix else str(key), inner))
        return out
    if isinstance(value, list):
        return {}
    return {prefix: value}


def run_row(results: Path, run: str) -> dict[str, Any]:
    """The summary row of one run."""
    times = json.loads((results / run / "times.json").read_text())
    metrics = json.loads((results / run / "stats" / "metrics.json").read_text())
    row: dict[str, Any] = {"run": run, "workload": times.get("workload")}
    params = {k: v for k, v in times.get("params", {}).items() if k != "out"}
    row.update(flatten("", params))
    row.update({k: v for k, v in times.items()
                if k not in SKIPPED_KEYS and not isinstance(v, (dict, list))})
    row["steps_measured"] = len(times.get("step_times_ms", []))
    if times.get("losses"):
        row["loss_first"], row["loss_last"] = times["losses"][0], times["losses"][-1]
    row.update(flatten("", {k.replace(".", "_"): v for k, v in metrics.items()}))
    row.update(flatten("provenance", times.get("provenance", {})))
    return row


def summary_table(results: Path, runs: list[str]) -> pd.DataFrame:
    """All runs' rows, with parameter and timing columns first."""
    table = pd.DataFrame([run_row(results, run) for run in runs])
    first = ["run", "workload"] + [c for c in TIMING_KEYS if c in table.columns]
    provenance = sorted(c for c in table.columns if c.startswith("provenance_"))
    middle = [c for c in table.columns if c not in first and c not in provenance]
    return table[first + middle + provenance]


def write_summary(results: Path, runs: list[str], output: Path) -> pd.DataFrame:
    """Write :func:`summary_table` as CSV to ``output``; return it."""
    table = summary_table(results, runs)
    output.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(output, index=False)
    return table
