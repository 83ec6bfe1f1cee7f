"""Findings: what to change, from the numbers, tied to the fix's measured gain.

Each rule is one function below with its threshold. A finding names the run, the number it
rests on and where that number is (CSV file relative to the results folder, the row's key
column and value, the value's column), so it can be checked by reading that one cell.

A rule's fixes are :class:`Fix` objects: what to say and the run keys (with their values)
that apply it. One check, for every rule (:func:`recommend`): a fix the run already has (its
own keys, as its workload records them) is never recommended, and a finding whose fixes the
run all has is dropped. When the results also hold the variant with a fix (any run that
differs from this one only in the fix's keys, else a later rung of its ladder or a
comparison's candidate), the finding quotes that measured speed-up with its 95% CI; a
variant that also changes other keys gives a JOINT gain: ``joint_keys`` names them and the
sentence says so.

    python -m analysis findings --results R [--summary R/summary.csv] -o R/findings.csv
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.metrics.ops import OUTSIDE
from analysis.metrics.roofline import ROOFLINE_SHARE
from analysis.outputs.runs import OK, empty_cell, read_json, read_timing
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
# One op with a fifth of the step's GPU time: removing it alone could give up to 1.25x on GPU
# time, the size of the ladder's smaller rungs (bf16 1.08x, fused AdamW 1.16x on GPT small).
DOMINANT_OP_SHARE = 0.20
HIGH_OP_OVERHEAD = 0.25  # the op ranges' cost on the traced step, as for the lean capture
# Keys that set how a run is measured, not what it computes: never a difference between runs.
MEASUREMENT_KEYS = ("warmup", "steps", "seed", "out", "op_ranges", "memory_limit_mb",
                    "peak_tflops")
# The run key of a whole-step CUDA graph (forward, backward and optimizer in one graph).
STEP_GRAPH = "cuda_graph"
ON = "on"  # a Fix value: the key set to anything but off


@dataclass(frozen=True)
class Fix:
    """One thing to change: how to say it, and the run keys that apply it (key -> accepted
    values, or ``ON``). ``also``: other key sets that already give what it gives (a whole-step
    graph already has the step in CUDA graphs); ``companions``: keys that go with the fix
    (the SDPA backend with SDPA), part of it when a variant changes them too."""

    text: str
    keys: dict[str, Any]
    also: tuple[dict[str, Any], ...] = ()
    companions: tuple[str, ...] = ()

    def applied(self, params: dict[str, Any]) -> bool:
        return any(all(_matches(params.get(k), v) for k, v in keys.items())
                   for keys in (self.keys, *self.also))

    @property
    def all_keys(self) -> set[str]:
        return {k for keys in (self.keys, *self.also) for k in keys} | set(self.companions)


def _matches(value: Any, accepted: Any) -> bool:
    if accepted == ON:
        return value not in (None, "off", False)
    return value in accepted


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
    # the variant also changed these keys ("key=value; ..."): the gain is a joint gain
    joint_keys: str | None = None


def _present(params: dict[str, Any]) -> dict[str, Any]:
    """A summary row as parameters: empty cells (NaN) are unset keys, not values."""
    return {k: v for k, v in params.items() if not empty_cell(v)}


class Context:
    """One results folder: the summary and lazily read per-run CSVs."""

    def __init__(self, results: Path, summary: pd.DataFrame) -> None:
        self.results = results
        self.summary = summary
        self.by_run = summary.set_index("run")
        self._params: dict[str, dict[str, Any]] = {}

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

    @cached_property
    def plan(self) -> dict[str, Any]:
        return read_json(self.results / "plan.json") or {}

    def params(self, run: str) -> dict[str, Any]:
        """The run's keys as its workload ran them (defaults included): the first timing
        record's, else the traced record's, else the plan's, else the summary row's."""
        if run not in self._params:
            timing = read_timing(self.results / run)
            records = timing.ok_records or timing.records
            record = records[0] if records else read_json(self.results / run / "times.json")
            if record and record.get("params"):
                params = {"workload": record.get("workload"), **record["params"]}
            elif run in self.plan.get("runs", {}):
                params = dict(self.plan["runs"][run].get("params", {}))
            elif run in self.by_run.index:
                params = _present(self.by_run.loc[run].to_dict())
            else:
                params = {}
            self._params[run] = {k: v for k, v in params.items() if k not in MEASUREMENT_KEYS}
        return self._params[run]

    def changed_keys(self, run: str, other: str) -> dict[str, tuple[Any, Any]]:
        """key -> (this run's value, the other's), for every key the two runs differ in."""
        a, b = self.params(run), self.params(other)
        return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}

    def related(self, run: str) -> list[str]:
        """Runs configured as this run's next steps: the later rungs of its ladder (nearest
        first), then the candidates of comparisons whose baseline it is."""
        out: list[str] = []
        info = self.by_run.loc[run]
        if isinstance(info.get("ladder"), str):
            same = self.summary[
                (self.summary["ladder"] == info["ladder"])
                & (self.summary["ladder_group"] == info["ladder_group"])
                & (self.summary["rung_index"] > info["rung_index"])
            ].sort_values("rung_index")
            out += [str(r) for r in same["run"]]
        out += [c["b"] for c in self.plan.get("comparisons", []) if c["a"] == run]
        return out

    def fix_variant(self, run: str, fixes: list[Fix]) -> tuple[str, dict[str, Any]] | None:
        """The measured run that applies one of ``fixes`` to this one, and the keys it changes
        beyond them: a run differing in the fixes' keys only, else the related run (ladder,
        comparison) with the fewest other changes (then the nearest)."""
        ok = set(self.summary.loc[self.summary["status"] == OK, "run"].astype(str))
        related = [r for r in self.related(run) if r in ok]
        best: tuple[tuple[int, int], str, dict[str, Any]] | None = None
        for rank, other in enumerate([*related, *sorted(ok - set(related) - {run})]):
            target = self.params(other)
            applied = [f for f in fixes if f.applied(target)]
            if not applied:
                continue
            fix_keys = set().union(*(f.all_keys for f in applied))
            changed = self.changed_keys(run, other)
            others = {k: v for k, v in changed.items() if k not in fix_keys}
            if others and other not in related:
                continue  # an unrelated run that differs in more than the fix proves nothing
            key = (len(others), rank)
            if best is None or key < best[0]:
                best = (key, other, others)
        return None if best is None else (best[1], best[2])


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


def recommend(ctx: Context, f: Finding, fixes: list[Fix]) -> Finding | None:
    """``f`` with the fixes the run does not have yet (None when it has them all) and the
    measured gain of the best variant that applies one of them."""
    todo = [x for x in fixes if not x.applied(ctx.params(f.run))]
    if fixes and not todo:
        return None
    if todo:
        f.fix = " or ".join(x.text for x in todo)
        _with_gain(ctx, f, todo)
    return f


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
    """The multi-tensor AdamW launches several passes over all parameters per step."""
    share = ctx.category_share(run, "Optimizer")
    if share and share >= OPTIMIZER_SHARE and ctx.params(run).get("mode") == "train":
        f = _category_finding(
            ctx, run, "unfused_optimizer", "Optimizer", OPTIMIZER_SHARE,
            f"unfused optimizer: {share:.0f}% of GPU time in AdamW", "")
        found = recommend(ctx, f, [FUSED_OPTIMIZER])
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
    """An info finding when the summary's overhead `column` is above `threshold`."""
    overhead = ctx.cell(run, column)
    if overhead is not None and overhead > threshold:
        yield _summary_finding(ctx, run, rule, column, threshold,
                               f"{what} by {overhead:.0%}", fix, "info")


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
        threshold = float((read_json(ctx.results / "plan.json") or {}).get("timing", {}).get(
            "unstable_threshold", 0.03))
        yield _summary_finding(
            ctx, run, "unstable_timing", "step_ci_half_width_rel", threshold,
            f"unstable timing: 95% CI is ±{half:.1%} of the median",
            "more repeats or steps; check gpu_state flags (throttling, other processes)", "info")


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
    yield from _overhead_finding(
        ctx, run, "high_op_overhead", "ops_overhead", HIGH_OP_OVERHEAD,
        "the op ranges slowed the traced step",
        "read ops.csv's CPU columns with care (the ranges cost host time); its GPU columns "
        "are kernel times and hold")


