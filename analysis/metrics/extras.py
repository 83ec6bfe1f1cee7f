"""The extras: what ``nsys stats`` lacks, per run (``python -m analysis extras``).

Kernel categories, tensor cores, occupancy, utilization and launch overhead tables, and
the headline metrics written to ``metrics.json``.

Library entry points: :func:`run_metrics` (the dict written to ``metrics.json``),
:func:`compute_extras` (all extra tables + metrics) and :func:`write_extras`.
Definitions are in the docstrings below and in docs/analysis.md.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analysis.metrics.attribution import Attribution, attribute
from analysis.metrics.categories import CATEGORIES, MEMOP_CATEGORY, categorize_op, tensor_core_rule
from analysis.metrics.durations import durations_table
from analysis.metrics.gpuops import KERNEL, GpuOps, gpu_ops
from analysis.metrics.idle import idle_table
from analysis.metrics.kernelmap import attribution_metrics, compiled_op_table, kernel_map_table
from analysis.metrics.modules import module_table, structure_of
from analysis.metrics.occupancy import GpuLimits, occupancy
from analysis.metrics.phases import (
    OpPhases,
    op_phases,
    phase_summary,
    phase_table,
    step_ops,
    write_phase_rows,
)
from analysis.reading.codes import dense_codes
from analysis.reading.export import Export
from analysis.reading.torchtrace import read_torch_trace
from analysis.reports import fmt
from analysis.reports.fmt import Table
from analysis.reports.groupstats import group_stats
from analysis.reports.nsys_stats import Context

EXTRA_CSVS: tuple[str, ...] = (
    "kernel_categories.csv",
    "kernel_map.csv",
    "compiled_ops.csv",
    "nvtx_categories.csv",
    "tensor_core.csv",
    "kernel_occupancy.csv",
    "gpu_utilization.csv",
    "launch_overhead.csv",
    "idle_time.csv",
    "kernel_durations.csv",
    "module_table.csv",
)


@dataclass
class Extras:
    tables: dict[str, Table] = field(default_factory=dict)
    metrics: dict[str, object] = field(default_factory=dict)
    phase_rows: list[dict[str, object]] = field(default_factory=list)


@dataclass
class RunInputs:
    """What a run adds to its export: its record (times.json: size, ``graph_phases`` of a
    whole-step CUDA graph) and the TORCH_TRACE folder of its capture (compiled runs)."""

    record: dict[str, Any] = field(default_factory=dict)
    torch_trace: Path | None = None

    @classmethod
    def load(cls, record: str | os.PathLike[str] | None = None,
             torch_trace: str | os.PathLike[str] | None = None) -> RunInputs:
        data: dict[str, Any] = {}
        if record is not None:
            try:
                loaded = json.loads(Path(record).read_text())
                data = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                data = {}
        return cls(data, Path(torch_trace) if torch_trace is not None else None)

    @property
    def graph_phases(self) -> list[dict] | None:
        value = self.record.get("graph_phases")
        return value if isinstance(value, list) else None



def _median(values: np.ndarray) -> float | None:
    """nsys' median: middle value, or mean of the two middle values."""
    if values.size == 0:
        return None
    return float(np.median(values))


def union_busy(start: np.ndarray, end: np.ndarray) -> tuple[int, np.ndarray]:
    """(busy ns, idle gaps) of the union of [start, end) intervals."""
    if start.size == 0:
        return 0, np.empty(0, np.int64)
    order = np.argsort(start, kind="stable")
    s = start[order]
    e = np.maximum.accumulate(end[order])
    gaps = s[1:] - e[:-1]
    gaps = gaps[gaps > 0]
    span = int(e[-1] - s[0])
    return span - int(gaps.sum()), gaps


@dataclass
class _GpuOps:
    """Kernels followed by memcpy and memset rows, with per-op category."""

    start: np.ndarray
    end: np.ndarray
    device: np.ndarray
    corr: np.ndarray
    gpid: np.ndarray
    category: np.ndarray  # index into CATEGORIES
    is_kernel: np.ndarray


