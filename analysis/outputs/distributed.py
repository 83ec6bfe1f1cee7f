"""Across distributed runs: does the step scale, and what does communication cost?

    python -m analysis distributed --results R [--summary R/summary.csv] -o R/distributed.csv
                                   [--plots R/plots]

One row per distributed run (``parallel`` ddp | fsdp) of the summary:

* ``scaling_efficiency = tokens_per_s / (gpus x baseline_tokens_per_s)``: throughput of all
  ranks (untraced, summary.csv) over that of the one-process run with the same per-GPU batch
  (``baseline_run``: the run whose parameters equal this one's but for the parallel keys);
* the untraced cost of communication: ``untraced_comm_ms = step_ms - nosync_step_ms``, the
  step minus that of its no-communication twin (``nosync_run``: the same run with ``comm:
  skip``, every collective replaced by its local result), and its share of the step;
* from the captures (``<run>/distributed/metrics.json``, analysis/outputs/ranks.py), means per
  rank and step: ``compute_ms``, ``comm_ms``, ``exposed_comm_ms`` and its share of the step,
  ``overlap``, ``idle_ms``; ``exposed_vs_untraced_comm``, the exposed communication over the
  untraced cost; ``straggler_rank``, the rank latest at the collectives (the others wait for
  it: it spends the least time in them), with ``straggler_ms`` (how much later, median per
  step) and ``straggler_share`` of the capture's step; ``compute_spread_ms`` (most minus least
  compute per step; ``compute_spread_share`` of the capture's step);
* ``capture_step_ms``, the capture's mean step, against the untraced one:
  ``capture_vs_untraced`` (their ratio - 1) and ``capture_distorted`` when they differ by more
  than 10%: the capture then explains a step the untraced run does not take;
* from the untraced timing processes (every rank's step times and arrivals, gathered by the
  workload): ``untraced_straggler_rank`` and ``untraced_straggler_ms``, the rank that reaches
  its first collective latest and by how much (median per step: its arrival minus the median
  of the others'), ``untraced_straggler_share`` of the step; ``step_spread_ms``, the mean over
  steps of the slowest minus the fastest rank's step time, and ``slowest_rank``;
* ``allreduce_busbw_gbps``: bus bandwidth of the run's largest all-reduce message, against
  the all-reduce sweep on the same ranks (``calibration_allreduce_<N>ranks.json``,
  workloads/commbench.py) at the same size (``calibrated_busbw_gbps``, interpolated in log
  size) and at its best (``calibrated_peak_busbw_gbps``); ``busbw_vs_calibrated`` is the
  first ratio.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.outputs.ranks import lateness, straggler_of
from analysis.outputs.runs import OK, empty_cell, read_json, read_plan, read_timing

INTEGER_COLUMNS = ("gpus", "straggler_rank", "untraced_straggler_rank", "slowest_rank",
                   "allreduce_bytes", "straggle_rank")
# The settings of a distributed run: a one-process baseline differs from it in these only.
PARALLEL_KEYS = ("parallel", "gpus", "bucket_cap_mb", "reshard_after_forward", "comm",
                 "straggle_ms", "straggle_rank")
# The knobs at their defaults (workloads/models/gpt.py): a run that leaves one out has it.
KNOB_DEFAULTS = {"comm": "on", "straggle_ms": 0, "straggle_rank": 0}
NO_COMM = "skip"  # comm: skip, the no-communication twin
# A capture whose step is further than this from the untraced step explains another step.
CAPTURE_TOLERANCE = 0.10
CAPTURE_COLUMNS = ("compute_ms", "comm_ms", "exposed_comm_ms", "exposed_comm_share",
                   "overlap", "idle_ms", "compute_spread_ms", "straggler_rank", "straggler_ms",
                   "allreduce_bytes", "allreduce_busbw_gbps")
COLUMNS = ["run", "parallel", "gpus", "comm", "status", "baseline_run", "step_ms",
           "tokens_per_s", "baseline_tokens_per_s", "scaling_efficiency",
           "nosync_run", "nosync_step_ms", "untraced_comm_ms", "untraced_comm_share",
           "capture_step_ms", "capture_vs_untraced", "capture_distorted",
           "compute_ms", "comm_ms", "exposed_comm_ms", "exposed_vs_untraced_comm",
           "exposed_comm_share", "overlap", "idle_ms",
           "straggler_rank", "straggler_ms", "straggler_share", "compute_spread_ms",
           "compute_spread_share", "untraced_straggler_rank", "untraced_straggler_ms",
           "untraced_straggler_share", "step_spread_ms", "slowest_rank",
           "allreduce_bytes", "allreduce_busbw_gbps", "calibrated_busbw_gbps",
           "busbw_vs_calibrated", "calibrated_peak_busbw_gbps", "bucket_cap_mb",
           "reshard_after_forward", "straggle_ms", "straggle_rank"]


def is_parallel(params: dict[str, Any]) -> bool:
    return params.get("parallel", "none") not in ("none", None)


def knob(params: dict[str, Any], key: str) -> Any:
    """A distributed knob's value, its default where the run leaves it out."""
    return params.get(key, KNOB_DEFAULTS[key])


