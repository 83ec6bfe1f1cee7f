"""The kernel map of a compiled run, as a table and as metrics.

``kernel_map.csv``: one row per call site of every compiled graph (analysis/reading/
torchtrace.py), in graph and launch order, with its ATen ops, its place in the model
(analysis/metrics/attribution.py) and the GPU ops the capture matched to it.

Metrics (``metrics.json``), over the forward + backward GPU time (kernels, memcpys and
memsets launched in ``forward_pass`` or ``backward_pass``):

* ``layer_share_fwd_bwd``: share in the ``layer_<i>`` rows of phase_gpu_time.csv (any
  basis; eager layer ranges see only the forward launches);
* ``kernel_map``: ``ok`` (every Triton kernel matched a call site), ``partial``, ``no kernel
  map`` (Triton kernels but no compiled graph with provenance in the TORCH_TRACE: e.g. an
  Inductor cache entry made without provenance tracking), ``unused`` (graphs read, none of
  their kernels in the capture: e.g. CPU code), or null (no compiled code);
* ``placed_share_fwd_bwd`` (ops with a place in the model), ``compiled_share_fwd_bwd``
  (ops matched to a call site, placed or not), ``glue_share_fwd_bwd`` (eager code between
  compiled graphs), ``ordered_share_fwd_bwd`` (given to externs in order),
  ``unattributed_share_fwd_bwd`` (1 - placed);
* ``triton_matched_share``: Triton kernel instances matched / all;
* ``kernel_map_layers``: layers found per graph (null unless all agree with the model);
* ``graph_phase_split_replays``: CUDA-graph replays split into phases by node counts (null
  without ``graph_phases`` in the run record).
"""

from __future__ import annotations

import numpy as np

from analysis.metrics.attribution import ANCHOR, EXTERN, GLUE, ORDERED, Attribution
from analysis.metrics.categories import CATEGORIES
from analysis.metrics.gpuops import KERNEL, GpuOps
from analysis.metrics.phases import PHASES, OpPhases
from analysis.reading.sourceregions import parse_frames
from analysis.reading.torchtrace import TRITON_PREFIX
from analysis.reports.fmt import Table

COLUMNS = [
    "Graph", "AOT ID", "Kind", "Function", "Site", "Handle", "Kernel", "Original ATen",
    "Place", "Layer", "Sublayer", "Region", "Source", "Ops", "Invocations", "GPU Time (ns)",
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
                " ".join(cs.aten_ops), " > ".join(place.path),
                "" if place.layer is None else str(place.layer), place.sublayer or "",
                place.region or "", _source(cs.stack_traces), str(count[k]),
                str(len(calls.get(k, ()))), str(time[k]),
                CATEGORIES[int(main[k])] if count[k] else "",
            ])
    return Table(COLUMNS, rows)


def _source(traces: tuple[str, ...]) -> str:
    """``file:line`` of the innermost frame of the first stack trace."""
    for trace in traces:
        frames = parse_frames(trace)
        if frames:
            f = frames[-1]
            return f"{'/'.join(f.file.split('/')[-2:])}:{f.line}"
    return ""


def attribution_metrics(ops: GpuOps, phases: OpPhases, attribution: Attribution | None,
                        rows: list[dict[str, object]]) -> dict[str, object]:
    """The keys of the module docstring."""
    dur = ops.dur
    fwd_bwd = np.isin(phases.phase, FWD_BWD)
    total = int(dur[fwd_bwd].sum())

    def share(mask: np.ndarray) -> float | None:
        return float(dur[fwd_bwd & mask].sum() / total) if total else None

    by_name = {r["Range"]: r for r in rows}
    phase_ns = sum(int(by_name[p]["GPU Time (ns)"]) for p in ("forward_pass", "backward_pass")
                   if p in by_name)
    layer_ns = sum(int(r["GPU Time (ns)"]) for r in rows if r["Kind"] == "layer")
    triton = np.array([n.startswith(TRITON_PREFIX) for n in ops.names], bool)
    is_triton = (ops.kind == KERNEL) & triton[ops.name_code] if ops.size else np.zeros(0, bool)
    out: dict[str, object] = {
        "layer_share_fwd_bwd": layer_ns / phase_ns if phase_ns and layer_ns else None,
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
    site = np.where(matched, offsets[np.maximum(attribution.op_graph, 0)] + attribution.op_site,
                    -1)
    has_place = site_has_place[site]
    n_triton = int(is_triton.sum())
    matched_triton = int((is_triton & (status == ANCHOR)).sum())
    state = "ok" if matched_triton == n_triton else "partial"
    out.update({
        "kernel_map": state if matched.any() or n_triton else "unused",
        "kernel_map_graphs": len(attribution.graphs),
        "kernel_map_layers": max(attribution.layers_found.values())
        if attribution.layers_ok else None,
        "triton_matched_share": matched_triton / n_triton if n_triton else None,
        "placed_share_fwd_bwd": share(has_place),
        "compiled_share_fwd_bwd": share(matched),
        "glue_share_fwd_bwd": share(status == GLUE),
        "ordered_share_fwd_bwd": share(status == ORDERED),
        "unattributed_share_fwd_bwd": None if total == 0 else 1 - (share(has_place) or 0.0),
    })
    return out


__all__ = ["COLUMNS", "attribution_metrics", "kernel_map_table"]
