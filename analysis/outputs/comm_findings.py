"""Findings of distributed runs: exposed communication, stragglers, slow collectives, scaling.

Each rule is a :data:`~analysis.outputs.finding_base.Rule` (``rule(ctx, run)`` yielding its
:class:`Finding`) and rests on one cell of ``distributed.csv``
(analysis/outputs/distributed.py). Where the config also ran the variant with the fix (the
same run with another ``bucket_cap_mb`` for DDP, another ``reshard_after_forward`` for FSDP),
the finding quotes that variant's measured speed-up with its 95% CI and every key it changed.
findings.py's ``find_all`` runs :data:`COMM_RULES` after its own rules (the findings rule has
``distributed.csv`` as an input when the config has distributed runs). A no-communication
twin (``comm: skip``) gets none: it is a yardstick, not a setting to run. Where the capture's
step is more than 10% off the untraced one (``capture_distorted``), the findings read from
the capture say so: what they describe may be the tracer's own doing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd

from analysis.outputs.finding_base import Context, Finding, Fix, Rule, measure_gain
from analysis.outputs.runs import empty_cell, read_json

DISTRIBUTED_CSV = "distributed.csv"
# Thresholds (docs/distributed.md says why).
EXPOSED_COMM_SHARE = 0.10  # of the step: communication nothing hides
STRAGGLER_SHARE = 0.05  # the others' wait for the latest rank, of the step
BUSBW_RATIO = 0.5  # of the calibrated all-reduce bus bandwidth at the same size
SCALING_EFFICIENCY = 0.8
VARIANT_KEYS = ("bucket_cap_mb", "reshard_after_forward")
DDP_BUCKET_MB = 25  # PyTorch's default bucket_cap_mb, as workloads/__main__.py's --bucket_cap_mb


# What to check when one rank reaches the collectives later than the others.
STRAGGLER_FIX = ("check that rank's GPU (clocks, temperature: gpu_state flags; another process "
                 "on it), its host side (a CPU thread starved or sharing a core; data loading) "
                 "and its placement (NUMA node, PCIe / NVLink topology: nvidia-smi topo -m); "
                 "equal work per rank is assumed")


def _past(column: str, limit: float, above: bool
          ) -> Callable[[Callable[..., Iterator[Finding]]], Rule]:
    """A rule over one distributed.csv column: the decorated function gets the run's row and
    value only when the value is past `limit` (above it, or below it with ``above=False``)."""
    def rule(check: Callable[..., Iterator[Finding]]) -> Rule:
        @functools.wraps(check)
        def over_row(ctx: Context, run: str) -> Iterator[Finding]:
            row = _row(ctx, run)
            value = row and row.get(column)
            if value is None or (value <= limit if above else value >= limit):
                return
            if row.get("comm") == "skip":  # the yardstick without communication
                return
            yield from check(ctx, run, row, value)
        return over_row
    return rule


def _row(ctx: Context, run: str) -> dict[str, Any] | None:
    try:
        table = pd.read_csv(ctx.results / DISTRIBUTED_CSV)
    except (OSError, pd.errors.EmptyDataError):
        return None
    rows = table[table["run"] == run]
    if rows.empty:
        return None
    return {k: (None if empty_cell(v) else v) for k, v in rows.iloc[0].to_dict().items()}


def _finding(run: str, rule: str, column: str, value: float, threshold: float, title: str,
             fix: str, severity: str = "medium") -> Finding:
    return Finding(rule=rule, run=run, title=title, value=float(value), threshold=threshold,
                   source=DISTRIBUTED_CSV, key_column="run", key=run, value_column=column,
                   fix=fix, severity=severity)


def _plan_params(ctx: Context) -> dict[str, dict[str, Any]]:
    """run -> its parameters, from the results' plan.json."""
    plan = read_json(ctx.results / "plan.json") or {"runs": {}}
    return {name: info["params"] for name, info in plan["runs"].items()}


def variant(runs: dict[str, dict[str, Any]], run: str, key: str) -> str | None:
    """A run of the plan equal to ``run`` but for ``key`` (the parallel setting to change)."""
    if run not in runs:
        return None
    mine = runs[run]
    for name, params in runs.items():
        if name == run or params.get(key) == mine.get(key):
            continue
        if {k: v for k, v in params.items() if k not in VARIANT_KEYS} == \
                {k: v for k, v in mine.items() if k not in VARIANT_KEYS}:
            return name
    return None


def with_gain(ctx: Context, f: Finding, key: str | None,
              toward: Callable[[Any, Any], bool] | None = None) -> Finding:
    """The measured speed-up of the variant that changes ``key``, when the config ran it
    (and, given ``toward(mine, theirs)``, only when the variant moves the way the fix says)."""
    if key is None:
        return f
    runs = _plan_params(ctx)
    other = variant(runs, f.run, key)
    if other is None:
        return f
    if toward is not None and not toward(runs[f.run].get(key), runs[other].get(key)):
        return f
    # the fix is the variant's setting of the key, as its workload ran it (defaults included)
    return measure_gain(ctx, f, other, [Fix(f.fix, {key: (ctx.params(other).get(key),)})])


