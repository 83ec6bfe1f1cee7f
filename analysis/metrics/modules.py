"""The module table: GPU (and CPU) time per step per module path, forward and backward.

A model workload's capture has an NVTX range ``module:<path>`` around every module down to
its ``module_depth``, in forward and in backward (workloads/module_ranges.py). A GPU op
belongs to a module when its launch falls inside one of that module's ranges (any thread of
its process: backward runs on autograd's), the rule of the phase table
(analysis/metrics/phases.py); its direction is the phase it was launched in. A module's time
is inclusive: ``layers.0`` holds ``layers.0.attn``. Its layer and sublayer come from the
run's structure (workloads/models/parts.py), globs over module paths, not from the model's
source. CPU time per direction is the ranges' own length, by the phase their instance
starts in: on a CPU run that is where the time goes.

Activation checkpointing runs a module's forward again inside backward, under a range
``recompute:<path>`` (workloads/module_ranges.py): that time is the module's backward, and
also its own column (``Recompute GPU ms/step``); forward time and calls count only the real
forward. In compiled code, a kernel is recomputation when most of the nodes fused into it are
forward nodes the partitioner placed in the backward graph (checkpointing, or Inductor's own
rematerialization of cheap ops). A module called several times per step (a shared
projection) has every call's time under its one path, and ``Calls/step`` counts them.

Every table checks itself (analysis/metrics/modulecheck.py): a parent holds at least its
children, siblings never sum past the step, every range closes inside the step it opened in.
A table that fails is flagged ``module_attribution_suspect`` with its worst violation, and
its ``module_coverage`` is left empty rather than read as if the ranges were true.

Compiled code has no module ranges inside it: its kernels get the module path Inductor's
provenance recorded for the nodes fused into them (the stack-trace line that
workloads/steps.py ``track_module_paths`` adds; a kernel fusing nodes of several modules goes
to their deepest common module, or to the one most of them name when only the root holds
them all; an extern kernel, a cuDNN convolution's backward, to the nodes of its own op, not
those fused into its inputs; eager glue launched between compiled kernels follows the kernel
before it). A path compiled below an eager module range (a layer compiled on its own) is
relative to that range's module. Paths deeper than the run's
``module_depth`` count for their ancestor at that depth.

``module_coverage`` (metrics.json): the share of forward + backward GPU time that some module
holds (on a CPU run, of forward + backward CPU time).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.metrics.attribution import Attribution
from analysis.metrics.gpuops import GpuOps
from analysis.metrics.modulecheck import check_module_table, children_of
from analysis.metrics.phases import PHASES, STEP_RANGE, OpPhases, _inside, _Ranges, _union
from analysis.reading.export import Export
from analysis.reading.torchtrace import UNHANDLED
from analysis.reports.fmt import Table
from workloads.structure import (
    MODULE_RANGE_PREFIX,
    RECOMPUTE_LINE,
    RECOMPUTE_RANGE_PREFIX,
    Structure,
)

PREFIX, RECOMPUTE = MODULE_RANGE_PREFIX, RECOMPUTE_RANGE_PREFIX
FORWARD, BACKWARD = PHASES.index("forward_pass"), PHASES.index("backward_pass")
HEADER = ["Module", "Depth", "Layer", "Sublayer", "Forward GPU ms/step",
          "Backward GPU ms/step", "Recompute GPU ms/step", "GPU ms/step", "Share of Step",
          "Forward CPU ms/step", "Backward CPU ms/step", "Recompute CPU ms/step",
          "Calls/step"]
EMPTY = {"module_coverage": None, "module_attribution_suspect": None}
Spans = tuple[np.ndarray, np.ndarray]  # disjoint sorted [start, end] intervals


def structure_of(record: dict[str, Any]) -> Structure:
    """The run record's layer and sublayer globs."""
    value = record.get("structure") or {}
    return Structure(str(value.get("layers") or ""), str(value.get("sublayers") or ""))


