"""Findings: what to change, from the numbers, tied to the fix's measured gain.

Each rule is one function below with its threshold. A finding names the run, the number it
rests on and where that number is (CSV file relative to the results folder, the row's key
column and value, the value's column), so it can be checked by reading that one cell.

A rule's fixes are :class:`Fix` objects: what to say and the run keys (with their values)
that apply it. One check, for every rule (:func:`recommend`): a fix the run already has (its
own keys, as its workload records them) is never recommended, and a finding whose fixes the
run all has is dropped. When the results also hold the variant with a fix, the finding quotes
that measured speed-up with its 95% CI and every key the variant changed; a variant that
changes more than one fix gives a JOINT gain (analysis/outputs/finding_base.py).

On a run without GPU time (a CPU run) the rules that read GPU time per kernel category read
the CPU time of the matching NVTX range instead (the phase table's ``CPU ms/step``).

    python -m analysis findings --results R [--summary R/summary.csv] -o R/findings.csv
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.metrics.categories import OPTIMIZER_PHASE
from analysis.metrics.host import HOST_BOUND_SHARE
from analysis.metrics.ops import OUTSIDE
from analysis.metrics.roofline import ROOFLINE_SHARE
from analysis.outputs.comm_findings import COMM_RULES
from analysis.outputs.finding_base import (
    MEASUREMENT,
    MEASUREMENT_KEYS,
    ON,
    PHASE_TABLE,
    SUMMARY,
    Context,
    Finding,
    Fix,
    Rule,
    finding_sentence,
    findings_table,
    rank,
    recommend,
    run_rules,
)
from analysis.outputs.fp8_findings import FP8_RULES
from analysis.outputs.memory_findings import MEMORY_RULES
from analysis.outputs.runs import OK, empty_cell

# Thresholds (documented in docs/findings.md; each rule says why its value).
LAUNCH_BOUND_UTILIZATION = 0.5
FP32_GEMM_SHARE = 20.0  # % of GPU time in GEMMs
FP32_TENSOR_CORE_SHARE = 0.10
CAST_SHARE = 10.0  # % of GPU time in copies/casts under autocast
OPTIMIZER_SHARE = 15.0  # % of GPU time in the optimizer (of CPU time on a CPU run)
SOFTMAX_SHARE = 5.0  # % of GPU time in softmax with naive attention
SYNC_CALLS_PER_STEP = 1.0  # the harness synchronizes once per step
LOW_OCCUPANCY = 0.25
LOW_OCCUPANCY_KERNEL_SHARE = 0.05
HIGH_OVERHEAD = 0.25
SYNC_APIS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaMemcpy", "cudaEventSynchronize")
# One op with a fifth of the step's GPU time: removing it alone could give up to 1.25x on GPU
# time, the size of the ladder's smaller rungs (bf16 1.08x, fused AdamW 1.16x on GPT small).
DOMINANT_OP_SHARE = 0.20
HIGH_OP_OVERHEAD = 0.25  # the op ranges' cost on the traced step, as for the lean capture
# The run key of a whole-step CUDA graph (forward, backward and optimizer in one graph).
STEP_GRAPH = "cuda_graph"

__all__ = ["Context", "Finding", "Fix", "MEASUREMENT_KEYS", "ON", "RULES", "find_all",
           "finding_sentence", "findings_table", "rank", "recommend"]


def _summary_finding(ctx: Context, run: str, rule: str, column: str, threshold: float,
                     title: str, fix: str, severity: str = "medium") -> Finding:
    return Finding(rule=rule, run=run, title=title, value=float(ctx.cell(run, column)),
                   threshold=threshold, source=SUMMARY, key_column="run", key=run,
                   value_column=column, fix=fix, severity=severity)


def _category_finding(ctx: Context, run: str, rule: str, category: str, threshold: float,
                      title: str, fix: str) -> Finding:
    return Finding(rule=rule, run=run, title=title,
                   value=float(ctx.category_share(run, category) or 0), threshold=threshold,
                   source=f"{run}/stats/kernel_categories.csv", key_column="Category",
                   key=category, value_column="Time (%)", fix=fix)


def _cpu_range_finding(ctx: Context, run: str, rule: str, name: str, share_pct: float,
                       what: str) -> Finding | None:
    """A finding on the CPU time of NVTX range ``name`` when it is at least ``share_pct``% of
    the step's: the cell is the range's ``CPU ms/step``, the threshold that share of the
    step's CPU ms."""
    found = ctx.cpu_range(run, name)
    if found is None:
        return None
    ms, step = found
    if ms / step * 100 < share_pct:
        return None
    return Finding(rule=rule, run=run,
                   title=f"{what}: {ms / step:.0%} of the step's CPU time in {name} "
                         f"({ms:.3g} of {step:.3g} ms)",
                   value=ms, threshold=share_pct / 100 * step,
                   source=f"{run}/stats/{PHASE_TABLE}.csv", key_column="Range", key=name,
                   value_column="CPU ms/step", fix="")