RULES: list[Callable[[Context, str], Iterator[Finding]]] = [
    launch_bound, fp32_gemm_without_tensor_cores, autocast_weight_casts, unfused_optimizer,
    naive_attention, dominant_op, optimizer_at_roofline, host_syncs_in_step,
    low_occupancy_kernel, high_profiler_overhead, high_op_overhead, unstable_timing,
]


def _with_gain(ctx: Context, f: Finding, fixes: list[Fix]) -> Finding:
    found = ctx.fix_variant(f.run, fixes)
    if found is None:
        return f
    variant, others = found
    row = speedup_row(ctx.results / f.run, ctx.results / variant)
    if row["status"] == OK:
        f.gain_run, f.gain = variant, row["speedup"]
        f.gain_ci_low, f.gain_ci_high = row["speedup_ci_low"], row["speedup_ci_high"]
        f.gain_significant = bool(row["significant"])
        f.joint_keys = "; ".join(f"{k}={new}" for k, (_, new) in others.items()) or None
    return f


def find_all(results: Path, summary: pd.DataFrame) -> list[Finding]:
    # distributed runs' rules (they import Finding and Context from here)
    from analysis.outputs.comm_findings import COMM_RULES

    ctx = Context(results, summary)
    out: list[Finding] = []
    for run in summary.loc[summary["status"] == OK, "run"]:
        for rule in (*RULES, *COMM_RULES):
            out.extend(rule(ctx, str(run)))
    return sorted(out, key=_rank)


def _rank(f: Finding) -> tuple[int, int, float]:
    """Severity first; then a gain measured for the fix alone, a joint gain, no gain; then
    the larger gain."""
    evidence = 2 if f.gain is None else (1 if f.joint_keys else 0)
    return {"high": 0, "medium": 1, "info": 2}[f.severity], evidence, -(f.gain or 0)


def findings_table(findings: list[Finding]) -> pd.DataFrame:
    columns = list(Finding.__dataclass_fields__)
    return pd.DataFrame([asdict(f) for f in findings], columns=columns)


def finding_sentence(f: Finding) -> str:
    """One line for the report: what, where, the fix, and its measured gain (joint when the
    variant changed more than the fix)."""
    text = f"**{f.run}**: {f.title} → {f.fix}"
    if f.gain is not None:
        sig = "" if f.gain_significant else ", not significant"
        joint = f", joint gain with {f.joint_keys}" if f.joint_keys else ""
        text += (f"; measured: **{f.gain:.2f}×** faster in `{f.gain_run}` "
                 f"(95% CI {f.gain_ci_low:.2f}–{f.gain_ci_high:.2f}{sig}{joint})")
    return text + f" [`{f.source}` {f.key_column}={f.key} {f.value_column}]"