def _gpu_ops(ex: Export, category: np.ndarray) -> _GpuOps:
    k = ex.kernels(launch_config=True)
    mc, ms = ex.memcpy(), ex.memset()
    nmem = mc["start"].size + ms["start"].size
    return _GpuOps(
        start=np.concatenate([k["start"], mc["start"], ms["start"]]),
        end=np.concatenate([k["end"], mc["end"], ms["end"]]),
        device=np.concatenate([k["deviceId"], mc["deviceId"], ms["deviceId"]]),
        corr=np.concatenate([k["correlationId"], mc["correlationId"], ms["correlationId"]]),
        gpid=np.concatenate([k["globalPid"], mc["globalPid"], ms["globalPid"]]),
        category=category,
        is_kernel=np.r_[np.ones(k["start"].size, bool), np.zeros(nmem, bool)],
    )


def op_categories(ops: GpuOps, phases: OpPhases, attribution: Attribution | None) -> np.ndarray:
    """Category (index into CATEGORIES) of every op: kernels by :func:`categorize_op` (name,
    launch phase, the ATen ops of their compiled call site); memcpy/memset: CopyMemset."""
    if ops.size == 0:
        return np.empty(0, np.int64)
    site = np.full(ops.size, -1, np.int64)
    sites: list[tuple[str, ...]] = []
    if attribution is not None:
        offsets = np.cumsum([0] + [len(g.sites) for g in attribution.graphs])
        placed = attribution.op_graph >= 0
        site[placed] = offsets[attribution.op_graph[placed]] + attribution.op_site[placed]
        sites = [s.aten_ops for g in attribution.graphs for s in g.sites]
    kernel = ops.kind == KERNEL
    # one categorisation per (name, phase, call site): memcpy/memset have names of their own
    codes, first = dense_codes(ops.name_code, phases.phase + 1, site + 1)
    category = np.empty(first.size, np.int64)
    memop = CATEGORIES.index(MEMOP_CATEGORY)
    for c, i in enumerate(first.tolist()):
        if not kernel[i]:
            category[c] = memop
            continue
        aten = sites[site[i]] if site[i] >= 0 else None
        category[c] = CATEGORIES.index(categorize_op(ops.name(i), phases.name(i), aten))
    return category[codes]


def _gpu_limits(ex: Export) -> dict[int, GpuLimits]:
    return {dev: GpuLimits.from_target_info(row) for dev, row in ex.gpu_info().items()}


# -- tables ------------------------------------------------------------------------------
def category_table(ops: _GpuOps) -> tuple[Table, dict[str, int | None]]:
    """Time per category over all GPU ops (kernels + memcpy/memset in CopyMemset)."""
    dur = ops.end - ops.start
    ncat = len(CATEGORIES)
    ktime = np.bincount(ops.category[ops.is_kernel], dur[ops.is_kernel], ncat).astype(np.int64)
    mtime = np.bincount(ops.category[~ops.is_kernel], dur[~ops.is_kernel], ncat)
    mtime = mtime.astype(np.int64)
    count = np.bincount(ops.category, minlength=ncat)
    total = ktime + mtime
    grand = float(total.sum())
    rows = []
    for i, cat in enumerate(CATEGORIES):
        share = fmt.round1([total[i] * 100.0 / grand])[0] if grand else ""
        rows.append(
            [cat, str(total[i]), str(ktime[i]), str(mtime[i]), str(count[i]), share]
        )
    header = [
        "Category", "Total Time (ns)", "Kernel Time (ns)", "MemOp Time (ns)", "Instances",
        "Time (%)",
    ]  # fmt: skip
    has_ops = ops.start.size > 0
    values = {c: (int(total[i]) if has_ops else None) for i, c in enumerate(CATEGORIES)}
    return Table(header, rows), values


