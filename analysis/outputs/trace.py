"""A Perfetto trace of a capture's measured steps (``python -m analysis trace``).

    python -m analysis trace RUN/profile.sqlite -o RUN/trace [--steps median|all|N|A-B]
    python -m analysis trace RUN/profile.rank0.sqlite RUN/profile.rank1.sqlite -o RUN/trace

writes ``trace.perfetto-trace.gz`` (open it in https://ui.perfetto.dev) and
``timeline.png`` (analysis/outputs/timeline.py), from the window and events of
analysis/outputs/traceevents.py:

* one Perfetto process per captured process (per rank in a distributed run: ``rank N ·
  python``), all on one clock;
* per GPU stream one track: kernels, memcpys and memsets, each with its category (also
  the slice's category), phase, layer, sublayer, module, grid, block, CUDA graph node,
  correlation id (kernels) or bytes (copies) as arguments;
* per host thread its thread track: NVTX ranges and, nested inside them, its CUDA API
  calls; a flow arrow from each launch call to the ops it launched (for a graph launch,
  through its node kernels in order). Ranges that do not nest on one track (start/end
  ranges, clock ties) go to extra tracks of the process.

The file is Perfetto's protobuf trace format (TracePacket / TrackEvent, interned names,
one packet sequence) written column by column with numpy (analysis/outputs/protowire.py):
the export of a capture with ~0.5 M kernels has to stay within seconds, which per-message
protobuf objects do not. tests/test_trace.py parses it back with Perfetto's own proto
definitions and loads it into Perfetto's trace processor.
"""

from __future__ import annotations

import sys
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analysis.metrics.categories import CATEGORIES
from analysis.metrics.extras import RunInputs
from analysis.metrics.gpuops import KERNEL
from analysis.metrics.phases import PHASES
from analysis.outputs import protowire as pw
from analysis.outputs.traceevents import (
    DEFAULT_STEPS,
    RankEvents,
    StepsError,
    pid_of,
    read_ranks,
    tid_of,
)

TRACE_FILE = "trace.perfetto-trace.gz"
SEQUENCE = 1  # every packet on one trusted sequence: its interned strings are shared
_CLEARED, _NEEDS_STATE = 1, 2  # TracePacket.SequenceFlags
_BEGIN, _END = 1, 2  # TrackEvent.Type
_EXPLICIT = 3  # TrackDescriptor.ChildTracksOrdering
_GZIP_LEVEL = 3
_CHUNK = 200_000  # events encoded at once (bounds the encoder's index arrays)
API_CATEGORY, NVTX_CATEGORY = "cuda_api", "nvtx"

# TracePacket / TrackEvent / TrackDescriptor field numbers (perfetto/protos/perfetto/trace/)
_P_TIMESTAMP, _P_SEQ_ID, _P_TRACK_EVENT, _P_INTERNED, _P_FLAGS, _P_TRACK = 8, 10, 11, 12, 13, 60
_E_CATEGORY_IIDS, _E_ANNOTATION, _E_TYPE, _E_NAME_IID, _E_TRACK, _E_FLOW = 3, 4, 9, 10, 11, 47
_A_NAME_IID, _A_INT, _A_STRING_IID = 1, 4, 17
_I_CATEGORIES, _I_NAMES, _I_ARG_NAMES, _I_ARG_STRINGS = 1, 2, 3, 29
_T_UUID, _T_NAME, _T_PROCESS, _T_THREAD, _T_PARENT, _T_ORDERING, _T_RANK = 1, 2, 3, 4, 5, 11, 12
_PROC_PID, _PROC_NAME, _THREAD_PID, _THREAD_TID, _THREAD_NAME = 1, 6, 1, 2, 5

# the arguments of a GPU op, in the order the UI lists them
ARGS = ("category", "phase", "layer", "sublayer", "module", "grid", "block", "graph node",
        "correlation id", "bytes")


