"""One summary table across runs: the untraced step time with its CI, the traced time and
profiler overhead, status, parameters, GPU metrics, phase GPU time and provenance.

    python -m analysis aggregate --results R --plan R/plan.json [--calibration C] -o summary.csv

Where each number comes from (docs/timing.md):

* ``step_ms`` and its CI, ``tokens_per_s``, ``samples_per_s``, ``mfu``, ``tflops``: the
  untraced timing processes (``<run>/timing/r*.json``), never the nsys capture;
* ``step_ms_traced``: the median step of the traced run (``<run>/times.json``), and
  ``profiler_overhead = step_ms_traced / step_ms - 1``;
* GPU metrics and ``phase_gpu_ms_*``: the capture (``<run>/stats/metrics.json``);
* ``ops``, ``ops_*`` (runs with the op capture): ``<run>/stats/ops_metrics.json``, among them
  ``ops_overhead``, what the op ranges cost (op capture's traced step / lean capture's - 1);
* ``optimizer_gbps``, ``optimizer_roofline``: the optimizer step's bytes over its phase GPU
  time, against ``memory_gbps_reference`` (``analysis/metrics/roofline.py``);
* ``batch_from``, ``max_batch_*`` (runs with ``batch: max``): the search's result
  (``<run>/maxbatch.json``, analysis/outputs/maxbatch.py); ``batch`` is the batch it found;
* the run's parameters, one column each (``kwargs`` flattened as ``kwargs_<key>``); one named
  like a measured column is ``param_<name>`` (the sleep workload's ``param_step_ms``);
* ``selected``: false for a run that this invocation's ``select`` left out, summarized from
  the records an earlier invocation left (every finished run of the config has its row);
* ``flags``: why a number could mislead: ``unstable`` (CI half-width over the threshold),
  ``throttled`` / ``shared_gpu`` (NVML during a timing process), ``host_bound`` /
  ``cpu_speed_varied`` (the step's time is the host's; the host's speed moved during the run:
  ``host_bound_share``, ``cpu_probe_spread``, analysis/metrics/host.py), ``high_overhead`` (the
  tracer slowed the step by more than 25%: the capture's timeline is distorted),
  ``capture_recompiled`` (torch.compile made more graphs in the capture than in any timing
  process, ``dynamo_graphs_traced`` / ``_timed``: the capture ran other code than was timed),
  ``module_attribution_suspect`` (the module table failed its self-check, the column of that
  name says how: analysis/metrics/modulecheck.py), ``failed``.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.metrics.host import cpu_probe_spread, host_bound_share, host_flags
from analysis.metrics.roofline import memory_reference, optimizer_bytes, optimizer_roofline
from analysis.metrics.timing import DEFAULT_UNSTABLE_THRESHOLD, summarize
from analysis.outputs.maxbatch import max_batch_columns
from analysis.outputs.runs import (
    OK,
    Timing,
    empty_cell,
    read_json,
    read_plan,
    read_timing,
    step_times,
    timing_paths,
)

HIGH_OVERHEAD = 0.25
FIRST = [
    "run", "workload", "status", "message", "flags", "step_ms", "step_ci_low_ms",
    "step_ci_high_ms", "step_ci_half_width_rel", "unstable", "step_iqr_ms", "step_min_ms",
    "step_max_ms", "timing_processes", "timing_steps", "host_bound_share", "cpu_probe_spread",
    "timer", "step_ms_traced",
    "profiler_overhead", "tokens_per_s", "samples_per_s", "tflops", "mfu", "mfu_measured_peak",
    "peak_memory_gib", "peak_reserved_gib", "peak_memory_bytes", "compile_s",
]  # fmt: skip
# The measured columns: no parameter of the same name may overwrite one (param_columns).
MEASURED = frozenset(FIRST) - {"run", "workload"}
GIB = 1024**3
# Integer columns that may have empty cells: written as 353, not 353.0.
WHOLE_NUMBERS = ("batch", "max_batch_oom_batch")
MEASURED_PEAK_DTYPE = {"bf16": "bf16", "fp16": "fp16", "tf32": "tf32", "fp32": "fp32"}


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


def timing_columns(timing: Timing, threshold: float) -> dict[str, Any]:
    """Estimate, CI and spread of the untraced step time."""
    if timing.status != OK:
        return {"timing_processes": len(timing.started)}
    s = summarize(timing.per_process_ms, unstable_threshold=threshold)
    return {
        "step_ms": s.median_ms, "step_ci_low_ms": s.ci_low_ms, "step_ci_high_ms": s.ci_high_ms,
        "step_ci_half_width_rel": s.ci_half_width_rel, "unstable": s.unstable,
        "step_iqr_ms": s.iqr_ms, "step_min_ms": s.min_ms, "step_max_ms": s.max_ms,
        "timing_processes": s.processes, "timing_steps": s.steps,
        "host_bound_share": host_bound_share(timing.ok_records),
        "cpu_probe_spread": cpu_probe_spread(timing.ok_records),
    }  # fmt: skip


def throughput_columns(
    record: dict[str, Any], step_ms: float | None, calibration: dict[str, Any] | None
) -> dict[str, Any]:
    """Tokens/s, samples/s, achieved TFLOP/s and MFU from the untraced step time."""
    if not step_ms:
        return {}
    seconds = step_ms / 1e3
    params = record.get("params", {})
    tokens = record.get("tokens_per_step")
    if tokens is None and record.get("tokens_per_s") and record.get("median_ms"):
        tokens = record["tokens_per_s"] * record["median_ms"] / 1e3
    flops = record.get("flops_per_step") or record.get("model_flops_per_step")
    out: dict[str, Any] = {
        "tokens_per_s": tokens / seconds if tokens else None,
        "samples_per_s": params.get("batch", 0) / seconds if params.get("batch") else None,
        "tflops": flops / seconds / 1e12 if flops else None,
    }
    peak = record.get("peak_tflops")
    out["mfu"] = flops / seconds / (peak * 1e12) if flops and peak else None
    measured = _measured_peak(calibration, params.get("dtype"))
    out["mfu_measured_peak"] = flops / seconds / (measured * 1e12) if flops and measured else None
    out["measured_peak_tflops"] = measured
    return out


def _measured_peak(calibration: dict[str, Any] | None, dtype: str | None) -> float | None:
    if not calibration or calibration.get("status", OK) != OK or dtype is None:
        return None
    return (calibration.get("matmul_tflops") or {}).get(MEASURED_PEAK_DTYPE.get(dtype, dtype))


def gpu_flags(timing: Timing) -> list[str]:
    """NVML flags raised in any timing process (throttled, shared_gpu)."""
    flags: set[str] = set()
    for record in timing.records:
        flags.update((record.get("gpu_state") or {}).get("flags") or [])
    return sorted(flags)


def traced_columns(times: dict[str, Any] | None, step_ms: float | None,
                   timed: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    if not times or times.get("status", OK) != OK or not step_times(times):
        return {}
    traced = statistics.median(step_times(times))
    return {
        "step_ms_traced": traced,
        "profiler_overhead": traced / step_ms - 1 if step_ms else None,
        **graph_columns(times, timed),
    }


def graph_columns(times: dict[str, Any], timed: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The graphs torch.compile made in the capture and in the timing processes (their most):
    more in the capture is a capture that recompiled, whose kernels are not the timed ones."""
    captured = times.get("dynamo_graphs")
    counts = [r["dynamo_graphs"] for r in timed if r.get("dynamo_graphs") is not None]
    if captured is None or not counts:
        return {}
    return {"dynamo_graphs_traced": captured, "dynamo_graphs_timed": max(counts)}


