"""The kernel map of a compiled run, as a table and as metrics.

``kernel_map.csv``: one row per call site of every compiled graph (analysis/reading/
torchtrace.py), in graph and launch order, with its ATen ops, its place in the model (its
module path with the path's layer and sublayer by the run's structure:
analysis/metrics/attribution.py) and the GPU ops the capture matched to it.

Metrics (``metrics.json``), over the forward + backward GPU time (kernels, memcpys and
memsets launched in ``forward_pass`` or ``backward_pass``):

* ``layer_share_fwd_bwd``: share in the layers: the ``layer`` rows of phase_gpu_time.csv
  (numbered NVTX ranges, analysis/metrics/rangetree.py; those a workload opens in its forward
  see only the forward launches), else the layer rows of the module table (its structure's
  layers, eager or compiled: analysis/metrics/modules.py);
* ``kernel_map``: ``ok`` (every Triton kernel matched a call site), ``partial``, ``no kernel
  map`` (Triton kernels but no compiled graph with provenance in the TORCH_TRACE: e.g. an
  Inductor cache entry made without provenance tracking), ``unused`` (graphs read, none of
  their kernels in the capture: e.g. CPU code), or null (no compiled code);
* ``placed_share_fwd_bwd`` (ops with a place in the model), ``compiled_share_fwd_bwd``
  (ops matched to a call site, placed or not), ``glue_share_fwd_bwd`` (eager code between
  compiled graphs), ``ordered_share_fwd_bwd`` (given to externs in order),
  ``unattributed_share_fwd_bwd`` (1 - placed);
* ``triton_matched_share``: Triton kernel instances matched / all;
* ``kernel_map_layers``: the structure's layers the call sites' module paths name (null for
  none: a capture without module paths, or a layer compiled on its own, whose paths start
  inside the layer);
* ``graph_phase_split_replays``: CUDA-graph replays split into phases by node counts (null
  without ``graph_phases`` in the run record).
"""

from __future__ import annotations

import re

import numpy as np

from analysis.metrics.attribution import ANCHOR, EXTERN, GLUE, ORDERED, Attribution
from analysis.metrics.categories import CATEGORIES
from analysis.metrics.gpuops import KERNEL, GpuOps
from analysis.metrics.ops import COLUMNS as OPS_COLUMNS
from analysis.metrics.ops import CompiledOpTime, compiled_op_rows, fused_label
from analysis.metrics.phases import PHASES, OpPhases
from analysis.reading.torchtrace import TRITON_PREFIX, innermost_frame
from analysis.reports.fmt import Table

COLUMNS = [
    "Graph", "AOT ID", "Kind", "Function", "Site", "Handle", "Kernel", "Original ATen",
    "Place", "Layer", "Sublayer", "Source", "Ops", "Invocations", "GPU Time (ns)",
    "Category",
]  # fmt: skip
FWD_BWD = (PHASES.index("forward_pass"), PHASES.index("backward_pass"))


def kernel_map_table(ops: GpuOps, attribution: Attribution | None,
                     category: np.ndarray) -> Table:
    """One row per compiled call site (empty without a kernel map)."""
    if attribution is None:
        return Table(COLUMNS)
    offsets = np.cumsum([0] + [len(g.sites) for g in attribution.graphs])
    n_sites = int(offsets[-1])
    placed = np.flatnonzero(attribution.op_graph >= 0)
    site = offsets[attribution.op_graph[placed]] + attribution.op_site[placed]
    dur = ops.dur[placed]
    count = np.bincount(site, minlength=n_sites)
    time = np.bincount(site, dur, n_sites).astype(np.int64)
    ncat = len(CATEGORIES)
    by_cat = np.bincount(site * ncat + category[placed], dur + 1, n_sites * ncat)
    main = by_cat.reshape(n_sites, ncat).argmax(axis=1)
    calls: dict[int, set[int]] = {}
    for s, inv in zip(site.tolist(), attribution.op_invocation[placed].tolist(), strict=True):
        calls.setdefault(s, set()).add(inv)
    rows = []
    for g, graph in enumerate(attribution.graphs):
        for s, cs in enumerate(graph.sites):
            k = int(offsets[g]) + s
            place = attribution.places[g][s]
            rows.append([
                str(g), graph.aot_id, graph.kind, graph.function, str(s), cs.handle, cs.kernel,
                " ".join(cs.aten_ops), place.path, place.layer or "", place.sublayer or "",
                _source(cs.stack_traces), str(count[k]),
                str(len(calls.get(k, ()))), str(time[k]),
                CATEGORIES[int(main[k])] if count[k] else "",
            ])
    return Table(COLUMNS, rows)