# -- fixes: what each rule may recommend -----------------------------------------------------
CUDA_GRAPHS = Fix("capture the step in CUDA graphs (compile: reduce-overhead)",
                  {"compile": ("reduce-overhead",)}, also=({STEP_GRAPH: ("step",)},))
STEP_IN_ONE_GRAPH = Fix("capture the whole step, optimizer included, in one CUDA graph "
                        f"({STEP_GRAPH}: step)", {STEP_GRAPH: ("step",)})
COMPILE = Fix("fuse kernels with torch.compile (compile: default)", {"compile": ON})
LOW_PRECISION = Fix("use TF32 (dtype: tf32) or bf16 autocast (dtype: bf16)",
                    {"dtype": ("tf32", "bf16", "fp16")})
FUSE_CASTS = Fix("fuse the casts (torch.compile)", {"compile": ON})
MASTER_WEIGHTS = Fix("keep bf16 weight copies updated by the optimizer (optimizer: adamw_master)",
                     {"optimizer": ("adamw_master",)})
FUSED_OPTIMIZER = Fix("use the fused AdamW (optimizer: adamw_fused)",
                      {"optimizer": ("adamw_fused", "adamw_master")})


def sdpa_fix(params: dict[str, Any]) -> Fix:
    """SDPA, under the key this workload names it with (gpt: attention, the others: impl)."""
    key = "attention" if params.get("workload") == "gpt" else "impl"
    return Fix(f"use scaled_dot_product_attention ({key}: sdpa) with the cuDNN or flash backend",
               {key: ("sdpa",)}, companions=("sdpa_backend",))


# -- rules: each yields its findings for one run ---------------------------------------------
def launch_bound(ctx: Context, run: str) -> Iterator[Finding]:
    """GPU busy less than half of the step: the host cannot launch kernels fast enough."""
    util = ctx.cell(run, "gpu_utilization")
    if util is not None and util < LAUNCH_BOUND_UTILIZATION:
        f = _summary_finding(
            ctx, run, "launch_bound", "gpu_utilization", LAUNCH_BOUND_UTILIZATION,
            f"launch-bound: the GPU is busy {util:.0%} of the step", "", "high")
        found = recommend(ctx, f, [CUDA_GRAPHS, STEP_IN_ONE_GRAPH, COMPILE])
        if found:
            yield found


def fp32_gemm_without_tensor_cores(ctx: Context, run: str) -> Iterator[Finding]:
    """fp32 GEMMs run on CUDA cores (no TF32): an order of magnitude below the tensor cores."""
    share = ctx.category_share(run, "GEMM")
    tc = ctx.cell(run, "tensor_core_share")
    if ctx.params(run).get("dtype") == "fp32" and share and share >= FP32_GEMM_SHARE and (
        tc is not None and tc < FP32_TENSOR_CORE_SHARE
    ):
        f = _summary_finding(
            ctx, run, "fp32_gemm_no_tensor_cores", "tensor_core_share", FP32_TENSOR_CORE_SHARE,
            f"fp32 GEMMs without tensor cores: {share:.0f}% of GPU time in GEMMs, "
            f"tensor-core share {tc:.0%}", "", "high")
        found = recommend(ctx, f, [LOW_PRECISION])
        if found:
            yield found