def nvtx_category_table(ctx: Context, ops: _GpuOps) -> Table:
    """GPU time per (NVTX range name, category); ops counted once per range name."""
    header = ["NVTX Range", "Style", "Category", "Total Time (ns)", "Instances"]
    ranges = ctx.ranges()
    if ranges is None or ops.start.size == 0:
        return Table(header)
    proj = ctx.ops_projection()  # the same ops in the same order: kernels, memcpy, memset
    if proj.pair_range.size == 0:
        return Table(header)
    style = np.array([s == "StartEnd" for s in ranges.style], np.int64)
    name = ranges.name_code[proj.pair_range]
    sty = style[proj.pair_range]
    # an op inside nested ranges of the same name counts once for that name
    key, first = dense_codes(name, sty, proj.pair_op)
    uniq = first
    op = proj.pair_op[uniq]
    codes, gfirst = dense_codes(name[uniq], sty[uniq], ops.category[op])
    st = group_stats(codes, (ops.end - ops.start)[op])
    rows = []
    for i, g in enumerate(st.group.tolist()):
        f = uniq[gfirst[g]]
        rows.append(
            [
                ranges.names[name[f]] or "",
                "StartEnd" if sty[f] else "PushPop",
                CATEGORIES[int(ops.category[proj.pair_op[f]])],
                str(int(st.total[i])),
                str(int(st.count[i])),
            ]
        )
    rows.sort(key=lambda r: (r[0], r[1], -int(r[3])))
    return Table(header, rows)


def tensor_core_table(ex: Export, ctx: Context, category: np.ndarray
                      ) -> tuple[Table, float | None]:
    """Per kernel name: category (the one most of its time has), tensor-core rule, time;
    plus the TC share of kernel time."""
    header = ["Name", "Category", "Tensor Cores", "Rule", "Total Time (ns)", "Instances"]
    k = ex.kernels()
    if k["start"].size == 0:
        return Table(header), None
    codes, names = ctx.kernel_names()
    dur = k["end"] - k["start"]
    time = np.bincount(codes, dur, len(names)).astype(np.int64)
    count = np.bincount(codes, minlength=len(names))
    ncat = len(CATEGORIES)
    by_cat = np.bincount(codes * ncat + category[: codes.size], dur + 1, len(names) * ncat)
    main_category = by_cat.reshape(len(names), ncat).argmax(axis=1)
    rules = [tensor_core_rule(n) for n in names]
    order = sorted(range(len(names)), key=lambda i: (-int(time[i]), names[i] or ""))
    rows = [
        [
            names[i] or "",
            CATEGORIES[int(main_category[i])],
            "yes" if rules[i] else "no",
            rules[i] or "",
            str(time[i]),
            str(count[i]),
        ]
        for i in order
        if count[i] > 0
    ]
    total = int(time.sum())
    tc = int(sum(time[i] for i in range(len(names)) if rules[i]))
    return Table(header, rows), (tc / total if total > 0 else None)