# -- interning ------------------------------------------------------------------------------
class _Interned:
    """Strings of one interned table: value -> iid (iids start at 1)."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._iid: dict[str, int] = {}

    def iid(self, value: str) -> int:
        found = self._iid.get(value)
        if found is None:
            self.values.append(value)
            found = self._iid[value] = len(self.values)
        return found

    def iids(self, values: list[str]) -> np.ndarray:
        return np.array([self.iid(v) for v in values], np.int64)


def _field(number: int, payload: bytes) -> bytes:
    return pw.tag(number, pw.LENGTH) + pw.varint_bytes(len(payload)) + payload


def _uint(number: int, value: int) -> bytes:
    return pw.tag(number, pw.VARINT) + pw.varint_bytes(value)


def _entries(number: int, values: list[str], value_field: int = 2) -> bytes:
    """Interned entries ``{iid, name}`` as repeated field ``number``."""
    return b"".join(_field(number, _uint(1, i + 1) + _field(value_field, v.encode()))
                    for i, v in enumerate(values))


# -- tracks and slices ----------------------------------------------------------------------
@dataclass
class _Slices:
    """Slices of the trace, one array per column (appended per rank and kind)."""

    start: list[np.ndarray] = field(default_factory=list)
    end: list[np.ndarray] = field(default_factory=list)
    track: list[np.ndarray] = field(default_factory=list)
    name: list[np.ndarray] = field(default_factory=list)  # event name iid
    category: list[np.ndarray] = field(default_factory=list)  # category iid
    flow: list[np.ndarray] = field(default_factory=list)  # flow id, 0: none
    args: list[np.ndarray] = field(default_factory=list)  # (n, len(ARGS)) value, -1: absent

    def add(self, start: np.ndarray, end: np.ndarray, track: np.ndarray, name: np.ndarray,
            category: np.ndarray, flow: np.ndarray, args: np.ndarray | None = None) -> None:
        n = start.size
        self.start.append(start.astype(np.int64))
        self.end.append(end.astype(np.int64))
        self.track.append(np.broadcast_to(track, n).astype(np.int64))
        self.name.append(name.astype(np.int64))
        self.category.append(np.broadcast_to(category, n).astype(np.int64))
        self.flow.append(flow.astype(np.uint64))
        self.args.append(args if args is not None else np.full((n, len(ARGS)), -1, np.int64))

    def joined(self) -> dict[str, np.ndarray]:
        if not self.start:
            empty = np.empty(0, np.int64)
            return {"start": empty, "end": empty, "track": empty, "name": empty,
                    "category": empty, "flow": empty.astype(np.uint64),
                    "args": np.empty((0, len(ARGS)), np.int64)}
        return {k: np.concatenate(getattr(self, k)) for k in
                ("start", "end", "track", "name", "category", "flow", "args")}


@dataclass
class _Builder:
    names: _Interned = field(default_factory=_Interned)
    categories: _Interned = field(default_factory=_Interned)
    arg_names: _Interned = field(default_factory=_Interned)
    arg_strings: _Interned = field(default_factory=_Interned)
    tracks: list[bytes] = field(default_factory=list)  # TrackDescriptor payloads
    slices: _Slices = field(default_factory=_Slices)
    next_uuid: int = 1
    pids: set[int] = field(default_factory=set)

    def track(self, name: str | None = None, parent: int | None = None, rank: int = 0,
              extra: bytes = b"") -> int:
        uuid = self.next_uuid
        self.next_uuid += 1
        body = _uint(_T_UUID, uuid) + extra
        if name is not None:
            body += _field(_T_NAME, name.encode())
        if parent is not None:
            body += _uint(_T_PARENT, parent) + _uint(_T_RANK, rank)
        self.tracks.append(body)
        return uuid

    def process(self, pid: int, name: str) -> tuple[int, int]:
        """A process track (its pid made unique across ranks); (uuid, pid)."""
        while pid in self.pids:
            pid += 1_000_000
        self.pids.add(pid)
        desc = _uint(_PROC_PID, pid) + _field(_PROC_NAME, name.encode())
        return self.track(extra=_field(_T_PROCESS, desc) + _uint(_T_ORDERING, _EXPLICIT)), pid

    def thread(self, parent: int, pid: int, tid: int, name: str, rank: int) -> int:
        desc = (_uint(_THREAD_PID, pid) + _uint(_THREAD_TID, tid)
                + _field(_THREAD_NAME, name.encode()))
        return self.track(parent=parent, rank=rank, extra=_field(_T_THREAD, desc))


# -- lanes: slices of one track must nest ----------------------------------------------------
def nesting_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per interval, a lane in which the intervals nest (or follow one another); the first
    lane that takes it (greedy, in start order, longest first)."""
    lane = np.zeros(start.size, np.int64)
    stacks: list[list[int]] = []
    for i in np.lexsort((-end, start)).tolist():
        s, e = int(start[i]), int(end[i])
        for li, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                lane[i] = li
                break
        else:
            stacks.append([e])
            lane[i] = len(stacks) - 1
    return lane