def natural_key(path: str) -> list[tuple[int, object]]:
    """Natural order of module paths and layer names: layers.2 before layers.10, ResNet's
    layer1.2 before layer2.0."""
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", path) if t]


@dataclass
class ModuleTable:
    table: Table
    metrics: dict[str, float | None]


def module_table(ex: Export, ops: GpuOps, phases: OpPhases, record: dict[str, Any],
                 attribution: Attribution | None = None) -> ModuleTable:
    """One row per module of the capture's module ranges and compiled provenance (none: an
    empty table)."""
    ranges = _Ranges.of(ex)
    if ranges is None or STEP_RANGE not in ranges.codes:
        return ModuleTable(Table(HEADER), dict(EMPTY))
    eager = {n[len(PREFIX):]: ranges.ops_inside(n, ops) for n in ranges.codes
             if n.startswith(PREFIX)}
    recomputed = {n[len(RECOMPUTE):]: ranges.ops_inside(n, ops) for n in ranges.codes
                  if n.startswith(RECOMPUTE)}
    depth = record.get("module_depth")
    depth = depth if isinstance(depth, int) and depth > 0 else None
    compiled = _compiled_paths(ops, attribution, eager, depth, phases.phase)
    compiled_rec = compiled_recompute(ops, attribution)
    unique, codes = np.unique(compiled.astype(str), return_inverse=True)
    unique = unique.tolist()
    paths = sorted(set(eager) | set(recomputed)
                   | {a for p in unique if p for a in _ancestors(p)}, key=natural_key)
    if not paths:
        return ModuleTable(Table(HEADER), dict(EMPTY))
    roots = set(outermost(paths))
    steps = int(ranges.codes[STEP_RANGE].size)
    in_step = ranges.ops_inside(STEP_RANGE, ops)
    step_ns = int(ops.dur[in_step].sum())
    fwd_op, bwd_op = in_step & (phases.phase == FORWARD), in_step & (phases.phase == BACKWARD)
    fwd_win, bwd_win = _windows(ranges, "forward_pass"), _windows(ranges, "backward_pass")
    structure = structure_of(record)
    rows, top = [], np.zeros(ops.size, bool)
    # a recompute range runs inside whichever backward range autograd was in when it needed
    # the tensors (a sibling's, a child's): it is no one's backward but its own module's
    any_recompute = np.zeros(ops.size, bool)
    for mask in recomputed.values():
        any_recompute |= mask
    rec_spans = {p: _code_spans(ranges, RECOMPUTE + p) for p in recomputed}
    any_rec_spans = _code_spans(ranges, *(RECOMPUTE + p for p in recomputed))
    masks: dict[str, np.ndarray] = {}
    spans: dict[str, Spans] = {}
    for path in paths:
        mine = [p for p in recomputed if p == path or p.startswith(path + ".")]
        under = _under(unique, codes, path)
        recompute = under & compiled_rec
        for p in mine:
            recompute |= recomputed[p]
        eager_mask = eager.get(path, np.zeros(ops.size, bool)) & ~any_recompute
        inside = eager_mask | under | recompute
        fwd_ns, bwd_ns = int(ops.dur[inside & fwd_op].sum()), int(ops.dur[inside & bwd_op].sum())
        rec_ns = int(ops.dur[recompute & bwd_op].sum())
        own_rec = _union_all([rec_spans[p] for p in mine])
        cpu = _cpu_by_direction(ranges, path, fwd_win, bwd_win, own_rec, any_rec_spans)
        spans[path] = _union_all([_minus(_code_spans(ranges, PREFIX + path), any_rec_spans),
                                  own_rec])
        if path in roots:
            top |= inside
        total = int(ops.dur[inside & in_step].sum())
        masks[path] = inside & in_step
        rows.append([
            path, str(path.count(".") + 1), structure.layer_of(path) or "",
            structure.sublayer_of(path) or "", _ms(fwd_ns, steps), _ms(bwd_ns, steps),
            _ms(rec_ns, steps), _ms(total, steps),
            f"{total / step_ns:.4f}" if step_ns else "",
            _ms(cpu["fwd"], steps), _ms(cpu["bwd"], steps), _ms(cpu["recompute"], steps),
            f"{cpu['calls'] / steps:g}",
        ])
    directions = fwd_op | bwd_op
    gpu_ns = int(ops.dur[directions].sum())
    if gpu_ns:
        coverage = float(ops.dur[directions & top].sum() / gpu_ns)
    else:  # a CPU run: the top-level modules' share of the forward and backward ranges
        both = _union_all([fwd_win, bwd_win])
        held = _intersect(_union_all([spans[p] for p in roots]), both)
        coverage = _length(held) / _length(both) if _length(both) else None
    table = Table(HEADER, rows)
    per_step = steps * 1e6
    guests = _guests(ranges, paths, fwd_win)
    if gpu_ns:
        suspect = _gpu_check(ops, paths, masks, guests, in_step, per_step, _range_problems(ranges))
    else:  # a CPU run: the ranges' own time
        suspect = _cpu_check(ranges, paths, spans, guests, per_step)
    return ModuleTable(table, {"module_coverage": None if suspect else coverage,
                               "module_attribution_suspect": suspect})


