"""One rank's capture as compute, communication and idle time per step, and its collectives.

A distributed run has one nsys export per rank (rules/distributed.smk). From each:

* the steps: the ``profiled_step`` NVTX ranges of the workload's main thread (their host
  windows contain all of the step's work: each step ends with a device synchronization);
* **communication**: on a GPU the communication kernels (``nccl...``, the ``Communication``
  category of analysis/metrics/categories.py); on a CPU, which has no kernels, the NVTX
  ranges ``comm <op> <bytes>B`` that workloads/parallel.py opens when a collective is issued
  and closes when its future completes (gloo runs it on its own threads meanwhile);
* **compute**: on a GPU every other kernel, memcpy and memset; on a CPU the operator ranges
  (``aten::...``) the workload records in a distributed capture (the ``c10d::`` ranges,
  issuing a collective, are not compute);

and, per step, with both merged into their union and clipped to the step's window:

    compute       |compute|
    communication |comm|
    exposed       |comm \\ compute|   communication while no compute runs: what the step waits
    overlap       1 - exposed / communication (None without communication)
    idle          window - |compute U comm|
    first comm    the duration of the step's first collective: every rank's ends together, so
                  a rank that reaches it later spends that much less in it (the lateness
                  analysis/outputs/ranks.py reads; the step's whole communication would also
                  count, on the ranks that arrived first, every later collective queued behind
                  the first while backward overlaps them)

The same definitions as Holistic Trace Analysis' temporal and communication/computation
overlap breakdowns (docs/distributed.md). Each collective: its op and message size (from the
``comm`` range: on a GPU the range in which its kernel was launched) and its time (the
kernel's duration, or the range's on a CPU), from which analysis/outputs/distributed.py takes
algorithm and bus bandwidth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from analysis.metrics.categories import categorize
from analysis.reading.export import NVTX_PUSHPOP_TYPES, Export
from analysis.reports.nsys_stats import Context
from analysis.reports.nvtx import match_runtime

STEP_RANGE = "profiled_step"
COMM_RANGE = re.compile(r"^comm (\w+) (\d+)B$")
COMPUTE_RANGE_PREFIX = "aten::"
# NCCL kernel names -> collective (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclKernel_...)
NCCL_OPS = (("allreduce", "all_reduce"), ("allgather", "all_gather"),
            ("reducescatter", "reduce_scatter"), ("broadcast", "broadcast"),
            ("sendrecv", "send_recv"), ("alltoall", "all_to_all"))
STEP_COLUMNS = ["step", "start_ns", "end_ns", "step_ms", "compute_ms", "comm_ms",
                "exposed_comm_ms", "overlap", "idle_ms", "first_comm_ms"]


@dataclass
class Intervals:
    """Disjoint, sorted [start, end) intervals."""

    start: np.ndarray
    end: np.ndarray

    @classmethod
    def union(cls, start: np.ndarray, end: np.ndarray) -> Intervals:
        start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
        keep = end > start
        start, end = start[keep], end[keep]
        if start.size == 0:
            return cls(np.empty(0, np.int64), np.empty(0, np.int64))
        order = np.argsort(start, kind="stable")
        s, e = start[order], end[order]
        reach = np.maximum.accumulate(e)
        first = np.flatnonzero(np.r_[True, s[1:] > reach[:-1]])
        return cls(s[first], np.maximum.reduceat(e, first))

    def clip(self, lo: int, hi: int) -> Intervals:
        return Intervals.union(np.clip(self.start, lo, hi), np.clip(self.end, lo, hi))

    def length(self) -> int:
        return int((self.end - self.start).sum())

    def intersect(self, other: Intervals) -> Intervals:
        """The intersection of two disjoint sorted sets (a sweep over both)."""
        starts, ends = [], []
        i = j = 0
        while i < self.start.size and j < other.start.size:
            lo = max(self.start[i], other.start[j])
            hi = min(self.end[i], other.end[j])
            if lo < hi:
                starts.append(lo)
                ends.append(hi)
            if self.end[i] < other.end[j]:
                i += 1
            else:
                j += 1
        return Intervals(np.array(starts, np.int64), np.array(ends, np.int64))


@dataclass
class Collectives:
    """Each collective of one rank: op, message bytes (-1 unknown), start, end (ns)."""

    op: list[str]
    nbytes: np.ndarray
    start: np.ndarray
    end: np.ndarray


@dataclass
class RankTimeline:
    """One rank's capture reduced to what the cross-rank analysis needs."""

    source: str  # "kernels" (GPU) or "nvtx" (CPU ranges)
    steps: np.ndarray  # (n, 2) host windows of the profiled steps
    compute: Intervals
    comm: Intervals
    collectives: Collectives


