"""A capture's measured steps as events, with what the analysis knows of each GPU op.

The data behind the Perfetto trace (analysis/outputs/trace.py) and the timeline figure
(analysis/outputs/timeline.py), per rank:

* **the window**: the measured steps are the ``profiled_step`` NVTX ranges of the workload
  (push/pop, in start order); by default the median step (by host time) and the step after
  it (before it, for the last step). The window runs from the first chosen step's start to
  the last one's end, or later, to the end of the last GPU op launched inside it. Every
  GPU op, CUDA API call and NVTX range that overlaps the window is kept, whole. A capture
  without step ranges is one window over all of it.
* **each GPU op** (kernel, memcpy, memset): device, stream, launch configuration, CUDA
  graph node, and the analysis' attribution: category (analysis/metrics/categories.py via
  ``op_categories``), phase (``op_phases``: the phase range open at its launch, or a
  whole-step graph's node counts), layer and sublayer (the layer and sublayer ranges open
  at launch, analysis/metrics/rangetree.py; else those of its module path by the run's
  structure) and module path (analysis/metrics/modules.py: the innermost ``module:`` range,
  or a compiled call site's provenance);
* **host threads**: CUDA API calls and NVTX ranges with their thread.

Ranks: one export per rank, timestamps moved onto one clock by each capture's session start
(``TARGET_INFO_SESSION_START_TIME.utcEpochNs``); a rank's number is the ``RANK`` of its
process environment, else its position among the exports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from analysis.metrics.attribution import attribute
from analysis.metrics.extras import RunInputs, op_categories
from analysis.metrics.gpuops import KERNEL, GpuOps, gpu_ops
from analysis.metrics.modules import PREFIX as MODULE_PREFIX
from analysis.metrics.modules import RECOMPUTE, _compiled_paths, structure_of
from analysis.metrics.phases import STEP_RANGE, _Ranges, op_phases
from analysis.metrics.ranks import _ranges
from analysis.reading.codes import dense_codes
from analysis.reading.columns import EventArrays
from analysis.reading.export import MEMCPY as MEMCPY_TABLE
from analysis.reading.export import MEMSET as MEMSET_TABLE
from analysis.reading.export import Export
from analysis.reading.torchtrace import read_torch_trace
from analysis.reports.nsys_stats import Context

DEFAULT_STEPS = "median"
_STEP_SPEC = re.compile(r"^(\d+)(?:-(\d+))?$")


class StepsError(ValueError):
    """A ``--steps`` choice the capture does not have."""


@dataclass
class StepWindow:
    steps: np.ndarray  # (n, 2): host start and end of every measured step, in order
    chosen: list[int]  # indexes into steps
    start: int
    end: int


@dataclass
class GpuEvents(EventArrays):
    """The window's GPU ops (kernels, memcpys, memsets); labels are codes into lists."""

    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray  # KERNEL / MEMCPY / MEMSET (analysis/metrics/gpuops.py)
    name: np.ndarray  # code into ``names``
    device: np.ndarray
    stream: np.ndarray
    category: np.ndarray  # index into analysis.metrics.categories.CATEGORIES
    phase: np.ndarray  # index into PHASES, -1 outside them
    layer: np.ndarray  # code into ``labels`` (0: none)
    sublayer: np.ndarray
    module: np.ndarray
    grid: np.ndarray
    block: np.ndarray
    graph_node: np.ndarray  # CUDA graph node id, -1 for ops not launched as a graph node
    corr: np.ndarray
    pid: np.ndarray  # process bits of globalPid
    nbytes: np.ndarray  # memcpy/memset bytes, -1 for kernels
    names: list[str]
    labels: list[str]


@dataclass
class ApiEvents:
    """The window's CUDA API calls."""

    start: np.ndarray
    end: np.ndarray
    tid: np.ndarray  # globalTid
    name: np.ndarray  # code into ``names``
    corr: np.ndarray
    launches: np.ndarray  # bool: launched a GPU op of the window
    names: list[str]


@dataclass
class NvtxEvents:
    """The window's closed NVTX ranges."""

    start: np.ndarray
    end: np.ndarray
    tid: np.ndarray  # globalTid of the thread that opened it
    name: np.ndarray  # code into ``names``
    pushpop: np.ndarray  # bool: push/pop (nests on its thread), else start/end
    names: list[str]