def cast_fixes(params: dict[str, Any]) -> list[Fix]:
    """Fewer casts under autocast: compile fuses them; master weights (train) remove them."""
    return [FUSE_CASTS, MASTER_WEIGHTS] if params.get("mode") == "train" else [FUSE_CASTS]


def autocast_weight_casts(ctx: Context, run: str) -> Iterator[Finding]:
    """Autocast re-casts every fp32 weight to bf16 on every step (copy kernels)."""
    share = ctx.category_share(run, "CopyMemset")
    params = ctx.params(run)
    if params.get("dtype") in ("bf16", "fp16") and share and share >= CAST_SHARE:
        f = _category_finding(
            ctx, run, "autocast_casts", "CopyMemset", CAST_SHARE,
            f"autocast casts: {share:.0f}% of GPU time in copy/cast kernels", "")
        found = recommend(ctx, f, cast_fixes(params))
        if found:
            yield found


def unfused_optimizer(ctx: Context, run: str) -> Iterator[Finding]:
    """The multi-tensor AdamW launches several passes over all parameters per step. On a run
    without GPU time: the optimizer_step range's share of the step's CPU time."""
    if ctx.params(run).get("mode") != "train":
        return
    if ctx.has_gpu_time(run):
        share = ctx.category_share(run, "Optimizer")
        f = _category_finding(
            ctx, run, "unfused_optimizer", "Optimizer", OPTIMIZER_SHARE,
            f"unfused optimizer: {share:.0f}% of GPU time in AdamW",
            "") if share and share >= OPTIMIZER_SHARE else None
    else:
        f = _cpu_range_finding(ctx, run, "unfused_optimizer", OPTIMIZER_PHASE,
                               OPTIMIZER_SHARE, "unfused optimizer")
    found = f and recommend(ctx, f, [FUSED_OPTIMIZER])
    if found:
        yield found


def naive_attention(ctx: Context, run: str) -> Iterator[Finding]:
    """Materialized scores + softmax + mask instead of a fused attention kernel."""
    share = ctx.category_share(run, "Softmax")
    params = ctx.params(run)
    naive = params.get("attention") == "naive" or params.get("impl") == "naive"
    if naive and share and share >= SOFTMAX_SHARE:
        f = _category_finding(
            ctx, run, "naive_attention", "Softmax", SOFTMAX_SHARE,
            f"naive attention: {share:.0f}% of GPU time in softmax over materialized scores", "")
        found = recommend(ctx, f, [sdpa_fix(params)])
        if found:
            yield found


def host_syncs_in_step(ctx: Context, run: str) -> Iterator[Finding]:
    """Synchronizing calls beyond the harness's one per step stall the launch queue."""
    api = ctx.stats(run, "cuda_api_sum")
    steps = ctx.cell(run, "steps") or 1
    if api is None:
        return
    for _, row in api.iterrows():
        name = str(row["Name"])
        if name.split("_v")[0] in SYNC_APIS and row["Num Calls"] / steps > SYNC_CALLS_PER_STEP:
            yield Finding(
                rule="host_sync_in_step", run=run,
                title=f"{name} called {row['Num Calls'] / steps:.0f}x per step",
                value=float(row["Num Calls"]), threshold=SYNC_CALLS_PER_STEP * steps,
                source=f"{run}/stats/cuda_api_sum.csv", key_column="Name", key=name,
                value_column="Num Calls", severity="medium",
                fix="remove host synchronizations (.item(), .cpu(), blocking copies) from the step")