def display_name(name: str | None) -> str:
    """An NVTX name without nsys' domain prefix of the default domain (``:name``)."""
    if not name:
        return ""
    return name[1:] if name.startswith(":") else name


def nccl_op(kernel: str | None) -> str:
    lowered = re.sub(r"[^a-z]", "", (kernel or "").lower())
    return next((op for key, op in NCCL_OPS if key in lowered), "other")


def _ranges(ex: Export) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(names, start, end, start thread, push/pop flag) of every NVTX range with an end."""
    nv = ex.nvtx()
    if nv is None:
        empty = np.empty(0, np.int64)
        return [], empty, empty, empty, np.empty(0, bool)
    names = [display_name(nv.names[c]) for c in nv.name_code.tolist()]
    ended = nv.end >= nv.start  # NULL ends read as a negative sentinel
    pushpop = np.isin(nv.event_type, NVTX_PUSHPOP_TYPES)
    keep = np.flatnonzero(ended)
    return ([names[i] for i in keep], nv.start[keep], nv.end[keep], nv.global_tid[keep],
            pushpop[keep])


def _comm_ranges(names: list[str]) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Indexes, ops and bytes of the ``comm <op> <bytes>B`` ranges."""
    idx, ops, sizes = [], [], []
    for i, name in enumerate(names):
        match = COMM_RANGE.match(name)
        if match:
            idx.append(i)
            ops.append(match.group(1))
            sizes.append(int(match.group(2)))
    return np.array(idx, np.int64), ops, np.array(sizes, np.int64)


def rank_timeline(ex: Export, buckets: list[int] | None = None) -> RankTimeline:
    """The steps, compute, communication and collectives of one rank's export. ``buckets``
    (the record's DDP gradient buckets, in reduction order): the message sizes of a GPU
    capture's all-reduce kernels where it has no comm ranges (DDP on NCCL)."""
    names, start, end, tid, pushpop = _ranges(ex)
    is_step = np.array([n == STEP_RANGE for n in names], bool) & pushpop
    order = np.argsort(start[is_step], kind="stable")
    steps = np.stack([start[is_step][order], end[is_step][order]], axis=1) if is_step.any() \
        else np.empty((0, 2), np.int64)
    comm_idx, comm_ops, comm_bytes = _comm_ranges(names)
    kernels = ex.kernels()
    if kernels["start"].size:
        tl = _gpu_timeline(ex, steps, start, end, tid, comm_idx, comm_ops, comm_bytes)
        if buckets and not comm_idx.size:
            bucket_sizes(tl, buckets)
        return tl
    compute = np.array([n.startswith(COMPUTE_RANGE_PREFIX) for n in names], bool)
    collectives = Collectives(comm_ops, comm_bytes, start[comm_idx], end[comm_idx])
    return RankTimeline(
        source="nvtx", steps=steps,
        compute=Intervals.union(start[compute], end[compute]),
        comm=Intervals.union(collectives.start, collectives.end),
        collectives=collectives,
    )