@dataclass
class RankEvents:
    """One capture's window: its GPU ops, CUDA API calls and NVTX ranges."""

    path: Path
    rank: int | None  # None: not a distributed run
    window: StepWindow
    gpu: GpuEvents
    api: ApiEvents
    nvtx: NvtxEvents
    processes: dict[int, str]  # pid -> name
    threads: dict[int, str]  # globalTid -> name
    session_ns: int | None  # UTC start of the capture (one clock across ranks)
    offset_ns: int = 0  # added to every timestamp of this rank (set by load_ranks)
    gpu_names: dict[int, str] = field(default_factory=dict)


def pid_of(global_tid: int) -> int:
    return (int(global_tid) >> 24) & 0xFFFFFF


def tid_of(global_tid: int) -> int:
    return int(global_tid) & 0xFFFFFF


# -- the window --------------------------------------------------------------------------------
def measured_steps(ex: Export) -> np.ndarray:
    """(n, 2) host start and end of the ``profiled_step`` push/pop ranges, in start order."""
    names, start, end, _, pushpop = _ranges(ex)
    is_step = np.array([n == STEP_RANGE for n in names], bool) & pushpop
    if not is_step.any():
        return np.empty((0, 2), np.int64)
    order = np.argsort(start[is_step], kind="stable")
    return np.stack([start[is_step][order], end[is_step][order]], axis=1).astype(np.int64)