def occupancy_table(
    ex: Export, ctx: Context
) -> tuple[Table, float | None, float | None, GpuLimits | None]:
    """Per launch configuration: SM efficiency and occupancy; duration-weighted means."""
    header = [
        "Name", "Grid", "Block", "Registers Per Thread", "Shared Memory (B)", "Instances",
        "Total Time (ns)", "Blocks Per SM", "Est. SM Efficiency", "Theoretical Occupancy",
        "Est. Achieved Occupancy", "Active Blocks Per SM", "Limiter",
    ]  # fmt: skip
    k = ex.kernels(launch_config=True)
    limits = _gpu_limits(ex)
    first_gpu = _first_gpu(k, limits)
    if k["start"].size == 0 or not limits:
        return Table(header), None, None, first_gpu
    codes, names = ctx.kernel_names()
    smem = k["staticSmem"] + k["dynamicSmem"]
    cfg, first = dense_codes(
        codes, k["deviceId"], k["gridX"], k["gridY"], k["gridZ"], k["blockX"], k["blockY"],
        k["blockZ"], k["regs"], smem,
    )  # fmt: skip
    dur = (k["end"] - k["start"]).astype(np.int64)
    time = np.bincount(cfg, dur, first.size).astype(np.int64)
    count = np.bincount(cfg, minlength=first.size)
    blocks = (k["gridX"] * k["gridY"] * k["gridZ"])[first]
    threads = (k["blockX"] * k["blockY"] * k["blockZ"])[first]
    eff = np.full(first.size, np.nan)
    theo = np.full(first.size, np.nan)
    ach = np.full(first.size, np.nan)
    bps = np.full(first.size, np.nan)
    active = np.zeros(first.size, np.int64)
    limiter = [""] * first.size
    for dev, gpu in limits.items():
        sel = np.flatnonzero(k["deviceId"][first] == dev)
        if sel.size == 0 or gpu.sm_count == 0:
            continue
        occ = occupancy(gpu, blocks[sel], threads[sel], k["regs"][first][sel], smem[first][sel])
        eff[sel], theo[sel], ach[sel], bps[sel] = (
            occ.sm_efficiency, occ.theoretical, occ.achieved_est, occ.blocks_per_sm,
        )  # fmt: skip
        active[sel] = occ.active_blocks
        for j, i in enumerate(sel.tolist()):
            limiter[i] = occ.limiter[j]
    ok = ~np.isnan(eff)
    wsum = float(time[ok].sum())
    sm_eff = float((eff[ok] * time[ok]).sum() / wsum) if wsum > 0 else None
    theo_w = float((theo[ok] * time[ok]).sum() / wsum) if wsum > 0 else None
    order = sorted(range(first.size), key=lambda i: (-int(time[i]), names[codes[first[i]]] or ""))
    rows = []
    for i in order:
        f = first[i]
        rows.append(
            [
                names[codes[f]] or "",
                f"{k['gridX'][f]}x{k['gridY'][f]}x{k['gridZ'][f]}",
                f"{k['blockX'][f]}x{k['blockY'][f]}x{k['blockZ'][f]}",
                str(k["regs"][f]),
                str(smem[f]),
                str(count[i]),
                str(time[i]),
                _f(bps[i], 3),
                _f(eff[i], 4),
                _f(theo[i], 4),
                _f(ach[i], 4),
                str(active[i]) if ok[i] else "",
                limiter[i],
            ]
        )
    return Table(header, rows), sm_eff, theo_w, first_gpu


def _first_gpu(k: dict[str, np.ndarray], limits: dict[int, GpuLimits]) -> GpuLimits | None:
    """The GPU the kernels ran on (most kernels), else the first GPU of the export."""
    if not limits:
        return None
    if k["start"].size:
        devs, counts = np.unique(k["deviceId"], return_counts=True)
        dev = int(devs[np.argmax(counts)])
        if dev in limits:
            return limits[dev]
    return limits[min(limits)]


def _f(x: float, digits: int) -> str:
    return "" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def utilization_table(ops: _GpuOps) -> tuple[Table, dict[str, object]]:
    """Busy union / capture span, per device and for all devices together."""
    header = [
        "Device", "Start (ns)", "End (ns)", "Capture Span (ns)", "Busy (ns)", "Utilization",
        "Idle (ns)", "Idle Gaps", "Median Gap (ns)", "Max Gap (ns)",
    ]  # fmt: skip
    rows = []
    summary: dict[str, object] = {"capture_span_ns": None, "gpu_utilization": None,
                                  "idle_gap_ns": None}  # fmt: skip
    groups: list[tuple[str, np.ndarray]] = [
        (str(d), ops.device == d) for d in np.unique(ops.device).tolist()
    ]
    if len(groups) != 1:
        groups.append(("all", np.ones(ops.start.size, bool)))
    for label, mask in groups:
        s, e = ops.start[mask], ops.end[mask]
        if s.size == 0:
            continue
        busy, gaps = union_busy(s, e)
        span = int(e.max() - s.min())
        util = busy / span if span > 0 else None
        med = _median(gaps)
        rows.append(
            [label, str(s.min()), str(e.max()), str(span), str(busy),
             "" if util is None else f"{util:.6f}", str(span - busy), str(gaps.size),
             "" if med is None else fmt.round1([med])[0],
             str(int(gaps.max())) if gaps.size else "0"]
        )  # fmt: skip
    if ops.start.size:
        busy, _ = union_busy(ops.start, ops.end)
        span = int(ops.end.max() - ops.start.min())
        summary = {
            "capture_span_ns": span,
            "gpu_utilization": busy / span if span > 0 else None,
            "idle_gap_ns": span - busy,
        }
    return Table(header, rows), summary