def run_row(
    results: Path, run: str, info: dict[str, Any], threshold: float,
    calibration: dict[str, Any] | None,
) -> dict[str, Any]:
    """The summary row of one run."""
    timing = read_timing(results / run)
    times = read_json(results / run / "times.json") if info.get("profile", True) else None
    metrics = read_json(results / run / "stats" / "metrics.json") or {}
    first = (timing.ok_records or timing.records or [times or {}])[0]
    row: dict[str, Any] = {"run": run, "workload": info["params"].get("workload")}
    row.update(timing_columns(timing, threshold))
    step_ms = row.get("step_ms")
    row.update(traced_columns(times, step_ms, timing.ok_records))
    row.update(throughput_columns(first, step_ms, calibration))
    row.update(status=_status(timing, times), message=_message(timing, times))
    row["timer"] = first.get("timer")
    for key in ("peak_memory_bytes", "compile_s", "device_name", "torch", "cuda", "params_count"):
        row[key] = first.get(key)
    row.update(peak_memory_columns(timing.ok_records))
    row.update({k: info[k] for k in ("ladder", "ladder_group", "rung_index", "rung") if k in info})
    row["profiled"] = bool(info.get("profile", True))
    row["ops"] = info.get("ops", False)
    row.update(param_columns(info["params"]))
    row.update(max_batch_columns(results / run, info, first))  # batch: max runs
    row.update(flatten("", {k.replace(".", "_"): v for k, v in metrics.items()
                            if k not in ("status", "message")}))
    if info.get("ops"):
        row.update(read_json(results / run / "stats" / "ops_metrics.json") or {})
    row.update(memory_view_columns(results / run / "stats" / "memory_metrics.json"))
    row.update(roofline_columns(first, info["params"], metrics, calibration))
    row.update(flatten("gpu_state", {"flags": ";".join(gpu_flags(timing))}))
    row.update(flatten("provenance", first.get("provenance", {})))
    row.update(record_commits([*timing.records, *([times] if times else [])]))
    # the driver, as NVML reported it during the timing run (None without NVML)
    row["provenance_driver"] = (first.get("gpu_state") or {}).get("driver_version")
    row["flags"] = ";".join(_flags(row, timing))  # last: the capture's metrics can raise one
    return row