def low_occupancy_kernel(ctx: Context, run: str) -> Iterator[Finding]:
    """A non-GEMM kernel with a large share of time and low theoretical occupancy."""
    occ = ctx.stats(run, "kernel_occupancy")
    total = ctx.cell(run, "kernel_time_ns")
    if occ is None or occ.empty or not total:
        return
    top = occ.sort_values("Total Time (ns)", ascending=False).head(10)
    for _, row in top.iterrows():
        share = row["Total Time (ns)"] / total
        # Hopper GEMM/attention kernels run one large block per SM by design: not a finding.
        if str(row["Name"]).startswith(("nvjet", "sm90", "cutlass", "fmha", "flash", "cudnn")):
            continue
        if share >= LOW_OCCUPANCY_KERNEL_SHARE and row["Theoretical Occupancy"] < LOW_OCCUPANCY:
            yield Finding(
                rule="low_occupancy", run=run,
                title=f"{share:.0%} of kernel time in a kernel at "
                      f"{row['Theoretical Occupancy']:.0%} theoretical occupancy "
                      f"(limited by {row['Limiter']})",
                value=float(row["Theoretical Occupancy"]), threshold=LOW_OCCUPANCY,
                source=f"{run}/stats/kernel_occupancy.csv", key_column="Name",
                key=str(row["Name"]), value_column="Theoretical Occupancy", severity="info",
                fix="check the kernel's launch configuration and register use "
                    "(torch.compile may fuse it away)")
            return


def _overhead_finding(ctx: Context, run: str, rule: str, column: str, threshold: float,
                      what: str, fix: str) -> Iterator[Finding]:
    """A finding about the measurement when the summary's overhead `column` is above
    `threshold`."""
    overhead = ctx.cell(run, column)
    if overhead is not None and overhead > threshold:
        f = _summary_finding(ctx, run, rule, column, threshold, f"{what} by {overhead:.0%}",
                             fix, "info")
        f.about = MEASUREMENT
        yield f


def high_profiler_overhead(ctx: Context, run: str) -> Iterator[Finding]:
    """The traced step is much slower than the untraced one: its timeline is distorted."""
    yield from _overhead_finding(
        ctx, run, "high_profiler_overhead", "profiler_overhead", HIGH_OVERHEAD,
        "tracing slowed the step",
        "read gaps in this capture with care; the published step time is untraced")


def unstable_timing(ctx: Context, run: str) -> Iterator[Finding]:
    """The step time's CI is wide: the number could move on a rerun."""
    if bool(ctx.cell(run, "unstable")):
        half = ctx.cell(run, "step_ci_half_width_rel")
        threshold = float(ctx.plan.get("timing", {}).get("unstable_threshold", 0.03))
        f = _summary_finding(
            ctx, run, "unstable_timing", "step_ci_half_width_rel", threshold,
            f"unstable timing: 95% CI is ±{half:.1%} of the median", unstable_fix(ctx, run),
            "info")
        f.about = MEASUREMENT
        yield f


def unstable_fix(ctx: Context, run: str) -> str:
    """What to do about a wide CI; for a host-bound step, why more repeats will not narrow it
    and which launch-removing fixes the run does not have yet."""
    share = ctx.cell(run, "host_bound_share")
    if ctx.on_cpu(run):  # a CPU run has no gpu_state; its noise is the machine's other work
        return "more repeats or steps; other processes on this machine share its cores"
    if share is None or share < HOST_BOUND_SHARE:
        return "more repeats or steps; check gpu_state flags (throttling, other processes)"
    spread = ctx.cell(run, "cpu_probe_spread")
    moved = (f"; the host's own speed moved {spread:.0%} between its CPU probes"
             if spread is not None else "")
    todo = [x.text for x in (COMPILE, CUDA_GRAPHS, STEP_IN_ONE_GRAPH)
            if not x.applied(ctx.params(run))]
    cure = f"{' or '.join(todo)} takes work off the host" if todo else "fewer launches"
    return (f"the step is host-bound (the host waited for the GPU in {1 - share:.0%} of it), "
            f"so its time follows the CPU's speed{moved}; more repeats do not narrow it: "
            f"{cure}, or time it on a quieter host")