# Extern call sites -> the ATen op they run (the kernel the capture shows is cuBLAS/cuDNN's).
_EXTERN_OP = re.compile(r"^(?:extern_kernels\.|torch\.ops\.aten\.)(\w+?)(?:\.default)?$")
# Views and layout ops an Inductor kernel lists among its Original ATen ops without computing.
_LAYOUT_OPS = {"view", "_unsafe_view", "t", "permute", "transpose", "expand", "slice",
               "unsqueeze", "squeeze", "reshape", "select", "as_strided", "alias",
               "split", "split_with_sizes", "unbind"}
OUTSIDE_COMPILED = "(outside compiled code)"


def site_op_label(kernel: str, aten_ops: tuple[str, ...]) -> str:
    """The ops-table label of a compiled call site: ``aten::mm`` for an extern kernel,
    ``fused(aten::add, aten::mul, ...)`` (ops.fused_label) for an Inductor kernel, its layout
    ops (views) left out unless that is all it has."""
    extern = _EXTERN_OP.match(kernel)
    if extern:
        return f"aten::{extern.group(1)}"
    names = [op.removeprefix("aten.") for op in aten_ops]
    computing = [n for n in names if n not in _LAYOUT_OPS] or names
    return fused_label([f"aten::{n}" for n in computing]) if computing else kernel


def compiled_op_table(ops: GpuOps, attribution: Attribution | None, in_step: np.ndarray,
                      steps: int) -> Table:
    """ops.csv's columns for a compiled run, from its kernel map: each compiled call site's
    GPU time under its source ATen ops, plus what ran outside compiled code (eager glue, the
    optimizer's eager parts), per measured step. Empty without a kernel map."""
    if attribution is None:
        return Table(OPS_COLUMNS)
    sites = [cs for g in attribution.graphs for cs in g.sites]
    offsets = np.cumsum([0] + [len(g.sites) for g in attribution.graphs])
    matched = np.isin(attribution.op_status, (ANCHOR, EXTERN, ORDERED)) & in_step
    site = offsets[np.maximum(attribution.op_graph, 0)] + attribution.op_site
    dur = ops.dur
    times: list[CompiledOpTime] = []
    for k in np.unique(site[matched]):
        mine = matched & (site == k)
        invocations = len(set(attribution.op_invocation[mine].tolist()))
        cs = sites[int(k)]
        times.append(CompiledOpTime(site_op_label(cs.kernel, cs.aten_ops),
                                    int(dur[mine].sum()), invocations, int(mine.sum())))
    rest = in_step & ~matched
    if rest.any():
        times.append(CompiledOpTime(OUTSIDE_COMPILED, int(dur[rest].sum()), 0, int(rest.sum())))
    rows = compiled_op_rows(times, steps, int(dur[in_step].sum()))
    return Table(OPS_COLUMNS, [[_ops_cell(r.get(c)) for c in OPS_COLUMNS] for r in rows])


def _ops_cell(v: object) -> str:
    if v is None:
        return ""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _source(traces: tuple[str, ...]) -> str:
    """``file:line`` of the innermost frame of the first stack trace."""
    for trace in traces:
        frame = innermost_frame(trace)
        if frame:
            return f"{'/'.join(frame[0].split('/')[-2:])}:{frame[1]}"
    return ""