def param_columns(params: dict[str, Any]) -> dict[str, Any]:
    """The run's parameters as columns; one named like a measured column (the sleep
    workload's ``step_ms``, the step it asks for) becomes ``param_<name>``, so the measurement
    keeps its column whether or not the run finished."""
    return {(f"param_{key}" if key in MEASURED else key): value
            for key, value in flatten("", params).items()}


def peak_memory_columns(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The largest peak of the timing processes (what the step held: CUDA graphs' pools
    included), in bytes and GiB, reserved beside allocated; none on a CPU run."""
    out: dict[str, Any] = {}
    for key in ("peak_memory_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
                "cuda_graph_pool_bytes"):
        values = [r[key] for r in records if r.get(key) is not None]
        out[key] = max(values) if values else None
    for key, column in (("peak_memory_bytes", "peak_memory_gib"),
                        ("peak_reserved_bytes", "peak_reserved_gib")):
        out[column] = out[key] / GIB if out[key] is not None else None
    return out


def memory_view_columns(path: Path) -> dict[str, Any]:
    """A run's memory capture (stats/memory_metrics.json), as memory_* columns: its peak and
    the bytes and share of each category at the peak."""
    metrics = read_json(path) if path.is_file() else None
    if not metrics:
        return {}
    keep = {k: metrics.get(k) for k in ("status", "peak_allocated_bytes", "peak_reserved_bytes",
                                         "cuda_graph_pool_bytes", "saved_bytes", "capture_s")}
    keep["at_peak"] = metrics.get("at_peak") or {}
    keep["at_peak_share"] = metrics.get("at_peak_share") or {}
    return flatten("memory", keep)


def record_commits(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The commit(s) the run's processes ran at, from their own records: a results folder
    resumed on other machines may hold runs made at different commits (space-separated)."""
    stamps = [r.get("provenance") or {} for r in records]
    commits = sorted({p["git_commit"] for p in stamps if p.get("git_commit")})
    if not commits:
        return {}
    return {"provenance_git_commit": " ".join(commits),
            "provenance_git_dirty": any(bool(p.get("git_dirty")) for p in stamps)}


def roofline_columns(record: dict[str, Any], params: dict[str, Any], metrics: dict[str, Any],
                     calibration: dict[str, Any] | None) -> dict[str, Any]:
    """The optimizer step's achieved bandwidth and its share of the reference (train runs)."""
    nbytes = optimizer_bytes(record, params)
    if nbytes is None:
        return {}
    reference, source = memory_reference(calibration, record)
    return {**optimizer_roofline(nbytes, metrics.get("phase_gpu_ms_optimizer_step"), reference),
            "memory_gbps_reference": reference, "memory_gbps_source": source}


def _status(timing: Timing, times: dict[str, Any] | None) -> str:
    if timing.status != OK:
        return timing.status
    if times is not None and times.get("status", OK) != OK:
        return f"capture_{times['status']}"
    return OK


def _message(timing: Timing, times: dict[str, Any] | None) -> str | None:
    if timing.status != OK:
        return timing.message
    if times is not None and times.get("status", OK) != OK:
        return times.get("message")
    return None


def _flags(row: dict[str, Any], timing: Timing) -> list[str]:
    flags = []
    if row.get("status") != OK:
        flags.append("failed")
    if row.get("unstable"):
        flags.append("unstable")
    flags += gpu_flags(timing)
    flags += host_flags(row.get("host_bound_share"), row.get("cpu_probe_spread"))
    if (row.get("profiler_overhead") or 0) > HIGH_OVERHEAD:
        flags.append("high_overhead")
    traced, timed = row.get("dynamo_graphs_traced"), row.get("dynamo_graphs_timed")
    if traced is not None and timed is not None and traced > timed:
        flags.append("capture_recompiled")
    if not empty_cell(row.get("module_attribution_suspect")):
        flags.append("module_attribution_suspect")
    return flags


def finished_unselected(results: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """The plan's `unselected` runs (those `select` left out) with timing records in
    ``results``: name -> their plan entry."""
    return {run: info for run, info in (plan.get("unselected") or {}).items()
            if timing_paths(results / run)}


def summary_table(
    results: Path, plan: dict[str, Any], calibration: dict[str, Any] | None = None
) -> pd.DataFrame:
    """All runs' rows, with status, timing and throughput columns first: the plan's runs, then
    the finished runs `select` left out (column `selected` false)."""
    threshold = plan.get("timing", {}).get("unstable_threshold", DEFAULT_UNSTABLE_THRESHOLD)
    rows = [{**run_row(results, run, info, threshold, calibration), "selected": True}
            for run, info in plan["runs"].items()]
    # `select` profiles some runs; the summary keeps every finished run of the config: the
    # runs it left out whose timing records exist (an earlier invocation's), as they are
    rows += [{**run_row(results, run, info, threshold, calibration), "selected": False}
             for run, info in finished_unselected(results, plan).items()]
    table = pd.DataFrame(rows)
    git = plan.get("git") or {}  # the plan's, for runs that left no record
    for key in ("commit", "dirty"):
        column = f"provenance_git_{key}"
        if column not in table:
            table[column] = None
        table[column] = table[column].astype(object).where(table[column].notna(), git.get(key))
    for column in WHOLE_NUMBERS:  # a batch: max run that found no batch leaves a gap
        if column in table and pd.api.types.is_float_dtype(table[column]):
            table[column] = table[column].astype("Int64")
    first = [c for c in FIRST if c in table.columns]
    provenance = sorted(c for c in table.columns if c.startswith("provenance_"))
    middle = [c for c in table.columns if c not in first and c not in provenance]
    return table[first + middle + provenance]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", type=Path, required=True, help="results folder")
    parser.add_argument("--plan", type=Path, default=None, help="default: RESULTS/plan.json")
    parser.add_argument("--calibration", type=Path, default=None)
    parser.add_argument("-o", "--output", type=Path, required=True)


def run(args: argparse.Namespace) -> int:
    plan = read_json(args.plan) if args.plan else read_plan(args.results)
    calibration = read_json(args.calibration) if args.calibration else None
    table = summary_table(args.results, plan, calibration)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.output, index=False)
    kept = int((~table["selected"].astype(bool)).sum()) if "selected" in table else 0
    note = f" ({kept} finished run(s) not selected this time, kept)" if kept else ""
    print(f"wrote {args.output}: {len(table)} runs x {len(table.columns)} columns{note}")
    return 0