def sequential_lanes(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per interval, a lane in which no two intervals overlap (one lane when none do)."""
    order = np.lexsort((end, start))
    s, e = start[order], end[order]
    if s.size < 2 or (s[1:] >= np.maximum.accumulate(e)[:-1]).all():
        return np.zeros(start.size, np.int64)
    lane = np.zeros(start.size, np.int64)
    ends: list[int] = []
    for i, (si, ei) in zip(order.tolist(), zip(s.tolist(), e.tolist(), strict=True),
                           strict=True):
        li = next((k for k, last in enumerate(ends) if last <= si), len(ends))
        if li == len(ends):
            ends.append(ei)
        else:
            ends[li] = ei
        lane[i] = li
    return lane


def _inside_count(bounds: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """How many of the sorted ``bounds`` lie strictly inside each (start, end)."""
    return np.searchsorted(bounds, end, "left") - np.searchsorted(bounds, start, "right")


# -- one rank -------------------------------------------------------------------------------
def _flow_ids(rank_index: int, global_id: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """A flow id per (rank, process, correlationId): rank + 1, pid and correlationId in
    8, 24 and 32 bits (never 0)."""
    pid = (global_id.astype(np.uint64) >> np.uint64(24)) & np.uint64(0xFFFFFF)
    return ((np.uint64(rank_index + 1) << np.uint64(56)) | (pid << np.uint64(32))
            | (corr.astype(np.uint64) & np.uint64(0xFFFFFFFF)))


def _gpu_args(b: _Builder, r: RankEvents) -> np.ndarray:
    g = r.gpu
    labels = b.arg_strings.iids(g.labels)
    labels[0] = -1  # the empty label: no argument
    categories = b.arg_strings.iids(list(CATEGORIES))
    phases = b.arg_strings.iids(list(PHASES))
    args = np.full((g.size, len(ARGS)), -1, np.int64)
    args[:, 0] = categories[g.category]
    args[:, 1] = np.where(g.phase >= 0, phases[np.maximum(g.phase, 0)], -1)
    for col, values in ((2, g.layer), (3, g.sublayer), (4, g.module), (5, g.grid),
                        (6, g.block)):
        args[:, col] = labels[values]
    args[:, 7] = np.where(g.graph_node >= 0, g.graph_node, -1)
    kernel = g.kind == KERNEL
    args[:, 8] = np.where(kernel, g.corr, -1)
    args[:, 9] = np.where(kernel, -1, g.nbytes)
    return args


def _add_rank(b: _Builder, r: RankEvents, index: int, distributed: bool) -> None:
    g, api, nv = r.gpu, r.api, r.nvtx
    threads = np.r_[api.tid, nv.tid].astype(np.int64)
    pids = sorted(set(g.pid.tolist()) | set((threads & ~0xFFFFFF).tolist()))
    shift = r.offset_ns
    flows_gpu = _flow_ids(index, g.pid, g.corr)
    flows_api = _flow_ids(index, api.tid, api.corr)
    gpu_names = b.names.iids(g.names)
    args = _gpu_args(b, r)
    op_category = b.categories.iids(list(CATEGORIES))[g.category]
    api_names = b.names.iids(api.names)
    nvtx_names = b.names.iids(nv.names)
    for gpid in pids:
        pid = pid_of(gpid)
        label = Path(r.processes.get(pid, "process")).name
        # the UI adds the pid to the name
        name = f"rank {r.rank} · {label}" if distributed else label
        proc, shown_pid = b.process(pid, name)
        order = 0
        mine = np.flatnonzero((g.pid & ~0xFFFFFF) == gpid)
        for dev, stream in sorted(set(zip(g.device[mine].tolist(), g.stream[mine].tolist(),
                                          strict=True))):
            ops = mine[(g.device[mine] == dev) & (g.stream[mine] == stream)]
            lanes = sequential_lanes(g.start[ops], g.end[ops])
            for lane in range(int(lanes.max()) + 1):
                suffix = f" ({lane + 1})" if lane else ""
                track = b.track(f"GPU {dev} stream {stream}{suffix}", proc, order)
                order += 1
                sel = ops[lanes == lane]
                b.slices.add(g.start[sel] + shift, g.end[sel] + shift, track,
                             gpu_names[g.name[sel]], op_category[sel], flows_gpu[sel], args[sel])
        tids = sorted(set(threads[(threads & ~0xFFFFFF) == gpid].tolist()))
        for gtid in tids:
            order = _add_thread(b, r, gtid, proc, shown_pid, order, api_names, nvtx_names,
                                flows_api)


def _add_thread(b: _Builder, r: RankEvents, gtid: int, proc: int, pid: int, order: int,
                api_names: np.ndarray, nvtx_names: np.ndarray, flows_api: np.ndarray) -> int:
    """The thread's track: NVTX ranges with its CUDA API calls nested inside; what does not
    nest goes to extra tracks."""
    api, nv, shift = r.api, r.nvtx, r.offset_ns
    tid = tid_of(gtid)
    tname = r.threads.get(gtid, "thread")
    ranges = np.flatnonzero(nv.tid == gtid)
    lanes = nesting_lanes(nv.start[ranges], nv.end[ranges])
    calls = np.flatnonzero(api.tid == gtid)
    top = ranges[lanes == 0]
    bounds = np.sort(np.r_[nv.start[top], nv.end[top]])
    clash = _inside_count(bounds, api.start[calls], api.end[calls]) > 0
    api_lanes = np.where(clash, 1, 0)
    fits = calls[~clash]
    if sequential_lanes(api.start[fits], api.end[fits]).max(initial=0) > 0:
        api_lanes[:] = 1  # overlapping calls (clock ties): all of them on their own tracks
    nvtx_cat, api_cat = b.categories.iid(NVTX_CATEGORY), b.categories.iid(API_CATEGORY)
    main = b.thread(proc, pid, tid, tname, order)
    order += 1
    tracks = {0: main}
    for lane in range(1, int(lanes.max(initial=0)) + 1):
        tracks[lane] = b.track(f"{tname} {tid} ranges ({lane + 1})", proc, order)
        order += 1
    for lane, track in tracks.items():
        sel = ranges[lanes == lane]
        b.slices.add(nv.start[sel] + shift, nv.end[sel] + shift, track, nvtx_names[nv.name[sel]],
                     nvtx_cat, np.zeros(sel.size, np.uint64))
    own = calls[api_lanes == 0]
    b.slices.add(api.start[own] + shift, api.end[own] + shift, main, api_names[api.name[own]],
                 api_cat, np.where(api.launches[own], flows_api[own], 0))
    apart = calls[api_lanes == 1]
    if apart.size:
        sub = sequential_lanes(api.start[apart], api.end[apart])
        for lane in range(int(sub.max()) + 1):
            track = b.track(f"{tname} {tid} CUDA API ({lane + 1})", proc, order)
            order += 1
            sel = apart[sub == lane]
            b.slices.add(api.start[sel] + shift, api.end[sel] + shift, track,
                         api_names[api.name[sel]], api_cat,
                         np.where(api.launches[sel], flows_api[sel], 0))
    return order


# -- encoding -------------------------------------------------------------------------------
def _header(b: _Builder) -> bytes:
    """Track descriptors, then the sequence's interned strings."""
    out = b"".join(_field(1, _field(_P_TRACK, body)) for body in b.tracks)
    interned = (_entries(_I_CATEGORIES, b.categories.values)
                + _entries(_I_NAMES, b.names.values)
                + _entries(_I_ARG_NAMES, b.arg_names.values)
                + _entries(_I_ARG_STRINGS, b.arg_strings.values))
    packet = (_uint(_P_SEQ_ID, SEQUENCE) + _uint(_P_FLAGS, _CLEARED)
              + _field(_P_INTERNED, interned))
    return out + _field(1, packet)


def _annotations(b: _Builder, args: np.ndarray) -> list[pw.Field]:
    fields = []
    for col, name in enumerate(ARGS):
        present = args[:, col] >= 0
        if not present.any():
            continue
        value_field = _A_STRING_IID if col <= 6 else _A_INT
        fields.append(pw.message(_E_ANNOTATION, [pw.varint(_A_NAME_IID, b.arg_names.iid(name)),
                                                 pw.varint(value_field, args[:, col])],
                                 present))
    return fields


def _begin_packets(b: _Builder, ts: np.ndarray, s: dict[str, np.ndarray]) -> pw.Field:
    event = [
        pw.varint(_E_CATEGORY_IIDS, s["category"]),
        *_annotations(b, s["args"]),
        pw.varint(_E_TYPE, _BEGIN),
        pw.varint(_E_NAME_IID, s["name"]),
        pw.varint(_E_TRACK, s["track"]),
        pw.fixed64(_E_FLOW, s["flow"], s["flow"] != 0),
    ]
    return pw.message(1, [pw.varint(_P_TIMESTAMP, ts), pw.varint(_P_SEQ_ID, SEQUENCE),
                          pw.message(_P_TRACK_EVENT, event), pw.varint(_P_FLAGS, _NEEDS_STATE)])


def _end_packets(ts: np.ndarray, track: np.ndarray) -> pw.Field:
    event = [pw.varint(_E_TYPE, _END), pw.varint(_E_TRACK, track)]
    return pw.message(1, [pw.varint(_P_TIMESTAMP, ts), pw.varint(_P_SEQ_ID, SEQUENCE),
                          pw.message(_P_TRACK_EVENT, event)])


def event_order(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slice, is_begin) of every begin and end event in the order a track must see them:
    by time; at one time, ends of slices that began earlier, then begins (outer first),
    then ends of empty slices; ends inner first."""
    n = start.size
    rank = np.empty(n, np.int64)
    rank[np.lexsort((np.arange(n), -end, start))] = np.arange(n)
    ts = np.r_[start, end]
    sub = np.r_[np.ones(n, np.int64), np.where(end > start, 0, 2)]
    key = np.r_[rank, -rank]
    order = np.lexsort((key, sub, ts))
    return order % n, order < n


def encode_slices(b: _Builder, write) -> int:
    """Every slice as a begin and an end packet (Trace.packet), in event order, through
    ``write``; the number of slices."""
    s = b.slices.joined()
    slice_of, is_begin = event_order(s["start"], s["end"])
    for lo in range(0, slice_of.size, _CHUNK):
        idx, begin = slice_of[lo:lo + _CHUNK], is_begin[lo:lo + _CHUNK]
        bi, ei = idx[begin], idx[~begin]
        chunk = {k: v[bi] for k, v in s.items()}
        write(pw.encode([(np.flatnonzero(begin), _begin_packets(b, s["start"][bi], chunk)),
                         (np.flatnonzero(~begin), _end_packets(s["end"][ei], s["track"][ei]))],
                        idx.size))
    return int(s["start"].size)


class _GzipWriter:
    """Gzip in a second thread (zlib releases the GIL) while the next chunk is encoded."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "wb")  # noqa: SIM115 (closed in close())
        self._zip = zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31)
        self._pending: threading.Thread | None = None

    def write(self, data: bytes) -> None:
        self._wait()
        self._pending = threading.Thread(target=self._compress, args=(data,))
        self._pending.start()

    def _compress(self, data: bytes) -> None:
        self._file.write(self._zip.compress(data))

    def _wait(self) -> None:
        if self._pending is not None:
            self._pending.join()
            self._pending = None

    def close(self) -> None:
        self._wait()
        self._file.write(self._zip.flush())
        self._file.close()