def fix_key(row: dict[str, Any]) -> tuple[str | None, str]:
    """The setting whose variant measures the fix (None: no such setting), and the fix."""
    prefetch = ("explicit prefetch (set_modules_to_forward_prefetch / backward_prefetch) "
                "issues the next layer's all-gather earlier")
    if row.get("parallel") == "fsdp":
        if str(row.get("reshard_after_forward")).lower() == "false":
            return None, f"FSDP: {prefetch}"  # the run keeps its gathered parameters already
        return "reshard_after_forward", (
            "FSDP: reshard_after_forward=False keeps the gathered parameters for backward (no "
            f"second all-gather), and {prefetch}")
    return "bucket_cap_mb", (
        "DDP: bucket_cap_mb sets when each all-reduce starts: buckets small enough that the "
        "first ones are reduced while backward still computes (PyTorch's default 25 MB), large "
        "enough not to be latency-bound; gradient_as_bucket_view=True saves the copies")


def capture_caveat(row: dict[str, Any]) -> str:
    """What a finding read from a distorted capture adds to its title ('' otherwise)."""
    if not row.get("capture_distorted"):
        return ""
    off = row["capture_vs_untraced"]
    return (f"; the capture's step is {abs(off):.0%} {'slower' if off > 0 else 'faster'} than "
            "the untraced one, so part of this may be the tracer's own distortion")


def _untraced_comm(row: dict[str, Any]) -> str:
    if row.get("untraced_comm_ms") is None:
        return ""
    return (f"; untraced, the step without communication ({row['nosync_run']}) is "
            f"{row['untraced_comm_ms']:.3g} ms shorter")




@_past("exposed_comm_share", EXPOSED_COMM_SHARE, above=True)
def exposed_communication(ctx: Context, run: str, row: dict[str, Any], share: float
                          ) -> Iterator[Finding]:
    key, fix = fix_key(row)
    f = _finding(run, "exposed_communication", "exposed_comm_share", share,
                 EXPOSED_COMM_SHARE,
                 f"{share:.0%} of the step is communication nothing overlaps "
                 f"({row['exposed_comm_ms']:.3g} ms/step, overlap {row['overlap'] or 0:.0%})"
                 f"{_untraced_comm(row)}{capture_caveat(row)}",
                 fix, "high" if share > 3 * EXPOSED_COMM_SHARE else "medium")
    yield with_gain(ctx, f, key)


def straggler_column(row: dict[str, Any]) -> str:
    """The straggler's share the finding rests on: the untraced arrivals' where the timing
    processes recorded them (the step a user gets), else the capture's."""
    return ("untraced_straggler_share" if row.get("untraced_straggler_share") is not None
            else "straggler_share")


def straggler_rank(ctx: Context, run: str) -> Iterator[Finding]:
    row = _row(ctx, run)
    if not row or row.get("comm") == "skip":
        return
    column = straggler_column(row)
    share = row.get(column)
    if share is None or share <= STRAGGLER_SHARE:
        return
    captured = (f"rank {int(row['straggler_rank'])} reaches the collectives "
                f"{row['straggler_ms']:.3g} ms after the others per step"
                if row.get("straggler_rank") is not None else None)
    if column == "straggler_share":
        title = f"{captured} ({share:.0%} of the step): they wait for it{capture_caveat(row)}"
    else:
        title = (f"rank {int(row['untraced_straggler_rank'])} reaches its first collective "
                 f"{row['untraced_straggler_ms']:.3g} ms after the others per step "
                 f"({share:.0%} of the step, untraced): they wait for it"
                 + (f"; in the capture, {captured}{capture_caveat(row)}" if captured else ""))
    yield _finding(run, "straggler_rank", column, share, STRAGGLER_SHARE, title, STRAGGLER_FIX)


@_past("busbw_vs_calibrated", BUSBW_RATIO, above=False)
def slow_collectives(ctx: Context, run: str, row: dict[str, Any], ratio: float
                          ) -> Iterator[Finding]:
    reached = (f"the largest all-reduce ({row['allreduce_bytes'] / 2**20:.3g} MiB) reaches "
               f"{row['allreduce_busbw_gbps']:.3g} GB/s bus bandwidth, {ratio:.0%} of the "
               "calibrated all-reduce of that size "
               f"({row['calibrated_busbw_gbps']:.3g} GB/s)")
    why = ("the collective shares the GPU with compute kernels (fewer SMs for NCCL) or waits "
           "for a late rank inside its kernel: see exposed communication and the straggler "
           "spread; fewer, larger buckets (bucket_cap_mb) move more bytes per launch")
    finding = _finding(run, "slow_collectives", "busbw_vs_calibrated", ratio, BUSBW_RATIO,
                       reached, why)
    yield with_gain(ctx, finding, fix_key(row)[0], toward=_larger_buckets)


def _larger_buckets(mine: Any, theirs: Any) -> bool:
    return float(theirs or DDP_BUCKET_MB) > float(mine or DDP_BUCKET_MB)


@_past("scaling_efficiency", SCALING_EFFICIENCY, above=False)
def poor_scaling(ctx: Context, run: str, row: dict[str, Any], eff: float
                          ) -> Iterator[Finding]:
    yield _finding(run, "poor_scaling", "scaling_efficiency", eff, SCALING_EFFICIENCY,
                   f"{row['gpus']} ranks give {eff:.0%} of {row['gpus']}x the one-GPU "
                   f"throughput of {row['baseline_run']}",
                   "the exposed communication and idle time per rank (plots/rank_timeline.png) "
                   "say where the rest goes", "info")


COMM_RULES: list[Rule] = [
    exposed_communication, straggler_rank, slow_collectives, poor_scaling,
]

__all__ = ["COMM_RULES", "capture_caveat", "fix_key", "straggler_column"]