def _gpu_timeline(ex: Export, steps: np.ndarray, start: np.ndarray, end: np.ndarray,
                  tid: np.ndarray, comm_idx: np.ndarray, comm_ops: list[str],
                  comm_bytes: np.ndarray) -> RankTimeline:
    k, mc, ms = ex.kernels(), ex.memcpy(), ex.memset()
    codes, knames = Context(ex).kernel_names()
    is_comm_name = np.array([categorize(n) == "Communication" for n in knames], bool)
    is_comm = is_comm_name[codes] if codes.size else np.zeros(0, bool)
    other_start = np.concatenate([k["start"][~is_comm], mc["start"], ms["start"]])
    other_end = np.concatenate([k["end"][~is_comm], mc["end"], ms["end"]])
    comm_k = np.flatnonzero(is_comm)
    ops = [nccl_op(knames[c]) for c in codes[comm_k].tolist()]
    nbytes = np.full(comm_k.size, -1, np.int64)
    if comm_k.size and comm_idx.size:
        rt = ex.runtime()
        api = match_runtime(rt["correlationId"], rt["globalTid"], k["correlationId"][comm_k],
                            k["globalPid"][comm_k])
        for j, a in enumerate(api.tolist()):
            if a < 0:
                continue
            t, thread = rt["start"][a], rt["globalTid"][a]
            # the comm range, opened on the launching thread, that contains the launch
            inside = (start[comm_idx] <= t) & (t <= end[comm_idx]) & (tid[comm_idx] == thread)
            hits = np.flatnonzero(inside)
            if hits.size:
                hit = hits[np.argmax(start[comm_idx][hits])]  # the innermost
                nbytes[j] = comm_bytes[hit]
                ops[j] = comm_ops[hit]
    collectives = Collectives(ops, nbytes, k["start"][comm_k], k["end"][comm_k])
    return RankTimeline(
        source="kernels", steps=steps,
        compute=Intervals.union(other_start, other_end),
        comm=Intervals.union(collectives.start, collectives.end),
        collectives=collectives,
    )


def bucket_sizes(tl: RankTimeline, buckets: list[int]) -> None:
    """Give each step's all-reduce kernels the DDP buckets' sizes in order: DDP starts bucket
    i's all-reduce only after bucket i-1's, on one NCCL stream. A step whose count of
    all-reduces differs from the buckets' keeps its sizes unknown (-1)."""
    c = tl.collectives
    reduces = np.array([op == "all_reduce" for op in c.op], bool)
    for lo, hi in tl.steps.tolist():
        inside = np.flatnonzero(reduces & (lo <= c.start) & (c.start < hi))
        if inside.size == len(buckets):
            c.nbytes[inside[np.argsort(c.start[inside], kind="stable")]] = buckets


def first_collective_ms(c: Collectives, lo: int, hi: int) -> float | None:
    """The duration (ms) of the first collective that starts in [lo, hi), None without one."""
    inside = np.flatnonzero((lo <= c.start) & (c.start < hi))
    if not inside.size:
        return None
    first = inside[np.argmin(c.start[inside])]
    return (int(c.end[first]) - int(c.start[first])) / 1e6


def step_breakdown(tl: RankTimeline) -> list[dict[str, float | int | None]]:
    """Per step: compute, communication, exposed communication, overlap and idle (ms), and
    the first collective's duration."""
    rows = []
    for i, (lo, hi) in enumerate(tl.steps.tolist()):
        compute, comm = tl.compute.clip(lo, hi), tl.comm.clip(lo, hi)
        both = compute.intersect(comm).length()
        c, m = compute.length(), comm.length()
        rows.append({
            "step": i, "start_ns": lo, "end_ns": hi, "step_ms": (hi - lo) / 1e6,
            "compute_ms": c / 1e6, "comm_ms": m / 1e6, "exposed_comm_ms": (m - both) / 1e6,
            "overlap": both / m if m else None,
            "idle_ms": (hi - lo - (c + m - both)) / 1e6,
            "first_comm_ms": first_collective_ms(tl.collectives, lo, hi),
        })  # fmt: skip
    return rows


def collective_rows(tl: RankTimeline) -> list[dict[str, object]]:
    """Each collective inside a measured step: op, bytes, duration (us), step index."""
    rows = []
    c = tl.collectives
    for j in range(len(c.op)):
        inside = np.flatnonzero((tl.steps[:, 0] <= c.start[j]) & (c.start[j] < tl.steps[:, 1]))
        if inside.size:
            rows.append({"op": c.op[j], "bytes": int(c.nbytes[j]),
                         "time_us": (int(c.end[j]) - int(c.start[j])) / 1e3,
                         "step": int(inside[0])})
    return rows


__all__ = ["Intervals", "RankTimeline", "bucket_sizes", "collective_rows", "first_collective_ms",
           "rank_timeline", "step_breakdown"]