def launch_table(ex: Export, ctx: Context) -> tuple[Table, float | None]:
    """Kernel start minus launching API call start, per API name."""
    header = ["API", "Kernels", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)", "P90 (ns)"]
    k = ex.kernels()
    rt = ex.runtime()
    if k["start"].size == 0 or rt["start"].size == 0:
        return Table(header), None
    api = ctx.kernel_projection().api_index  # launching API row per kernel, or -1
    ok = api >= 0
    delay = k["start"][ok] - rt["start"][api[ok]]
    if delay.size == 0:
        return Table(header), None
    name_ids = rt["nameId"][api[ok]]
    uniq, inv = np.unique(name_ids, return_inverse=True)
    st = group_stats(inv, delay)
    strings = ex.strings
    rows = []
    for i in np.argsort(-st.count, kind="stable").tolist():
        g = int(st.group[i])
        vals = delay[inv == g]
        rows.append(
            [strings.get(int(uniq[g]), str(uniq[g])), str(st.count[i]),
             fmt.round1([st.mean[i]])[0], fmt.round1([st.median[i]])[0], str(st.min[i]),
             str(st.max[i]), fmt.round1([np.percentile(vals, 90)])[0]]
        )  # fmt: skip
    return Table(header, rows), _median(delay)


# -- public API --------------------------------------------------------------------------
def compute_extras(ex: Export, ctx: Context | None = None, run: RunInputs | None = None
                   ) -> Extras:
    """All extra tables, the phase table and the metrics dict for one export."""
    ctx = ctx or Context(ex)
    run = run or RunInputs()
    out = Extras()
    launched = gpu_ops(ex, ctx)
    phases = op_phases(ex, launched, run.graph_phases)
    graphs = read_torch_trace(run.torch_trace) if run.torch_trace is not None else []
    graphs = [g for g in graphs if g.sites]  # code without provenance handles: no call sites
    attribution = (attribute(launched, phases.phase, graphs, structure_of(run.record))
                   if graphs else None)
    out.phase_rows = phase_table(ex, launched, phases)
    category = op_categories(launched, phases, attribution)
    ops = _gpu_ops(ex, category)
    cat_table, cat_values = category_table(ops)
    out.tables["kernel_categories.csv"] = cat_table
    out.tables["kernel_map.csv"] = kernel_map_table(launched, attribution, category)
    in_step, steps = step_ops(ex, launched)
    out.tables["compiled_ops.csv"] = compiled_op_table(launched, attribution, in_step, steps)
    out.tables["nvtx_categories.csv"] = nvtx_category_table(ctx, ops)
    tc_table, tc_share = tensor_core_table(ex, ctx, category)
    out.tables["tensor_core.csv"] = tc_table
    occ_table, sm_eff, theo, gpu = occupancy_table(ex, ctx)
    out.tables["kernel_occupancy.csv"] = occ_table
    util_table, util = utilization_table(ops)
    out.tables["gpu_utilization.csv"] = util_table
    launch, launch_med = launch_table(ex, ctx)
    out.tables["launch_overhead.csv"] = launch
    idle, idle_values = idle_table(ex)
    out.tables["idle_time.csv"] = idle
    durations, duration_values = durations_table(ex)
    out.tables["kernel_durations.csv"] = durations
    modules = module_table(ex, launched, phases, run.record, attribution)
    out.tables["module_table.csv"] = modules.table
    k = ex.kernels()
    n_kernels = int(k["start"].size)
    metrics: dict[str, object] = {
        "kernel_time_ns": int((k["end"] - k["start"]).sum()) if n_kernels else None,
        "kernel_count": n_kernels,
        **util,
        **idle_values,
        **duration_values,
        "launch_overhead_median_ns": launch_med,
        "tensor_core_share": tc_share,
        "sm_efficiency": sm_eff,
        "theoretical_occupancy": theo,
        "gpu_name": gpu.name if gpu else None,
        "compute_capability": gpu.compute_capability if gpu else None,
    }
    for cat in CATEGORIES:
        metrics[f"category_time_ns.{cat}"] = cat_values[cat]
    metrics.update(phase_summary(out.phase_rows))
    metrics.update(modules.metrics)
    metrics.update(attribution_metrics(launched, phases, attribution, out.phase_rows,
                                       modules.table))
    out.metrics = metrics
    return out