def op_fixes(op: str, params: dict[str, Any]) -> list[Fix]:
    """What could shrink one op's GPU time, by what the op is."""
    name = op.removeprefix("aten::")
    if name in ("copy_", "to", "_to_copy", "clone", "contiguous") and params.get("dtype") in (
            "bf16", "fp16"):
        return cast_fixes(params)
    if name in ("mm", "bmm", "addmm", "matmul", "linear", "baddbmm") and params.get(
            "dtype") == "fp32":
        return [LOW_PRECISION]
    if name.startswith("_foreach_") or name.startswith("Optimizer.step"):
        return [FUSED_OPTIMIZER]
    naive = params.get("attention") == "naive" or params.get("impl") == "naive"
    if naive and name in ("_softmax", "_softmax_backward_data", "softmax", "masked_fill_",
                          "masked_fill"):
        return [sdpa_fix(params)]
    if name in ("mul", "add", "add_", "div", "sub", "pow", "neg", "rsqrt", "silu",
                "silu_backward", "mean", "sum", "fill_", "cat", "where"):
        return [COMPILE]
    return []


def dominant_op(ctx: Context, run: str) -> Iterator[Finding]:
    """One PyTorch op takes a large share of the step's GPU time (the run's ops.csv)."""
    table = ctx.stats(run, "ops") if ctx.cell(run, "ops_status") == OK else None
    if table is None or table.empty:
        return
    ranked = table[table["Op"] != OUTSIDE].sort_values("GPU Self (ns)", ascending=False)
    if ranked.empty or empty_cell(ranked.iloc[0]["GPU Share of Step"]):
        return
    top = ranked.iloc[0]
    share = float(top["GPU Share of Step"])
    if share < DOMINANT_OP_SHARE:
        return
    fixes = op_fixes(str(top["Op"]), ctx.params(run))
    f = Finding(
        rule="dominant_op", run=run,
        title=f"one op dominates: {top['Op']} takes {share:.0%} of the step's GPU time "
              f"({top['Calls/Step']:.0f} calls/step, {top['Kernels/Call']:.3g} kernels/call)",
        value=share, threshold=DOMINANT_OP_SHARE, source=f"{run}/stats/ops.csv",
        key_column="Op", key=str(top["Op"]), value_column="GPU Share of Step",
        fix="see where it is called: ops_by_shape.csv (ops: shapes) groups its calls by "
            "input shapes")
    found = recommend(ctx, f, fixes)
    if found:
        yield found


def optimizer_at_roofline(ctx: Context, run: str) -> Iterator[Finding]:
    """The optimizer step already moves its bytes at the speed of memory: more fusion cannot
    help it (analysis/metrics/roofline.py)."""
    share = ctx.cell(run, "optimizer_roofline")
    if share is None or share < ROOFLINE_SHARE:
        return
    gbps = ctx.cell(run, "optimizer_gbps")
    source = ctx.cell(run, "memory_gbps_source") or "reference"
    yield _summary_finding(
        ctx, run, "optimizer_at_roofline", "optimizer_roofline", ROOFLINE_SHARE,
        f"optimizer at the memory roofline: {gbps:.0f} GB/s, {share:.0%} of the {source} "
        "bandwidth",
        "already at the memory roofline: fusing more will not help; fewer bytes (e.g. bf16 "
        "optimizer state) would", "info")


def high_op_overhead(ctx: Context, run: str) -> Iterator[Finding]:
    """The op ranges slowed the op capture's step: its CPU columns are inflated."""
    gpu = "" if ctx.on_cpu(run) else "; its GPU columns are kernel times and hold"
    yield from _overhead_finding(
        ctx, run, "high_op_overhead", "ops_overhead", HIGH_OP_OVERHEAD,
        "the op ranges slowed the traced step",
        f"read ops.csv's CPU columns with care (the ranges cost host time){gpu}")


RULES: list[Rule] = [
    launch_bound, fp32_gemm_without_tensor_cores, autocast_weight_casts, unfused_optimizer,
    naive_attention, dominant_op, optimizer_at_roofline, host_syncs_in_step,
    low_occupancy_kernel, high_profiler_overhead, high_op_overhead, unstable_timing,
]


def find_all(results: Path, summary: pd.DataFrame) -> list[Finding]:
    """Every rule, distributed runs' included, over every finished run, ranked."""
    return run_rules(results, summary, [*RULES, *COMM_RULES, *FP8_RULES, *MEMORY_RULES])
