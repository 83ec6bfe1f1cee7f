"""Findings: what to change, from the numbers, tied to the fix's measured gain.

Each rule is one function below with its threshold. A finding names the run, the number it
rests on and where that number is (CSV file relative to the results folder, the row's key
column and value, the value's column), so it can be checked by reading that one cell. When
the same configuration also ran the variant with the suggested fix (a later ladder rung, or
a comparison whose candidate differs in the fixing key), the finding quotes that measured
speed-up with its 95% CI.

    python -m analysis findings --results R [--summary R/summary.csv] -o R/findings.csv
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.outputs.runs import OK, empty_cell, read_json
from analysis.outputs.speedup import speedup_row

SUMMARY = "summary.csv"

# Thresholds (documented in docs/findings.md; each rule says why its value).
LAUNCH_BOUND_UTILIZATION = 0.5
FP32_GEMM_SHARE = 20.0  # % of GPU time in GEMMs
FP32_TENSOR_CORE_SHARE = 0.10
CAST_SHARE = 10.0  # % of GPU time in copies/casts under autocast
OPTIMIZER_SHARE = 15.0  # % of GPU time in the optimizer
SOFTMAX_SHARE = 5.0  # % of GPU time in softmax with naive attention
SYNC_CALLS_PER_STEP = 1.0  # the harness synchronizes once per step
LOW_OCCUPANCY = 0.25
LOW_OCCUPANCY_KERNEL_SHARE = 0.05
HIGH_OVERHEAD = 0.25
SYNC_APIS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaMemcpy", "cudaEventSynchronize")


@dataclass
class Finding:
    rule: str
    run: str
    title: str
    value: float
    threshold: float
    source: str  # CSV path relative to the results folder
    key_column: str
    key: str
    value_column: str
    fix: str
    severity: str = "medium"
    gain_run: str | None = None
    gain: float | None = None
    gain_ci_low: float | None = None
    gain_ci_high: float | None = None
    gain_significant: bool | None = None


def _present(params: dict[str, Any]) -> dict[str, Any]:
    """A summary row as parameters: empty cells (NaN) are unset keys, not values."""
    return {k: v for k, v in params.items() if not empty_cell(v)}


class Context:
    """One results folder: the summary and lazily read per-run CSVs."""

    def __init__(self, results: Path, summary: pd.DataFrame) -> None:
        self.results = results
        self.summary = summary
        self.by_run = summary.set_index("run")

    def stats(self, run: str, name: str) -> pd.DataFrame | None:
        path = self.results / run / "stats" / f"{name}.csv"
        try:
            return pd.read_csv(path)
        except (OSError, pd.errors.EmptyDataError):
            return None

    def cell(self, run: str, column: str) -> Any:
        value = self.by_run.loc[run].get(column) if run in self.by_run.index else None
        return None if empty_cell(value) else value

    def category_share(self, run: str, category: str) -> float | None:
        table = self.stats(run, "kernel_categories")
        if table is None:
            return None
        row = table.loc[table["Category"] == category, "Time (%)"]
        return float(row.iloc[0]) if len(row) else None

    def fix_variant(self, run: str, changes: Callable[[dict[str, Any]], bool]) -> str | None:
        """The run that applies the fix to this one: the nearest later rung of its ladder
        whose parameters satisfy ``changes``, else a comparison candidate that does."""
        info = self.by_run.loc[run]
        if isinstance(info.get("ladder"), str):
            same = self.summary[
                (self.summary["ladder"] == info["ladder"])
                & (self.summary["ladder_group"] == info["ladder_group"])
                & (self.summary["rung_index"] > info["rung_index"])
                & (self.summary["status"] == OK)
            ].sort_values("rung_index")
            for _, row in same.iterrows():
                if changes(_present(row.to_dict())):
                    return str(row["run"])
        plan = read_json(self.results / "plan.json") or {}
        for comp in plan.get("comparisons", []):
            if comp["a"] == run and comp["b"] in self.by_run.index:
                if changes(_present(self.by_run.loc[comp["b"]].to_dict())):
                    return comp["b"]
        return None


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


# -- rules: each yields its findings for one run ---------------------------------------------
def launch_bound(ctx: Context, run: str) -> Iterator[Finding]:
    """GPU busy less than half of the step: the host cannot launch kernels fast enough."""
    util = ctx.cell(run, "gpu_utilization")
    if util is not None and util < LAUNCH_BOUND_UTILIZATION and ctx.cell(run, "compile") in (
        None, "off"
    ):
        f = _summary_finding(
            ctx, run, "launch_bound", "gpu_utilization", LAUNCH_BOUND_UTILIZATION,
            f"launch-bound: the GPU is busy {util:.0%} of the step",
            "capture the step in CUDA graphs (torch.compile mode='reduce-overhead') or fuse "
            "kernels with torch.compile", "high")
        yield _with_gain(ctx, f, lambda p: p.get("compile") not in (None, "off"))


def fp32_gemm_without_tensor_cores(ctx: Context, run: str) -> Iterator[Finding]:
    """fp32 GEMMs run on CUDA cores (no TF32): an order of magnitude below the tensor cores."""
    share = ctx.category_share(run, "GEMM")
    tc = ctx.cell(run, "tensor_core_share")
    if ctx.cell(run, "dtype") == "fp32" and share and share >= FP32_GEMM_SHARE and (
        tc is not None and tc < FP32_TENSOR_CORE_SHARE
    ):
        f = _summary_finding(
            ctx, run, "fp32_gemm_no_tensor_cores", "tensor_core_share", FP32_TENSOR_CORE_SHARE,
            f"fp32 GEMMs without tensor cores: {share:.0f}% of GPU time in GEMMs, "
            f"tensor-core share {tc:.0%}", "use TF32 (dtype: tf32) or bf16 autocast", "high")
        yield _with_gain(ctx, f, lambda p: p.get("dtype") in ("tf32", "bf16", "fp16"))


def autocast_weight_casts(ctx: Context, run: str) -> Iterator[Finding]:
    """Autocast re-casts every fp32 weight to bf16 on every step (copy kernels)."""
    share = ctx.category_share(run, "CopyMemset")
    if ctx.cell(run, "dtype") in ("bf16", "fp16") and share and share >= CAST_SHARE:
        f = _category_finding(
            ctx, run, "autocast_casts", "CopyMemset", CAST_SHARE,
            f"autocast casts: {share:.0f}% of GPU time in copy/cast kernels",
            "fuse the casts (torch.compile) or keep bf16 weight copies updated by the "
            "optimizer (optimizer: adamw_master)")
        yield _with_gain(ctx, f, lambda p: p.get("compile") not in (None, "off")
                         or p.get("optimizer") == "adamw_master")


def unfused_optimizer(ctx: Context, run: str) -> Iterator[Finding]:
    """The multi-tensor AdamW launches several passes over all parameters per step."""
    share = ctx.category_share(run, "Optimizer")
    if share and share >= OPTIMIZER_SHARE and ctx.cell(run, "optimizer") in (None, "adamw_foreach"):
        f = _category_finding(
            ctx, run, "unfused_optimizer", "Optimizer", OPTIMIZER_SHARE,
            f"unfused optimizer: {share:.0f}% of GPU time in AdamW",
            "use the fused AdamW (optimizer: adamw_fused)")
        yield _with_gain(ctx, f, lambda p: p.get("optimizer") in ("adamw_fused", "adamw_master"))


def naive_attention(ctx: Context, run: str) -> Iterator[Finding]:
    """Materialized scores + softmax + mask instead of a fused attention kernel."""
    share = ctx.category_share(run, "Softmax")
    naive = ctx.cell(run, "attention") == "naive" or ctx.cell(run, "impl") == "naive"
    if naive and share and share >= SOFTMAX_SHARE:
        f = _category_finding(
            ctx, run, "naive_attention", "Softmax", SOFTMAX_SHARE,
            f"naive attention: {share:.0f}% of GPU time in softmax over materialized scores",
            "use scaled_dot_product_attention (attention: sdpa) with the cuDNN or flash backend")
        yield _with_gain(ctx, f, lambda p: "sdpa" in (p.get("attention"), p.get("impl")))


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


def high_profiler_overhead(ctx: Context, run: str) -> Iterator[Finding]:
    """The traced step is much slower than the untraced one: its timeline is distorted."""
    overhead = ctx.cell(run, "profiler_overhead")
    if overhead is not None and overhead > HIGH_OVERHEAD:
        yield _summary_finding(
            ctx, run, "high_profiler_overhead", "profiler_overhead", HIGH_OVERHEAD,
            f"tracing slowed the step by {overhead:.0%}",
            "read gaps in this capture with care; the published step time is untraced", "info")


def unstable_timing(ctx: Context, run: str) -> Iterator[Finding]:
    """The step time's CI is wide: the number could move on a rerun."""
    if bool(ctx.cell(run, "unstable")):
        half = ctx.cell(run, "step_ci_half_width_rel")
        threshold = float((read_json(ctx.results / "plan.json") or {}).get("timing", {}).get(
            "unstable_threshold", 0.03))
        yield _summary_finding(
            ctx, run, "unstable_timing", "step_ci_half_width_rel", threshold,
            f"unstable timing: 95% CI is ±{half:.1%} of the median",
            "more repeats or steps; check gpu_state flags (throttling, other processes)", "info")