def run_metrics(sqlite_path: str | os.PathLike[str], run: RunInputs | None = None
                ) -> dict[str, object]:
    """The flat dict written to ``metrics.json`` for one export.

    Keys (None where the export has no kernels / no GPU activity / no GPU info):

    * ``kernel_time_ns``: sum of kernel durations (end - start), all devices.
    * ``kernel_count``: number of kernel records (0 for a CPU-only export).
    * ``capture_span_ns``: last end - first start over all GPU activity
      (kernels + memcpy + memset).
    * ``gpu_utilization``: length of the union of the [start, end) intervals of all
      kernels, memcpys and memsets (any device/stream) divided by ``capture_span_ns``.
    * ``idle_gap_ns``: ``capture_span_ns`` - busy union = total time inside the span
      with no GPU activity.
    * ``launch_overhead_median_ns``: median over kernels of kernel start - start of the
      CUDA API call that launched it (matched by correlationId within the process).
    * ``idle_host_ns``, ``idle_dependency_ns``, ``idle_memory_ns``: ``idle_gap_ns`` per
      device split by cause (analysis.metrics.idle), summed over devices.
    * ``kernels_under_10us_share`` / ``kernel_time_under_10us_share``: kernels shorter than
      10 µs, by count / by time (analysis.metrics.durations).
    * ``tensor_core_share``: kernel time of kernels whose names match the tensor-core
      rules (analysis.metrics.categories) / ``kernel_time_ns``.
    * ``sm_efficiency``: sum(min(blocks / SMs, 1) * duration) / sum(duration) over kernels.
    * ``theoretical_occupancy``: duration-weighted mean of the CUDA occupancy
      calculator's active warps / max warps per SM.
    * ``gpu_name``, ``compute_capability`` ("9.0"): from TARGET_INFO_GPU.
    * ``category_time_ns.<Category>``: GPU time per category (kernels; memcpy/memset
      records count in CopyMemset), for every category in analysis.metrics.categories.CATEGORIES.
    * ``phase_gpu_ms_<phase>``, ``phase_gpu_ms_step``, ``phase_gpu_coverage``: from
      phase_gpu_time.csv (analysis.metrics.phases).
    * ``module_coverage``: a model workload's share of forward + backward time inside its
      top-level modules' ranges (analysis.metrics.modules; None without module ranges).
    * ``layer_share_fwd_bwd`` and the kernel-map keys (``kernel_map``, ...): see
      analysis.metrics.kernelmap.attribution_metrics.
    """
    with Export(sqlite_path) as ex:
        return compute_extras(ex, run=run).metrics


def write_extras(
    ex: Export, outdir: str | os.PathLike[str], ctx: Context | None = None,
    run: RunInputs | None = None,
) -> dict[str, object]:
    """Write the extra CSVs, phase_gpu_time.csv and metrics.json into ``outdir``; return the
    metrics."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    extras = compute_extras(ex, ctx, run)
    for name, table in extras.tables.items():
        table.write(out / name)
    # GPU time per phase with the cross-thread rule (docs/timing.md), and the capture's nsys.
    write_phase_rows(out / "phase_gpu_time.csv", extras.phase_rows)
    extras.metrics["nsys_version"] = ex.product_version()
    (out / "metrics.json").write_text(json.dumps(extras.metrics, indent=2) + "\n")
    return extras.metrics


__all__ = ["EXTRA_CSVS", "RunInputs", "compute_extras", "op_categories", "run_metrics",
           "write_extras"]