@dataclass
class TraceSummary:
    path: Path
    slices: int
    gpu_ops: int
    ranks: int
    window_ns: list[tuple[int, int]]


def write_trace(ranks: list[RankEvents], path: Path) -> TraceSummary:
    """The Perfetto trace of the ranks' windows, gzipped, at ``path``."""
    b = _Builder()
    for name in ARGS:  # interned before the header is written
        b.arg_names.iid(name)
    distributed = len(ranks) > 1 or any(r.rank is not None for r in ranks)
    for i, r in enumerate(sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0))):
        _add_rank(b, r, i, distributed)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = _GzipWriter(path)
    try:
        out.write(_header(b))
        slices = encode_slices(b, out.write)
    finally:
        out.close()
    return TraceSummary(path, slices, sum(r.gpu.size for r in ranks), len(ranks),
                        [(r.window.start + r.offset_ns, r.window.end + r.offset_ns)
                         for r in ranks])


TIMELINE_FILE = "timeline.png"


def write_run_trace(exports: list[Path], outdir: Path, steps: str = DEFAULT_STEPS,
                    run: RunInputs | None = None, name: str = "") -> TraceSummary:
    """``trace.perfetto-trace.gz`` and ``timeline.png`` of one run's captures in
    ``outdir``; a run whose record says it failed gets an empty trace and a labelled
    placeholder figure."""
    from analysis.outputs.style import empty_figure
    from analysis.outputs.timeline import draw_timeline

    run = run or RunInputs()
    outdir.mkdir(parents=True, exist_ok=True)
    status = str(run.record.get("status", "ok"))
    if status != "ok":
        empty_figure(outdir / TIMELINE_FILE, "Timeline", f"the run did not finish ({status})")
        return write_trace([], outdir / TRACE_FILE)
    if not exports:
        return _without_captures(outdir)
    ranks = read_ranks(exports, steps, run)
    summary = write_trace(ranks, outdir / TRACE_FILE)
    draw_timeline(ranks, outdir / TIMELINE_FILE, name)
    return summary