RULES: list[Callable[[Context, str], Iterator[Finding]]] = [
    launch_bound, fp32_gemm_without_tensor_cores, autocast_weight_casts, unfused_optimizer,
    naive_attention, host_syncs_in_step, low_occupancy_kernel, high_profiler_overhead,
    unstable_timing,
]


def _with_gain(ctx: Context, f: Finding, changes: Callable[[dict[str, Any]], bool]) -> Finding:
    variant = ctx.fix_variant(f.run, changes)
    if variant is None:
        return f
    row = speedup_row(ctx.results / f.run, ctx.results / variant)
    if row["status"] == OK:
        f.gain_run, f.gain = variant, row["speedup"]
        f.gain_ci_low, f.gain_ci_high = row["speedup_ci_low"], row["speedup_ci_high"]
        f.gain_significant = bool(row["significant"])
    return f


def find_all(results: Path, summary: pd.DataFrame) -> list[Finding]:
    ctx = Context(results, summary)
    out: list[Finding] = []
    for run in summary.loc[summary["status"] == OK, "run"]:
        for rule in RULES:
            out.extend(rule(ctx, str(run)))
    order = {"high": 0, "medium": 1, "info": 2}
    return sorted(out, key=lambda f: (order[f.severity], -(f.gain or 0)))


def findings_table(findings: list[Finding]) -> pd.DataFrame:
    columns = list(Finding.__dataclass_fields__)
    return pd.DataFrame([asdict(f) for f in findings], columns=columns)


def finding_sentence(f: Finding) -> str:
    """One line for the report: what, where, the fix, and its measured gain."""
    text = f"**{f.run}**: {f.title} → {f.fix}"
    if f.gain is not None:
        sig = "" if f.gain_significant else ", not significant"
        text += (f"; measured: **{f.gain:.2f}×** faster in `{f.gain_run}` "
                 f"(95% CI {f.gain_ci_low:.2f}–{f.gain_ci_high:.2f}{sig})")
    return text + f" [`{f.source}` {f.key_column}={f.key} {f.value_column}]"
