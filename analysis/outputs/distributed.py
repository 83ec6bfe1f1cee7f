"""Across distributed runs: does the step scale, and what does communication cost?

    python -m analysis distributed --results R [--summary R/summary.csv] -o R/distributed.csv
                                   [--plots R/plots]

One row per distributed run (``parallel`` ddp | fsdp) of the summary:

* ``scaling_efficiency = tokens_per_s / (gpus x baseline_tokens_per_s)``: throughput of all
  ranks (untraced, summary.csv) over that of the one-process run with the same per-GPU batch
  (``baseline_run``: the run whose parameters equal this one's but for the parallel keys);
* from the captures (``<run>/distributed/metrics.json``, analysis/outputs/ranks.py), means per
  rank and step: ``compute_ms``, ``comm_ms``, ``exposed_comm_ms`` and its share of the step,
  ``overlap``, ``idle_ms``, and ``straggler_rank`` (the rank with the most compute most often)
  with ``compute_spread_ms`` (most minus least compute per step; ``compute_spread_share`` of
  the traced step);
* from the untraced timing processes (every rank's step times, gathered by the workload):
  ``step_spread_ms``, the mean over steps of the slowest minus the fastest rank's step time,
  and ``slowest_rank``, the rank slowest most often;
* ``allreduce_busbw_gbps``: bus bandwidth of the run's largest all-reduce message, against
  the all-reduce sweep on the same ranks (``calibration_allreduce_<N>ranks.json``,
  workloads/commbench.py) at the same size (``calibrated_busbw_gbps``, interpolated in log
  size) and at its best (``calibrated_peak_busbw_gbps``); ``busbw_vs_calibrated`` is the
  first ratio.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.outputs.runs import OK, empty_cell, read_json, read_plan, read_timing

INTEGER_COLUMNS = ("gpus", "straggler_rank", "slowest_rank", "allreduce_bytes")
PARALLEL_KEYS = ("parallel", "gpus", "bucket_cap_mb", "reshard_after_forward")
CAPTURE_COLUMNS = ("compute_ms", "comm_ms", "exposed_comm_ms", "exposed_comm_share",
                   "overlap", "idle_ms", "compute_spread_ms", "straggler_rank",
                   "allreduce_bytes", "allreduce_busbw_gbps")
COLUMNS = ["run", "parallel", "gpus", "status", "baseline_run", "step_ms", "tokens_per_s",
           "baseline_tokens_per_s", "scaling_efficiency", *CAPTURE_COLUMNS,
           "compute_spread_share", "step_spread_ms", "slowest_rank", "calibrated_busbw_gbps",
           "busbw_vs_calibrated", "calibrated_peak_busbw_gbps", "bucket_cap_mb",
           "reshard_after_forward"]


def is_parallel(params: dict[str, Any]) -> bool:
    return params.get("parallel", "none") not in ("none", None)


def baseline_of(run: str, plan: dict[str, Any]) -> str | None:
    """The one-process run with this run's parameters but for the parallel keys."""
    runs = plan["runs"]
    mine = {k: v for k, v in runs[run]["params"].items() if k not in PARALLEL_KEYS}
    for name, info in runs.items():
        params = info["params"]
        if name == run or is_parallel(params) or params.get("gpus", 1) != 1:
            continue
        if {k: v for k, v in params.items() if k not in PARALLEL_KEYS} == mine:
            return name
    return None


def untraced_stragglers(run_dir: Path) -> dict[str, Any]:
    """Mean per-step spread of the ranks' step times over the timing processes, and the rank
    slowest most often."""
    spreads, slowest = [], []
    for record in read_timing(run_dir).ok_records:
        per_rank = record.get("rank_step_ms") or []
        for step in zip(*per_rank, strict=False):
            spreads.append(max(step) - min(step))
            slowest.append(int(np.argmax(step)))
    if not spreads:
        return {"step_spread_ms": None, "slowest_rank": None}
    return {"step_spread_ms": statistics.fmean(spreads),
            "slowest_rank": Counter(slowest).most_common(1)[0][0]}


