"""GPU time per phase (forward / loss / backward / optimizer) and per layer or sublayer range.

nsys projects an NVTX range only onto GPU work launched by the thread that pushed it
(``nvtx_gpu_proj_sum``). PyTorch's autograd runs backward on its own thread, so in that report
``backward_pass`` gets almost nothing while its kernels go unaccounted. The rule here:

    a GPU operation (kernel, memcpy, memset) belongs to every NVTX range, on ANY thread of the
    launching process, that is open when its launch call (the CUDA API row with the same
    correlationId) starts.

Its GPU time (end - start on the device) is then added to that range name. Several instances
of a name (``module:layers.3`` in every step) are merged into their union first, so
overlapping instances on two threads never count an operation twice.

A row's ``Kind`` says what the range is: the step, a phase, a ``layer`` or ``sublayer`` (a
family of numbered ranges inside a phase and the ranges directly inside them:
analysis/metrics/rangetree.py), a ``module`` (a model workload's module ranges, whose layers
its module table gives: analysis/metrics/modules.py), or an ``op``.

Another basis fills in what the ranges cannot see (column ``Basis``):

* **graph node count**: a CUDA graph is one launch (``cudaGraphLaunch``) that runs many
  kernels, so by launch a graph lands in the phase of its launch. A graph holding the whole
  step (``cuda_graph: step``) is split instead by the node counts its run record carries
  (``graph_phases``, see :func:`op_phases`).

Compiled code opens no range inside its graphs (they are no-ops while Dynamo traces): its
layers and modules come from the module paths Inductor recorded (the module table).

Work launched before a range opens but still running when it closes is not moved: the
attribution is by launch, not by execution time. ``share_of_step`` divides by the GPU time of
every operation launched inside a ``profiled_step`` range. ``Phases`` lists the phases the
row's ops were launched in (eager layer ranges of a workload that opens them in its forward
see only the forward: backward is launched from autograd's thread, outside them).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field

import numpy as np

from analysis.metrics.gpuops import GpuOps, gpu_ops
from analysis.metrics.rangetree import layer_kinds
from analysis.reading.export import Export
from analysis.reports.nvtx import PID_MASK
from workloads.structure import MODULE_RANGE_PREFIX, RECOMPUTE_RANGE_PREFIX

STEP_RANGE = "profiled_step"
PHASES = ("forward_pass", "loss_computation", "backward_pass", "optimizer_step")
NVTX_BASIS, COUNT_BASIS = "nvtx range", "graph node count"
COLUMNS = [
    "Range",
    "Kind",
    "Instances",
    "Ops",
    "GPU Time (ns)",
    "GPU ms/step",
    "Share of Step",
    "CPU ms/step",
    "Basis",
    "Phases",
]


@dataclass
class OpPhases:
    """The phase of every GPU op (index into PHASES, -1 outside them), in GpuOps order."""

    phase: np.ndarray
    by_count: np.ndarray  # bool: phase from a whole-step CUDA graph's node counts
    split_replays: int  # CUDA-graph replays split by node counts
    counts_given: bool  # the run record had graph_phases

    def name(self, i: int) -> str | None:
        p = int(self.phase[i])
        return PHASES[p] if p >= 0 else None


def _union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into disjoint, sorted ones."""
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _inside(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of times falling in one of the disjoint sorted [start, end] intervals."""
    pos = np.searchsorted(starts, t, side="right") - 1
    ok = pos >= 0
    result = np.zeros(t.size, bool)
    result[ok] = t[ok] <= ends[pos[ok]]
    return result


def _ops_inside(launch: np.ndarray, pid: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                pids: np.ndarray) -> np.ndarray:
    """Mask of ops whose launch falls in one of the ranges of their own process."""
    mask = np.zeros(launch.size, bool)
    has_launch = launch >= 0
    for p in np.unique(pids):
        s, e = _union(starts[pids == p], ends[pids == p])
        mine = has_launch & (pid == p)
        mask[mine] = _inside(launch[mine], s, e)
    return mask


def _display(name: str | None) -> str:
    """Range name without the default domain's empty prefix (nsys 2025 writes ':name')."""
    if name is None:
        return ""
    return name[1:] if name.startswith(":") else name


@dataclass
class _Ranges:
    """The closed NVTX ranges of the capture, by displayed name."""

    start: np.ndarray
    end: np.ndarray
    pid: np.ndarray
    codes: dict[str, np.ndarray]  # name -> indices into start/end/pid
    unclosed: dict[str, int]  # name -> ranges that never ended in the capture
    tid: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # global thread
    _kinds: dict[str, str] | None = None

    @classmethod
    def of(cls, ex: Export) -> _Ranges | None:
        nv = ex.nvtx()
        if nv is None:
            return None
        closed = np.flatnonzero(nv.end >= nv.start)
        names = [_display(n) for n in nv.names]
        code = nv.name_code[closed]
        by_name: dict[str, list[int]] = {}
        for c, n in enumerate(names):
            by_name.setdefault(n, []).append(c)
        codes = {n: np.flatnonzero(np.isin(code, cs)) for n, cs in by_name.items()}
        open_codes = nv.name_code[nv.end < nv.start]
        unclosed = {n: int(np.isin(open_codes, cs).sum()) for n, cs in by_name.items()}
        return cls(nv.start[closed], nv.end[closed], nv.global_tid[closed] & PID_MASK,
                   {n: i for n, i in codes.items() if i.size},
                   {n: k for n, k in unclosed.items() if k}, nv.global_tid[closed])

    def kind(self, name: str) -> str:
        """What the range ``name`` is (module docstring): its name says step, phase or module;
        how its ranges nest says layer or sublayer; else an op."""
        if self._kinds is None:
            names = list(self.codes)
            name_of = np.empty(self.start.size, np.int64)
            for k, n in enumerate(names):
                name_of[self.codes[n]] = k
            fixed = [n for n in names if name_kind(n) != "op"]
            self._kinds = layer_kinds(names, name_of, self.start, self.end, self.tid,
                                      PHASES, fixed)
        return self._kinds.get(name) or name_kind(name)

    def ops_inside(self, name: str, ops: GpuOps) -> np.ndarray:
        i = self.codes.get(name)
        if i is None:
            return np.zeros(ops.size, bool)
        return _ops_inside(ops.launch, ops.pid, self.start[i], self.end[i], self.pid[i])

    def cpu_ns(self, name: str) -> int:
        i = self.codes.get(name, np.empty(0, np.int64))
        return int((self.end[i] - self.start[i]).sum())


def step_ops(ex: Export, ops: GpuOps) -> tuple[np.ndarray, int]:
    """(mask of the ops launched inside a measured step, the number of steps)."""
    ranges = _Ranges.of(ex)
    if ranges is None or STEP_RANGE not in ranges.codes:
        return np.zeros(ops.size, bool), 0
    return ranges.ops_inside(STEP_RANGE, ops), int(ranges.codes[STEP_RANGE].size)


def op_phases(ex: Export, ops: GpuOps, graph_phases: list[dict] | None = None) -> OpPhases:
    """Per op: the phase range open at its launch (any thread of the process); for the ops
    of a CUDA-graph replay holding the whole step, the phase of its node count instead.

    ``graph_phases`` (the run record's, e.g. ``[{"phase": "forward_pass", "nodes": 171},
    ...]``) are cumulative counts of activity-producing nodes (kernel, memset, memcpy) at
    the end of each phase, in capture order.  A replay with as many ops as the last count
    is split: its ops, by start time, take the phases in turn.
    """
    phase = np.full(ops.size, -1, np.int64)
    ranges = _Ranges.of(ex)
    if ranges is not None and ops.size:
        for p, name in enumerate(PHASES):
            phase[ranges.ops_inside(name, ops) & (phase < 0)] = p
    by_count = np.zeros(ops.size, bool)
    split = 0
    counts = _node_counts(graph_phases)
    for members in _replays(ops):
        if not counts or members.size != counts[-1][1]:
            continue
        members = members[np.argsort(ops.start[members], kind="stable")]
        lo = 0
        for name, hi in counts:
            phase[members[lo:hi]] = PHASES.index(name) if name in PHASES else -1
            lo = hi
        by_count[members] = True
        split += 1
    return OpPhases(phase=phase, by_count=by_count, split_replays=split,
                    counts_given=bool(counts))


def _replays(ops: GpuOps) -> list[np.ndarray]:
    """The ops of each CUDA-graph replay (one launch call: same process and correlationId)."""
    replay = np.flatnonzero(ops.graph_launch)
    if replay.size == 0:
        return []
    order = replay[np.lexsort((ops.corr[replay], ops.pid[replay]))]
    key_change = np.r_[True, (np.diff(ops.corr[order]) != 0) | (np.diff(ops.pid[order]) != 0)]
    return np.split(order, np.flatnonzero(key_change)[1:])


def _node_counts(graph_phases: list[dict] | None) -> list[tuple[str, int]]:
    """(phase, cumulative node count) pairs; empty unless well formed and non-decreasing."""
    out: list[tuple[str, int]] = []
    for entry in graph_phases or []:
        try:
            name, nodes = str(entry["phase"]), int(entry["nodes"])
        except (KeyError, TypeError, ValueError):
            return []
        if nodes < (out[-1][1] if out else 0):
            return []
        out.append((name, nodes))
    return out if out and out[-1][1] > 0 else []


@dataclass
class _Row:
    mask: np.ndarray
    bases: list[str]
    instances: int
    cpu_ns: int | None


def phase_table(ex: Export, ops: GpuOps | None = None, phases: OpPhases | None = None
                ) -> list[dict[str, object]]:
    """One row per range name: GPU time of the ops launched inside it (or placed there by
    node counts), per step."""
    ranges = _Ranges.of(ex)
    if ranges is None:
        return []
    ops = ops if ops is not None else gpu_ops(ex)
    phases = phases if phases is not None else op_phases(ex, ops)
    rows: dict[str, _Row] = {}
    for name in ranges.codes:
        inside = ranges.ops_inside(name, ops)
        if name in PHASES:
            inside &= ~phases.by_count
        rows[name] = _Row(inside, [NVTX_BASIS], int(ranges.codes[name].size),
                          ranges.cpu_ns(name))
    if phases.by_count.any():
        for p, name in enumerate(PHASES):
            counted = phases.by_count & (phases.phase == p)
            row = rows.setdefault(name, _Row(np.zeros(ops.size, bool), [], 0, None))
            row.mask |= counted
            row.bases.append(COUNT_BASIS)
            row.instances += phases.split_replays

    step = rows.get(STEP_RANGE)
    steps = step.instances if step is not None and NVTX_BASIS in step.bases else 0
    step_ops = step.mask if steps else np.zeros(ops.size, bool)
    dur = ops.dur
    step_gpu_ns = int(dur[step_ops].sum())
    per_step = max(steps, 1)
    out: list[dict[str, object]] = []
    for name in sorted(rows):
        row = rows[name]
        gpu_ns = int(dur[row.mask].sum())
        out.append({
            "Range": name,
            "Kind": ranges.kind(name) if name in ranges.codes else name_kind(name),
            "Instances": row.instances,
            "Ops": int(row.mask.sum()),
            "GPU Time (ns)": gpu_ns,
            "GPU ms/step": gpu_ns / per_step / 1e6,
            "Share of Step": gpu_ns / step_gpu_ns if step_gpu_ns else None,
            "CPU ms/step": row.cpu_ns / per_step / 1e6 if row.cpu_ns is not None else None,
            "Basis": " + ".join(dict.fromkeys(row.bases)),
            "Phases": _phases_of(phases.phase[row.mask]),
        })
    if steps:
        out.append(_other_row(out, step_gpu_ns, per_step))
    out.sort(key=lambda r: (_KIND_ORDER.index(r["Kind"]), -int(r["GPU Time (ns)"])))
    return out


def _phases_of(phase: np.ndarray) -> str:
    present = np.unique(phase[phase >= 0]).tolist()
    return "+".join(PHASES[p] for p in present)


def _other_row(rows: list[dict[str, object]], step_gpu_ns: int,
               per_step: int) -> dict[str, object]:
    """GPU time launched inside a step but in none of the phases (e.g. zero_grad)."""
    phase_ns = sum(int(r["GPU Time (ns)"]) for r in rows if r["Range"] in PHASES)
    rest = step_gpu_ns - phase_ns
    return {
        "Range": "(step, outside phases)",
        "Kind": "phase",
        "Instances": None,
        "Ops": None,
        "GPU Time (ns)": rest,
        "GPU ms/step": rest / per_step / 1e6,
        "Share of Step": rest / step_gpu_ns if step_gpu_ns else None,
        "CPU ms/step": None,
        "Basis": "",
        "Phases": "",
    }


_KIND_ORDER = ["step", "phase", "layer", "sublayer", "module", "op", "other"]


def name_kind(name: str) -> str:
    """What a range is by its name alone: step, phase, module, other, else op (a layer or
    sublayer is told by nesting: :meth:`_Ranges.kind`)."""
    if name in (STEP_RANGE, "profiled_region"):
        return "step"
    if name in PHASES:
        return "phase"
    # a model workload's, and their recomputation by checkpointing (analysis/metrics/modules.py)
    if name.startswith((MODULE_RANGE_PREFIX, RECOMPUTE_RANGE_PREFIX)):
        return "module"
    if name in ("warmup",):
        return "other"
    return "op"


def phase_summary(rows: list[dict[str, object]]) -> dict[str, float | None]:
    """Per-phase GPU ms/step and shares, flat, for the run's metrics.json / summary row."""
    out: dict[str, float | None] = {}
    by_name = {r["Range"]: r for r in rows}
    for phase in PHASES:
        row = by_name.get(phase)
        out[f"phase_gpu_ms_{phase}"] = float(row["GPU ms/step"]) if row else None
    step = by_name.get(STEP_RANGE)
    out["phase_gpu_ms_step"] = float(step["GPU ms/step"]) if step else None
    covered = [by_name[p]["Share of Step"] for p in PHASES if p in by_name]
    out["phase_gpu_coverage"] = (
        float(sum(c for c in covered if c is not None)) if covered else None
    )
    return out


def write_phase_table(ex: Export, path: str | os.PathLike[str]) -> dict[str, float | None]:
    """Write ``phase_gpu_time.csv`` (NVTX ranges only); return the flat per-phase numbers."""
    return write_phase_rows(path, phase_table(ex))


def write_phase_rows(path: str | os.PathLike[str], rows: list[dict[str, object]]
                     ) -> dict[str, float | None]:
    """Write ``rows`` as ``phase_gpu_time.csv``; return :func:`phase_summary` of them."""
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(v) for k, v in row.items()})
    return phase_summary(rows)


def _csv_value(v: object) -> object:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v