def compiled_recompute(ops: GpuOps, attribution: Attribution | None) -> np.ndarray:
    """Per op: whether compiled code recomputed it in backward (most of the nodes fused into
    its kernel carry the recompute line workloads/steps.py adds)."""
    out = np.zeros(ops.size, bool)
    if attribution is None:
        return out
    marked = [[2 * sum(RECOMPUTE_LINE in t for t in site.stack_traces) > len(site.stack_traces)
               for site in graph.sites] for graph in attribution.graphs]
    for op in np.flatnonzero(attribution.op_graph >= 0).tolist():
        out[op] = marked[int(attribution.op_graph[op])][int(attribution.op_site[op])]
    return out


def _compiled_paths(ops: GpuOps, attribution: Attribution | None,
                    eager: dict[str, np.ndarray], depth: int | None,
                    phase: np.ndarray) -> np.ndarray:
    """Per op: the module path of its compiled call site ("" for none), made absolute by the
    innermost eager module range it was launched in, cut to ``depth`` components."""
    out = np.full(ops.size, "", dtype=object)
    if attribution is None:
        return out
    site_paths = [[place.path for place in row] for row in attribution.places]
    innermost = np.full(ops.size, "", dtype=object)
    for path in sorted(eager, key=lambda p: p.count(".")):  # deeper ranges overwrite
        innermost[eager[path]] = path
    for op in np.flatnonzero(attribution.op_graph >= 0).tolist():
        path = site_paths[int(attribution.op_graph[op])][int(attribution.op_site[op])]
        if not path:
            continue
        outer = innermost[op]
        if outer and path != outer and not path.startswith(outer + "."):
            path = f"{outer}.{path}"
        out[op] = ".".join(path.split(".")[:depth]) if depth else path
    _follow_launcher(ops, attribution, out, phase)
    return out


def _follow_launcher(ops: GpuOps, attribution: Attribution, paths: np.ndarray,
                     phase: np.ndarray) -> None:
    """Give an op compiled code launched without provenance (eager glue between its kernels,
    e.g. the sums after a mix-order reduction, or a kernel without a handle) the path of the
    last compiled kernel with one that its thread launched before it in the same phase
    (forward or backward: the optimizer's kernels after the backward are no module's)."""
    unhandled = np.zeros(ops.size, bool)
    for op in np.flatnonzero(attribution.op_graph >= 0).tolist():
        site = attribution.graphs[int(attribution.op_graph[op])].sites[int(attribution.op_site[op])]
        unhandled[op] = site.handle.endswith(":" + UNHANDLED)
    directions = (phase == FORWARD) | (phase == BACKWARD)
    fillable = ((attribution.op_graph < 0) | unhandled) & (ops.launch >= 0) & directions
    if not fillable.any():
        return
    # by launch, then start: a CUDA graph's kernels share one launch call
    order = np.lexsort((ops.start, ops.launch, ops.tid, ops.pid))
    thread, last = None, ""
    for op in order.tolist():
        if (ops.pid[op], ops.tid[op], phase[op]) != thread:
            thread, last = (ops.pid[op], ops.tid[op], phase[op]), ""
        if paths[op]:
            last = paths[op] if attribution.op_graph[op] >= 0 else last
        elif fillable[op] and last:
            paths[op] = last