def nosync_twin(run: str, plan: dict[str, Any]) -> str | None:
    """The run equal to this one but for ``comm: skip`` (None for a twin itself)."""
    runs = plan["runs"]
    mine = runs[run]["params"]
    if knob(mine, "comm") == NO_COMM:
        return None
    same = {k: v for k, v in mine.items() if k != "comm"}
    for name, info in runs.items():
        params = info["params"]
        if knob(params, "comm") == NO_COMM and \
                {k: v for k, v in params.items() if k != "comm"} == same:
            return name
    return None


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
    """From the timing processes: the rank latest at its first collective and by how much
    (:func:`~analysis.outputs.ranks.lateness` over the steps of every process), the mean
    per-step spread of the ranks' step times and the rank slowest most often."""
    spreads, slowest = [], []
    arrivals: dict[int, list[float]] = defaultdict(list)  # rank -> every process's steps
    for record in read_timing(run_dir).ok_records:
        per_rank = record.get("rank_step_ms") or []
        for step in zip(*per_rank, strict=False):
            spreads.append(max(step) - min(step))
            slowest.append(int(np.argmax(step)))
        for rank, values in enumerate(record.get("rank_arrival_ms") or []):
            arrivals[rank].extend(values)
    rank, late = straggler_of(lateness([arrivals[r] for r in sorted(arrivals)]))
    row: dict[str, Any] = {"untraced_straggler_rank": rank, "untraced_straggler_ms": late,
                           "step_spread_ms": None, "slowest_rank": None}
    if spreads:
        row.update(step_spread_ms=statistics.fmean(spreads),
                   slowest_rank=Counter(slowest).most_common(1)[0][0])
    return row


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
    for key in KNOB_DEFAULTS:
        row[key] = knob(params, key)
    base = baseline_of(run, plan)
    row["baseline_run"] = base
    if base is not None and base in by_run.index:
        row["baseline_tokens_per_s"] = _cell(by_run.loc[base], "tokens_per_s")
    if row.get("tokens_per_s") and row.get("baseline_tokens_per_s"):
        row["scaling_efficiency"] = row["tokens_per_s"] / (gpus * row["baseline_tokens_per_s"])
    row.update(untraced_comm(run, plan, by_run, row.get("step_ms")))
    metrics = read_json(results / run / "distributed" / "metrics.json") or {}
    if metrics.get("status") == OK:
        row.update({k: metrics.get(k) for k in CAPTURE_COLUMNS})
        row.update(capture_fidelity(metrics.get("step_ms"), row.get("step_ms")))
        row.update(_shares(row, metrics.get("step_ms"), "compute_spread", "straggler"))
    if row.get("exposed_comm_ms") is not None and row.get("untraced_comm_ms"):
        row["exposed_vs_untraced_comm"] = row["exposed_comm_ms"] / row["untraced_comm_ms"]
    row.update(untraced_stragglers(results / run))
    row.update(_shares(row, row.get("step_ms"), "untraced_straggler"))
    calibration = read_json(results / f"calibration_allreduce_{gpus}ranks.json")
    row["calibrated_busbw_gbps"] = calibrated_busbw(calibration, row.get("allreduce_bytes"))
    if calibration and calibration.get("status", OK) == OK:
        row["calibrated_peak_busbw_gbps"] = calibration.get("peak_busbw_gbps")
    if row.get("allreduce_busbw_gbps") and row.get("calibrated_busbw_gbps"):
        row["busbw_vs_calibrated"] = row["allreduce_busbw_gbps"] / row["calibrated_busbw_gbps"]
    return row


def untraced_comm(run: str, plan: dict[str, Any], by_run: pd.DataFrame,
                  step_ms: float | None) -> dict[str, Any]:
    """The step minus its no-communication twin's: what communication costs, untraced."""
    twin = nosync_twin(run, plan)
    nosync = _cell(by_run.loc[twin], "step_ms") if twin in by_run.index else None
    out: dict[str, Any] = {"nosync_run": twin, "nosync_step_ms": nosync}
    if step_ms and nosync:
        out["untraced_comm_ms"] = step_ms - nosync
        out["untraced_comm_share"] = (step_ms - nosync) / step_ms
    return out


def capture_fidelity(capture_ms: float | None, step_ms: float | None) -> dict[str, Any]:
    """The capture's mean step against the untraced step (ratio - 1), and whether it is
    further than :data:`CAPTURE_TOLERANCE` off."""
    if not capture_ms or not step_ms:
        return {"capture_step_ms": capture_ms}
    off = capture_ms / step_ms - 1
    return {"capture_step_ms": capture_ms, "capture_vs_untraced": off,
            "capture_distorted": abs(off) > CAPTURE_TOLERANCE}


def _shares(row: dict[str, Any], step_ms: float | None, *names: str) -> dict[str, Any]:
    """``<name>_share = <name>_ms / step_ms`` for each name whose ms the row has."""
    return {f"{n}_share": row[f"{n}_ms"] / step_ms for n in names
            if row.get(f"{n}_ms") is not None and step_ms}


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
        from analysis.outputs.figures import (
            plot_comm_bandwidth,
            plot_rank_timeline,
            plot_scaling,
        )

        plot_rank_timeline(summary, results, plots / "rank_timeline.png")
        plot_comm_bandwidth(summary, results, plots / "comm_bandwidth.png")
        plot_scaling(table, summary, plots / "scaling.png")
    return table


__all__ = ["CAPTURE_TOLERANCE", "baseline_of", "calibrated_busbw", "distributed_table",
           "nosync_twin", "write_distributed"]