def calibrated_busbw(calibration: dict[str, Any] | None, nbytes: float | None) -> float | None:
    """The sweep's bus bandwidth at ``nbytes``, interpolated linearly in log2(size)."""
    if not calibration or calibration.get("status", OK) != OK or not nbytes:
        return None
    sizes = sorted(calibration.get("sizes") or [], key=lambda s: s["bytes"])
    if not sizes:
        return None
    x = np.log2([s["bytes"] for s in sizes])
    y = np.array([s["busbw_gbps"] for s in sizes], float)
    return float(np.interp(math.log2(nbytes), x, y))


def _cell(row: pd.Series, column: str) -> Any:
    value = row.get(column)
    return None if empty_cell(value) else value


def run_row(results: Path, plan: dict[str, Any], summary: pd.DataFrame, run: str) -> dict:
    params = plan["runs"][run]["params"]
    by_run = summary.set_index("run")
    mine = by_run.loc[run] if run in by_run.index else pd.Series(dtype=object)
    gpus = int(params.get("gpus", 1))
    row: dict[str, Any] = {"run": run, "parallel": params.get("parallel"), "gpus": gpus,
                           "status": _cell(mine, "status"), "step_ms": _cell(mine, "step_ms"),
                           "tokens_per_s": _cell(mine, "tokens_per_s")}
    for key in ("bucket_cap_mb", "reshard_after_forward"):
        row[key] = params.get(key)
    base = baseline_of(run, plan)
    row["baseline_run"] = base
    if base is not None and base in by_run.index:
        row["baseline_tokens_per_s"] = _cell(by_run.loc[base], "tokens_per_s")
    if row.get("tokens_per_s") and row.get("baseline_tokens_per_s"):
        row["scaling_efficiency"] = row["tokens_per_s"] / (gpus * row["baseline_tokens_per_s"])
    metrics = read_json(results / run / "distributed" / "metrics.json") or {}
    if metrics.get("status") == OK:
        row.update({k: metrics.get(k) for k in CAPTURE_COLUMNS})
    if row.get("compute_spread_ms") is not None and metrics.get("step_ms"):
        row["compute_spread_share"] = row["compute_spread_ms"] / metrics["step_ms"]
    row.update(untraced_stragglers(results / run))
    calibration = read_json(results / f"calibration_allreduce_{gpus}ranks.json")
    row["calibrated_busbw_gbps"] = calibrated_busbw(calibration, row.get("allreduce_bytes"))
    if calibration and calibration.get("status", OK) == OK:
        row["calibrated_peak_busbw_gbps"] = calibration.get("peak_busbw_gbps")
    if row.get("allreduce_busbw_gbps") and row.get("calibrated_busbw_gbps"):
        row["busbw_vs_calibrated"] = row["allreduce_busbw_gbps"] / row["calibrated_busbw_gbps"]
    return row


def distributed_table(results: Path, summary: pd.DataFrame,
                      plan: dict[str, Any] | None = None) -> pd.DataFrame:
    plan = plan or read_plan(results)
    runs = [r for r, info in plan["runs"].items() if is_parallel(info["params"])]
    rows = [run_row(results, plan, summary, run) for run in runs]
    table = pd.DataFrame(rows, columns=COLUMNS)
    for column in INTEGER_COLUMNS:  # integers with gaps, not floats
        table[column] = pd.array(table[column].to_numpy(dtype=object), dtype="Int64")
    return table


def write_distributed(results: Path, summary: pd.DataFrame, output: Path,
                      plots: Path | None = None) -> pd.DataFrame:
    table = distributed_table(results, summary)
    output.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(output, index=False)
    if plots is not None:
        from analysis.outputs.figures import plot_comm_bandwidth, plot_rank_timeline

        plot_rank_timeline(summary, results, plots / "rank_timeline.png")
        plot_comm_bandwidth(summary, results, plots / "comm_bandwidth.png")
    return table


__all__ = ["baseline_of", "calibrated_busbw", "distributed_table", "write_distributed"]