def outermost(paths: Iterable[str]) -> list[str]:
    """The paths none of whose ancestors is among ``paths``, in their order: the outermost
    modules with time of their own (a ModuleList is never called: its layers are the
    outermost)."""
    paths = list(paths)
    present = set(paths)
    return [p for p in paths if not any(a in present for a in _ancestors(p)[:-1])]


def _ancestors(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _under(unique: list[str], codes: np.ndarray, module: str) -> np.ndarray:
    """Mask of the ops whose compiled path (``unique[codes]``) is ``module`` or inside it."""
    prefix = module + "."
    hits = [i for i, p in enumerate(unique) if p == module or p.startswith(prefix)]
    return np.isin(codes, hits)


def _windows(ranges: _Ranges, name: str) -> tuple[np.ndarray, np.ndarray]:
    i = ranges.codes.get(name, np.empty(0, np.int64))
    if i.size == 0:  # e.g. a whole-step CUDA graph's replays: no phase ranges
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return _union(ranges.start[i], ranges.end[i])


def _cpu_by_direction(ranges: _Ranges, path: str, fwd: Spans, bwd: Spans, own_rec: Spans,
                      any_rec: Spans) -> dict[str, int]:
    """CPU ns of the module's ranges by the phase they start in. Backward: its backward
    ranges without any recomputation inside them, with its own (and its children's)
    recomputation, which a non-reentrant checkpoint runs inside a backward range and a
    reentrant one before it; calls: its forward ranges."""
    i = ranges.codes.get(PREFIX + path, np.empty(0, np.int64))
    start, end = ranges.start[i], ranges.end[i]
    in_fwd, in_bwd = _inside(start, *fwd), _inside(start, *bwd)
    back = _minus(_union(start[in_bwd], end[in_bwd]), any_rec) if in_bwd.any() else own_rec
    rec = _intersect(own_rec, bwd)
    return {"fwd": int((end - start)[in_fwd].sum()), "bwd": _length(_union_all([back, rec])),
            "recompute": _length(rec), "calls": int(in_fwd.sum())}


def _code_spans(ranges: _Ranges, *names: str) -> Spans:
    """The union of the ranges of these names, as disjoint sorted spans."""
    empty = np.empty(0, np.int64)
    i = np.concatenate([empty, *(ranges.codes.get(n, empty) for n in names)])
    return _union(ranges.start[i], ranges.end[i]) if i.size else (empty, empty)


def _union_all(parts: list[Spans]) -> Spans:
    parts = [p for p in parts if p[0].size]
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return _union(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _gpu_check(ops: GpuOps, paths: list[str], masks: dict[str, np.ndarray],
               guests: dict[str, list[str]], in_step: np.ndarray, per_step: float,
               problems: list[str]) -> str | None:
    """The self-check on the ops each module holds (a guest's time inside its hosts apart)."""

    def within(child: str, parent: str | None) -> float:
        mask = masks[child] & (masks[parent] if parent else in_step)
        for host in guests.get(child, []):
            mask &= ~masks[host]
        return ops.dur[mask].sum() / per_step

    return check_module_table(paths, lambda p: ops.dur[masks[p]].sum() / per_step, within,
                              ops.dur[in_step].sum() / per_step, problems, "GPU ms")


def _cpu_check(ranges: _Ranges, paths: list[str], spans: dict[str, Spans],
               guests: dict[str, list[str]], per_step: float) -> str | None:
    """The self-check on the spans of each module's ranges (a CPU run: where the time goes)."""
    steps_span = _windows(ranges, STEP_RANGE)

    def within(child: str, parent: str | None) -> float:
        part = _intersect(spans[child], spans[parent] if parent else steps_span)
        for host in guests.get(child, []):
            part = _minus(part, spans[host])
        return _length(part) / per_step

    return check_module_table(paths, lambda p: _length(spans[p]) / per_step, within,
                              ranges.cpu_ns(STEP_RANGE) / per_step, _range_problems(ranges),
                              "CPU ms")


def _guests(ranges: _Ranges, paths: list[str], fwd: Spans) -> dict[str, list[str]]:
    """Modules called from inside a sibling's forward (a rotary embedding the root holds and
    every layer's attention calls), with those siblings: some forward range of theirs starts
    inside one of the sibling's forward ranges."""
    empty = np.empty(0, np.int64)
    spans = {}
    for path in paths:
        i = ranges.codes.get(PREFIX + path, empty)
        i = i[_inside(ranges.start[i], *fwd)]
        if i.size:
            spans[path] = _union(ranges.start[i], ranges.end[i])
    guests: dict[str, list[str]] = {}
    for group in children_of(paths).values():
        for path in (p for p in group if p in spans):
            hosts = [o for o in group if o != path and o in spans
                     and _inside(spans[path][0], *spans[o]).any()]
            if hosts:
                guests[path] = hosts
    return guests


def _length(spans: Spans) -> int:
    return int((spans[1] - spans[0]).sum())


def _intersect(a: Spans, b: Spans) -> Spans:
    """The intersection of two sets of disjoint sorted spans."""
    out_s, out_e, i, j = [], [], 0, 0
    (a_s, a_e), (b_s, b_e) = a, b
    while i < a_s.size and j < b_s.size:
        lo, hi = max(a_s[i], b_s[j]), min(a_e[i], b_e[j])
        if hi > lo:
            out_s.append(lo)
            out_e.append(hi)
        if a_e[i] < b_e[j]:
            i += 1
        else:
            j += 1
    return np.array(out_s, np.int64), np.array(out_e, np.int64)


def _minus(a: Spans, b: Spans) -> Spans:
    """``a`` without what ``b`` covers."""
    cut = _intersect(a, b)
    return _intersect(a, _complement(cut)) if cut[0].size else a


def _complement(spans: Spans) -> Spans:
    big = np.iinfo(np.int64).max
    return np.r_[np.iinfo(np.int64).min, spans[1]], np.r_[spans[0], big]


def _range_problems(ranges: _Ranges) -> list[str]:
    """Module and recompute ranges that do not close inside the step they opened in."""
    step = ranges.codes.get(STEP_RANGE)
    if step is None:
        return []
    s_start, s_end = ranges.start[step], ranges.end[step]
    order = np.argsort(s_start)
    s_start, s_end = s_start[order], s_end[order]
    problems = []
    for name, i in ranges.codes.items():
        if not name.startswith((PREFIX, RECOMPUTE)):
            continue
        start, end = ranges.start[i], ranges.end[i]
        pos = np.searchsorted(s_start, start, side="right") - 1
        opened_in_step = (pos >= 0) & (start <= s_end[np.maximum(pos, 0)])
        leaks = opened_in_step & (end > s_end[np.maximum(pos, 0)])
        if leaks.any():
            problems.append(f"{int(leaks.sum())} range(s) {name} opened in a step and closed "
                            "after it")
    problems += [f"{n} range(s) {name} never closed"
                 for name, n in ranges.unclosed.items() if name.startswith((PREFIX, RECOMPUTE))]
    return problems


def _ms(ns: int, steps: int) -> str:
    return f"{ns / steps / 1e6:.4g}"