def choose_steps(steps: np.ndarray, spec: str = DEFAULT_STEPS) -> list[int]:
    """Step indexes (0-based, in capture order) for ``spec``: ``median`` (the median step by
    host time and the one after it, or before it for the last), ``all``, ``N`` or ``A-B``."""
    n = len(steps)
    if n == 0:
        return []
    if spec == "all":
        return list(range(n))
    if spec == DEFAULT_STEPS:
        durations = steps[:, 1] - steps[:, 0]
        median = int(np.argsort(durations, kind="stable")[(n - 1) // 2])
        if n == 1:
            return [0]
        return [median, median + 1] if median + 1 < n else [median - 1, median]
    match = _STEP_SPEC.match(spec.strip())
    if not match:
        raise StepsError(f"--steps {spec!r}: use median, all, N or A-B (0-based)")
    lo = int(match.group(1))
    hi = int(match.group(2)) if match.group(2) is not None else lo
    if not lo <= hi < n:
        raise StepsError(f"--steps {spec!r}: the capture has measured steps 0-{n - 1}")
    return list(range(lo, hi + 1))


def step_window(ex: Export, ops: GpuOps, chosen_spec: str | list[int]) -> StepWindow:
    """The window over the chosen steps (module docstring); the whole capture without
    step ranges."""
    steps = measured_steps(ex)
    chosen = (choose_steps(steps, chosen_spec) if isinstance(chosen_spec, str)
              else [i for i in chosen_spec if 0 <= i < len(steps)])
    if not chosen:
        lo, hi = _capture_extent(ex, ops)
        return StepWindow(steps, [], lo, hi)
    lo, hi = int(steps[chosen[0], 0]), int(steps[chosen[-1], 1])
    launched = (ops.launch >= lo) & (ops.launch <= hi)
    if launched.any():
        hi = max(hi, int(ops.end[launched].max()))
    return StepWindow(steps, chosen, lo, hi)


def _capture_extent(ex: Export, ops: GpuOps) -> tuple[int, int]:
    starts, ends = [ops.start], [ops.end]
    rt = ex.runtime() if ex.has("CUPTI_ACTIVITY_KIND_RUNTIME") else None
    if rt is not None:
        starts.append(rt["start"])
        ends.append(rt["end"])
    names, start, end, _, _ = _ranges(ex)
    starts.append(start)
    ends.append(end)
    s, e = np.concatenate(starts), np.concatenate(ends)
    return (int(s.min()), int(e.max())) if s.size else (0, 0)


def _overlaps(start: np.ndarray, end: np.ndarray, window: StepWindow) -> np.ndarray:
    return (end >= window.start) & (start <= window.end)


# -- what the analysis knows of each op -----------------------------------------------------
class _Labels:
    """Distinct strings as codes (0 is the empty string)."""

    def __init__(self) -> None:
        self.values: list[str] = [""]
        self._index: dict[str, int] = {"": 0}

    def code(self, value: str | None) -> int:
        value = value or ""
        found = self._index.get(value)
        if found is None:
            found = self._index[value] = len(self.values)
            self.values.append(value)
        return found

    def codes(self, values: list[str]) -> np.ndarray:
        return np.array([self.code(v) for v in values], np.int64)


def _eager_places(ex: Export, ops: GpuOps, labels: _Labels
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per op: layer, sublayer and module range open at its launch (innermost wins)."""
    layer = np.zeros(ops.size, np.int64)
    sublayer = np.zeros(ops.size, np.int64)
    module = np.zeros(ops.size, np.int64)
    ranges = _Ranges.of(ex)
    if ranges is None or ops.size == 0:
        return layer, sublayer, module
    # deeper modules overwrite, and a recomputation the backward range it runs in
    by_depth = sorted(ranges.codes, key=lambda n: (n.count("."), n.startswith(RECOMPUTE)))
    for name in by_depth:
        kind = ranges.kind(name)
        target = {"layer": layer, "sublayer": sublayer, "module": module}.get(kind)
        if target is None:
            continue
        value = name
        if kind == "module":
            value = (f"{name[len(RECOMPUTE):]} (recompute)" if name.startswith(RECOMPUTE)
                     else name[len(MODULE_PREFIX):])
        target[ranges.ops_inside(name, ops)] = labels.code(value)
    return layer, sublayer, module


def _module_layers(modules: np.ndarray, labels: _Labels, record: dict
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Layer and sublayer of a model workload's ops from their module paths (its record's
    structure globs, workloads/models/parts.py)."""
    structure = structure_of(record)
    layer = np.zeros(modules.size, np.int64)
    sublayer = np.zeros(modules.size, np.int64)
    if not structure.layers:
        return layer, sublayer
    for code in np.unique(modules[modules > 0]).tolist():
        path = labels.values[code]
        mask = modules == code
        layer[mask] = labels.code(structure.layer_of(path))
        sublayer[mask] = labels.code(structure.sublayer_of(path))
    return layer, sublayer


def _take(ops: GpuOps, idx: np.ndarray) -> GpuOps:
    """The ops ``idx`` of ``ops``."""
    return replace(ops, **{f.name: getattr(ops, f.name)[idx] for f in fields(ops)
                           if f.name != "names"})


def attributed_ops(ex: Export, ops: GpuOps, run: RunInputs, labels: _Labels,
                   keep: np.ndarray) -> dict[str, np.ndarray]:
    """Per op of ``ops[keep]``: category, phase, layer, sublayer and module codes. Phases
    and the compiled call sites are found over the whole capture (an invocation is matched
    by its run of kernels); the rest only for the window's ops."""
    phases = op_phases(ex, ops, run.graph_phases)
    graphs = read_torch_trace(run.torch_trace) if run.torch_trace is not None else []
    graphs = [g for g in graphs if g.sites]
    structure = structure_of(run.record)
    attribution = attribute(ops, phases.phase, graphs, structure) if graphs else None
    idx = np.flatnonzero(keep)
    ops = _take(ops, idx)
    phases = replace(phases, phase=phases.phase[idx], by_count=phases.by_count[idx])
    if attribution is not None:
        attribution = replace(attribution, op_graph=attribution.op_graph[idx],
                              op_site=attribution.op_site[idx],
                              op_invocation=attribution.op_invocation[idx],
                              op_status=attribution.op_status[idx])
    layer, sublayer, module = _eager_places(ex, ops, labels)
    if attribution is not None:
        eager = {labels.values[c]: module == c for c in np.unique(module[module > 0]).tolist()}
        depth = run.record.get("module_depth")
        depth = depth if isinstance(depth, int) and depth > 0 else None
        compiled = _compiled_paths(ops, attribution, eager, depth, phases.phase)
        has = compiled != ""
        if has.any():
            module[has] = labels.codes(compiled[has].tolist())
    if (module > 0).any():
        by_module = _module_layers(module, labels, run.record)
        use = (layer == 0) & (by_module[0] > 0)
        layer[use] = by_module[0][use]
        use = (sublayer == 0) & (by_module[1] > 0)
        sublayer[use] = by_module[1][use]
    return {
        "category": op_categories(ops, phases, attribution),
        "phase": phases.phase,
        "layer": layer,
        "sublayer": sublayer,
        "module": module,
    }


# -- reading one rank ---------------------------------------------------------------------------
def _memop_streams(ex: Export, table: str, n: int) -> np.ndarray:
    if not n:
        return np.empty(0, np.int64)
    cols = ex.columns.int_columns(table, {"start": "start", "streamId": "streamId"})
    return cols["streamId"].astype(np.int64)


def _graph_nodes(ex: Export, window: StepWindow, corr: np.ndarray, start: np.ndarray
                 ) -> np.ndarray:
    """The CUDA graph node id of each of the window's kernels (``corr``, ``start``), -1 for
    kernels not launched as a graph node (read only where the window has some)."""
    node = np.full(corr.size, -1, np.int64)
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not corr.size or "graphNodeId" not in ex.db.columns_of(table):
        return node
    rows = ex.db.query(f"SELECT correlationId, start, graphNodeId FROM {table} WHERE "
                       "graphNodeId IS NOT NULL AND end >= ? AND start <= ?",
                       (window.start, window.end))
    found = {(c, s): n for c, s, n in rows}
    if found:
        node[:] = [found.get(key, -1) for key in zip(corr.tolist(), start.tolist(),
                                                     strict=True)]
    return node


def _gpu_events(ex: Export, ops: GpuOps, keep: np.ndarray, attrs: dict[str, np.ndarray],
                labels: _Labels, window: StepWindow) -> GpuEvents:
    """The window's ops (``keep``) with their attributes (``attrs``: already the window's)."""
    k = ex.kernels(launch_config=True)
    nk, nc = k["start"].size, ex.memcpy()["start"].size
    ns = ex.memset()["start"].size
    stream = np.concatenate([k["streamId"], _memop_streams(ex, MEMCPY_TABLE, nc),
                             _memop_streams(ex, MEMSET_TABLE, ns)]).astype(np.int64)
    device = np.concatenate([k["deviceId"], ex.memcpy()["deviceId"],
                             ex.memset()["deviceId"]]).astype(np.int64)
    nbytes = np.concatenate([np.full(nk, -1), ex.memcpy()["bytes"], ex.memset()["bytes"]])
    grid = np.zeros(ops.size, np.int64)
    block = np.zeros(ops.size, np.int64)
    kept_kernels = np.flatnonzero(keep[:nk])
    if kept_kernels.size:
        for target, cols in ((grid, ("gridX", "gridY", "gridZ")),
                             (block, ("blockX", "blockY", "blockZ"))):
            dims = [k[c][kept_kernels] for c in cols]
            codes, first = dense_codes(*dims)
            text = [f"{x}x{y}x{z}" for x, y, z in zip(*(d[first].tolist() for d in dims),
                                                       strict=True)]
            target[kept_kernels] = labels.codes(text)[codes]
    names = list(ops.names)
    memcpy_kinds = _memcpy_names(ex, names)
    name = ops.name_code.copy()
    if nc:
        name[nk:nk + nc] = memcpy_kinds
    i = np.flatnonzero(keep)
    node = np.full(i.size, -1, np.int64)
    kernels = np.flatnonzero(ops.kind[i] == KERNEL)
    node[kernels] = _graph_nodes(ex, window, ops.corr[i][kernels], ops.start[i][kernels])
    return GpuEvents(
        start=ops.start[i], end=ops.end[i], kind=ops.kind[i], name=name[i],
        device=device[i], stream=stream[i], category=attrs["category"],
        phase=attrs["phase"], layer=attrs["layer"], sublayer=attrs["sublayer"],
        module=attrs["module"], grid=grid[i], block=block[i], graph_node=node,
        corr=ops.corr[i], pid=ops.pid[i], nbytes=nbytes[i], names=names,
        labels=labels.values,
    )


def _memcpy_names(ex: Export, names: list[str]) -> np.ndarray:
    """Per memcpy row: a name code for ``[CUDA memcpy <kind>]`` (appended to ``names``)."""
    mc = ex.memcpy()
    if not mc["start"].size:
        return np.empty(0, np.int64)
    labels = ex.memcpy_labels()
    kinds, inverse = np.unique(mc["copyKind"], return_inverse=True)
    codes = []
    for kind in kinds.tolist():
        label = labels.get(int(kind), str(kind))
        short = label.removeprefix("CUDA_MEMCPY_KIND_") if isinstance(label, str) else label
        codes.append(len(names))
        names.append(f"[CUDA memcpy {short}]")
    return np.array(codes, np.int64)[inverse.ravel()]


def _api_events(ex: Export, window: StepWindow, gpu: GpuEvents) -> ApiEvents:
    if not ex.has("CUPTI_ACTIVITY_KIND_RUNTIME"):
        empty = np.empty(0, np.int64)
        return ApiEvents(empty, empty, empty, empty, empty, np.empty(0, bool), [])
    rt = ex.runtime()
    i = np.flatnonzero(_overlaps(rt["start"], rt["end"], window))
    codes, names = ex.names_for(rt["nameId"][i])
    tid, corr = rt["globalTid"][i], rt["correlationId"][i]
    # a launch: the same correlationId in the same process as one of the window's ops
    launches = np.isin(_launch_key(tid, corr), _launch_key(gpu.pid, gpu.corr))
    return ApiEvents(rt["start"][i], rt["end"][i], tid, codes, corr, launches,
                     [n or "" for n in names])


def _launch_key(global_id: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """(process, correlationId) as one integer: how a launch call and its ops match."""
    return ((global_id.astype(np.int64) >> 24) & 0xFFFFFF) << 32 | (corr.astype(np.int64)
                                                                     & 0xFFFFFFFF)


def _nvtx_events(ex: Export, window: StepWindow) -> NvtxEvents:
    names, start, end, tid, pushpop = _ranges(ex)
    i = np.flatnonzero(_overlaps(start, end, window))
    labels = _Labels()
    codes = labels.codes([names[j] for j in i.tolist()])
    return NvtxEvents(start[i], end[i], tid[i], codes, pushpop[i], labels.values)


def _processes(ex: Export) -> dict[int, str]:
    if not ex.has("PROCESSES"):
        return {}
    return {int(pid): str(name) for _, pid, name in
            ex.db.query("SELECT globalPid, pid, name FROM PROCESSES") if pid is not None}


def _threads(ex: Export) -> dict[int, str]:
    if not ex.has("ThreadNames"):
        return {}
    strings = ex.strings
    out: dict[int, str] = {}
    for gtid, name_id in ex.db.query("SELECT globalTid, nameId FROM ThreadNames"):
        if gtid is not None and strings.get(name_id):
            out[int(gtid)] = strings[name_id]
    return out


def _session_ns(ex: Export) -> int | None:
    if not ex.has("TARGET_INFO_SESSION_START_TIME"):
        return None
    rows = ex.db.query("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    return int(rows[0][0]) if rows and rows[0][0] is not None else None


def rank_of(ex: Export) -> int | None:
    """The ``RANK`` of the captured process's environment (torchrun sets it)."""
    if not ex.has("TARGET_INFO_SYSTEM_ENV"):
        return None
    rows = ex.db.query("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = "
                       "'DeviceEnvironment'")
    for (value,) in rows:
        found = re.search(r"(?:^|;)RANK=(\d+)(?:;|$)", str(value or ""))
        if found:
            return int(found.group(1))
    return None


class _LaunchesOnly(Context):
    """A Context whose op projection is the launch join alone: the NVTX range pairs it
    would also enumerate are not needed here (a third of the time on a large capture)."""

    def ranges(self) -> None:
        return None


def read_rank(path: str | Path, steps: str | list[int] = DEFAULT_STEPS,
              run: RunInputs | None = None) -> RankEvents:
    """One export's window and its events (module docstring)."""
    run = run or RunInputs()
    with Export(path) as ex:
        ex.with_launch_config = True  # one pass over the kernel table
        ex.prefetch_runtime()  # the CUDA API table decodes while the kernels do
        ops = gpu_ops(ex, _LaunchesOnly(ex))
        window = step_window(ex, ops, steps)
        labels = _Labels()
        keep = _overlaps(ops.start, ops.end, window)
        attrs = attributed_ops(ex, ops, run, labels, keep)
        gpu = _gpu_events(ex, ops, keep, attrs, labels, window)
        gpu_names = {dev: str(info.get("name", "")) for dev, info in ex.gpu_info().items()}
        return RankEvents(
            path=Path(path), rank=rank_of(ex), window=window, gpu=gpu,
            api=_api_events(ex, window, gpu), nvtx=_nvtx_events(ex, window),
            processes=_processes(ex), threads=_threads(ex), session_ns=_session_ns(ex),
            gpu_names=gpu_names,
        )


def read_ranks(paths: list[Path], steps: str | list[int] = DEFAULT_STEPS,
               run: RunInputs | None = None) -> list[RankEvents]:
    """Every rank's window on one clock: the steps the first export chose, on every rank."""
    ranks: list[RankEvents] = []
    for i, path in enumerate(paths):
        ranks.append(read_rank(path, steps if i == 0 else ranks[0].window.chosen or steps, run))
    if len(ranks) > 1:
        for i, r in enumerate(ranks):
            r.rank = r.rank if r.rank is not None else i
        if len({r.rank for r in ranks}) < len(ranks):  # not one RANK each: their order
            for i, r in enumerate(ranks):
                r.rank = i
        sessions = [r.session_ns for r in ranks]
        if all(s is not None for s in sessions):
            first = min(sessions)
            for r, s in zip(ranks, sessions, strict=True):
                r.offset_ns = int(s - first)
    return ranks


__all__ = ["DEFAULT_STEPS", "ApiEvents", "GpuEvents", "NvtxEvents", "RankEvents", "StepWindow",
           "StepsError", "choose_steps", "measured_steps", "rank_of", "read_rank", "read_ranks"]