def _without_captures(outdir: Path) -> TraceSummary:
    """No capture to read (gone since the run was analysed): the trace and figure made from
    it earlier are kept (touched: newer than the run's record), else placeholders."""
    from analysis.outputs.style import empty_figure

    made = [outdir / TRACE_FILE, outdir / TIMELINE_FILE]
    if all(p.is_file() for p in made):
        for p in made:
            p.touch()
        return TraceSummary(made[0], 0, 0, 0, [])
    empty_figure(outdir / TIMELINE_FILE, "Timeline", "the capture was not kept")
    return write_trace([], outdir / TRACE_FILE)


def run(args) -> int:  # argparse.Namespace of ``python -m analysis trace``
    """``python -m analysis trace``: the trace and the timeline of one run."""
    name = args.name
    if name is None:
        name = args.exports[0].resolve().parent.name if args.exports else ""
    try:
        summary = write_run_trace(args.exports, args.output, args.steps,
                                  RunInputs.load(args.record, args.torch_trace), name)
    except StepsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.exports:
        print(f"no capture to read: {args.output} keeps the trace made from it, if any")
        return 0
    size = summary.path.stat().st_size / 1e6
    print(f"wrote {summary.path} ({summary.gpu_ops} GPU ops, {summary.slices} slices, "
          f"{size:.2f} MB): open it in https://ui.perfetto.dev")
    return 0