def layer_share(rows: list[dict[str, object]], modules: Table | None = None) -> float | None:
    """``layer_share_fwd_bwd`` (module docstring): the phase table's layer rows, else the
    module table's layers (a row whose Layer is its own Module)."""
    by_name = {r["Range"]: r for r in rows}
    phase_ns = sum(int(by_name[p]["GPU Time (ns)"]) for p in ("forward_pass", "backward_pass")
                   if p in by_name)
    steps = by_name.get("profiled_step", {}).get("Instances") or 0
    layer_ns = float(sum(int(r["GPU Time (ns)"]) for r in rows if r["Kind"] == "layer"))
    if not layer_ns and modules is not None and modules.rows and steps:
        col = {c: i for i, c in enumerate(modules.header)}
        fwd, bwd = col["Forward GPU ms/step"], col["Backward GPU ms/step"]
        layer_ms = sum(_float(r[fwd]) + _float(r[bwd]) for r in modules.rows
                       if r[col["Layer"]] and r[col["Layer"]] == r[col["Module"]])
        layer_ns = layer_ms * 1e6 * float(steps)
    return layer_ns / phase_ns if phase_ns and layer_ns else None


def _float(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return 0.0


def attribution_metrics(ops: GpuOps, phases: OpPhases, attribution: Attribution | None,
                        rows: list[dict[str, object]], modules: Table | None = None
                        ) -> dict[str, object]:
    """The keys of the module docstring."""
    dur = ops.dur
    fwd_bwd = np.isin(phases.phase, FWD_BWD)
    total = int(dur[fwd_bwd].sum())

    def share(mask: np.ndarray) -> float | None:
        return float(dur[fwd_bwd & mask].sum() / total) if total else None

    triton = np.array([n.startswith(TRITON_PREFIX) for n in ops.names], bool)
    is_triton = (ops.kind == KERNEL) & triton[ops.name_code] if ops.size else np.zeros(0, bool)
    out: dict[str, object] = {
        "layer_share_fwd_bwd": layer_share(rows, modules),
        "kernel_map": None,
        "kernel_map_graphs": None,
        "kernel_map_layers": None,
        "triton_matched_share": None,
        "placed_share_fwd_bwd": None,
        "compiled_share_fwd_bwd": None,
        "glue_share_fwd_bwd": None,
        "ordered_share_fwd_bwd": None,
        "unattributed_share_fwd_bwd": None,
        "graph_phase_split_replays": phases.split_replays if phases.counts_given else None,
    }
    if attribution is None:
        if is_triton.any():  # compiled code ran, but no graph was read for it
            out["kernel_map"] = "no kernel map"
        return out
    status = attribution.op_status
    matched = np.isin(status, (ANCHOR, EXTERN, ORDERED))
    offsets = np.cumsum([0] + [len(p) for p in attribution.places])
    site_has_place = np.array([bool(p.path) for g in attribution.places for p in g] + [False])
    layers = {p.layer for g in attribution.places for p in g if p.layer}
    site = np.where(matched, offsets[np.maximum(attribution.op_graph, 0)] + attribution.op_site,
                    -1)
    has_place = site_has_place[site]
    n_triton = int(is_triton.sum())
    matched_triton = int((is_triton & (status == ANCHOR)).sum())
    state = "ok" if matched_triton == n_triton else "partial"
    out.update({
        "kernel_map": state if matched.any() or n_triton else "unused",
        "kernel_map_graphs": len(attribution.graphs),
        "kernel_map_layers": len(layers) or None,
        "triton_matched_share": matched_triton / n_triton if n_triton else None,
        "placed_share_fwd_bwd": share(has_place),
        "compiled_share_fwd_bwd": share(matched),
        "glue_share_fwd_bwd": share(status == GLUE),
        "ordered_share_fwd_bwd": share(status == ORDERED),
        "unattributed_share_fwd_bwd": None if total == 0 else 1 - (share(has_place) or 0.0),
    })
    return out


__all__ = ["COLUMNS", "attribution_metrics", "compiled_op_table", "kernel_map_table",
           "layer_share", "site_op_label"]
