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

Compiled code has no module ranges inside it: its kernels get the module path Inductor's
provenance recorded for the nodes fused into them (the stack-trace line that
workloads/steps.py ``track_module_paths`` adds; a kernel fusing nodes of several modules goes
to their deepest common module, or to the one most of them name when only the root holds
them all; eager glue launched between compiled kernels follows the kernel before it). A path
compiled below an eager module range (a layer compiled on its own) is relative to that
range's module. Paths deeper than the run's
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
from analysis.metrics.phases import PHASES, STEP_RANGE, OpPhases, _inside, _Ranges, _union
from analysis.reading.export import Export
from analysis.reading.torchtrace import UNHANDLED
from analysis.reports.fmt import Table
from workloads.models.parts import MODULE_PATH_LINE, MODULE_RANGE_PREFIX, Structure

PREFIX = MODULE_RANGE_PREFIX
# the line workloads/steps.py adds to a compiled node's stack trace, its path captured
_MODULE_LINE = re.compile(re.escape(MODULE_PATH_LINE).replace(re.escape("{}"), r"([^\]]*)"))
FORWARD, BACKWARD = PHASES.index("forward_pass"), PHASES.index("backward_pass")
HEADER = ["Module", "Depth", "Layer", "Sublayer", "Forward GPU ms/step",
          "Backward GPU ms/step", "GPU ms/step", "Share of Step", "Forward CPU ms/step",
          "Backward CPU ms/step", "Calls/step"]


def structure_of(record: dict[str, Any]) -> Structure:
    """The run record's layer and sublayer globs."""
    value = record.get("structure") or {}
    return Structure(str(value.get("layers") or ""), str(value.get("sublayers") or ""))


def _path_key(path: str) -> list[tuple[int, object]]:
    """Natural order: layers.2 before layers.10."""
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
        return ModuleTable(Table(HEADER), {"module_coverage": None})
    eager = {n[len(PREFIX):]: ranges.ops_inside(n, ops) for n in ranges.codes
             if n.startswith(PREFIX)}
    depth = record.get("module_depth")
    depth = depth if isinstance(depth, int) and depth > 0 else None
    compiled = _compiled_paths(ops, attribution, eager, depth, phases.phase)
    unique, codes = np.unique(compiled.astype(str), return_inverse=True)
    unique = unique.tolist()
    paths = sorted(set(eager) | {a for p in unique if p for a in _ancestors(p)},
                   key=_path_key)
    if not paths:
        return ModuleTable(Table(HEADER), {"module_coverage": None})
    roots = set(outermost(paths))
    steps = int(ranges.codes[STEP_RANGE].size)
    in_step = ranges.ops_inside(STEP_RANGE, ops)
    step_ns = int(ops.dur[in_step].sum())
    fwd_op, bwd_op = in_step & (phases.phase == FORWARD), in_step & (phases.phase == BACKWARD)
    fwd_win, bwd_win = _windows(ranges, "forward_pass"), _windows(ranges, "backward_pass")
    structure = structure_of(record)
    rows, top = [], np.zeros(ops.size, bool)
    top_cpu = {"fwd": 0, "bwd": 0}
    for path in paths:
        inside = eager.get(path, np.zeros(ops.size, bool)) | _under(unique, codes, path)
        fwd_ns, bwd_ns = int(ops.dur[inside & fwd_op].sum()), int(ops.dur[inside & bwd_op].sum())
        cpu = _cpu_by_direction(ranges, PREFIX + path, fwd_win, bwd_win)
        if path in roots:
            top |= inside
            top_cpu["fwd"] += cpu["fwd"]
            top_cpu["bwd"] += cpu["bwd"]
        total = int(ops.dur[inside & in_step].sum())
        rows.append([
            path, str(path.count(".") + 1), structure.layer_of(path) or "",
            structure.sublayer_of(path) or "", _ms(fwd_ns, steps), _ms(bwd_ns, steps),
            _ms(total, steps), f"{total / step_ns:.4f}" if step_ns else "",
            _ms(cpu["fwd"], steps), _ms(cpu["bwd"], steps),
            f"{cpu['calls'] / steps:g}",
        ])
    directions = fwd_op | bwd_op
    gpu_ns = int(ops.dur[directions].sum())
    if gpu_ns:
        coverage = float(ops.dur[directions & top].sum() / gpu_ns)
    else:  # a CPU run: the top-level modules' share of the forward and backward ranges
        cpu_ns = ranges.cpu_ns("forward_pass") + ranges.cpu_ns("backward_pass")
        coverage = (top_cpu["fwd"] + top_cpu["bwd"]) / cpu_ns if cpu_ns else None
    return ModuleTable(Table(HEADER, rows), {"module_coverage": coverage})


def _compiled_paths(ops: GpuOps, attribution: Attribution | None,
                    eager: dict[str, np.ndarray], depth: int | None,
                    phase: np.ndarray) -> np.ndarray:
    """Per op: the module path of its compiled call site ("" for none), made absolute by the
    innermost eager module range it was launched in, cut to ``depth`` components."""
    out = np.full(ops.size, "", dtype=object)
    if attribution is None:
        return out
    site_paths = [[_common(_site_paths(site.stack_traces)) for site in graph.sites]
                  for graph in attribution.graphs]
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


def _site_paths(traces: tuple[str, ...]) -> list[str]:
    return [m.group(1) for t in traces for m in _MODULE_LINE.finditer(t)]


def _common(paths: list[str]) -> str:
    """The deepest module holding every path; when only the root holds them all (a kernel
    fusing the end of one top-level module with the start of the next, or a weight tied
    between two), the path most of them name."""
    if not paths:
        return ""
    split = [p.split(".") for p in set(paths)]
    common = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    if common:
        return ".".join(common)
    return max(sorted(set(paths)), key=paths.count)


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


def _cpu_by_direction(ranges: _Ranges, name: str, fwd: tuple[np.ndarray, np.ndarray],
                      bwd: tuple[np.ndarray, np.ndarray]) -> dict[str, int]:
    i = ranges.codes.get(name)
    if i is None:  # a compiled module: no range of its own
        return {"fwd": 0, "bwd": 0, "calls": 0}
    start, length = ranges.start[i], ranges.end[i] - ranges.start[i]
    in_fwd, in_bwd = _inside(start, *fwd), _inside(start, *bwd)
    return {"fwd": int(length[in_fwd].sum()), "bwd": int(length[in_bwd].sum()),
            "calls": int(in_fwd.sum())}


def _ms(ns: int, steps: int) -> str:
    return f"{ns / steps / 1e6:.4g}"
