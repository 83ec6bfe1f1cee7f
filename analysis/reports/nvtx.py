"""NVTX ranges projected onto CUDA API calls, the way nsys' NVTX reports join them.

nsys (nvtx_kern_sum, nvtx_gpu_proj_sum) associates a GPU operation with every NVTX range
that (a) started and ended on the thread that made the launching CUDA API call
(``endGlobalTid IS NULL``, same ``globalTid``) and (b) encloses the API call:
``range.start <= api.start AND range.end >= api.end``.  A range without an end is
extended to the last NVTX timestamp.  The SQL does this with an R-tree join; here the
same pairs are enumerated with sorted searches, per thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.reading.export import NULL, NVTX_PUSHPOP_TYPES, Export, NvtxEvents

PID_MASK = np.int64(-16777216)  # 0xFFFFFFFFFF000000 as int64: VM id + process id bits


@dataclass
class ProjRanges:
    """NVTX ranges eligible for projection (same-thread ranges), as nsys' NVTX_EVENTS_RIDX."""

    range_id: np.ndarray  # NVTX_EVENTS rowid
    start: np.ndarray
    end: np.ndarray
    tid: np.ndarray  # globalTid
    name_code: np.ndarray
    names: list[str | None]
    style: list[str]  # per range: 'PushPop' / 'StartEnd'


def style_of(event_type: np.ndarray) -> list[str]:
    push = np.isin(event_type, NVTX_PUSHPOP_TYPES)
    return ["PushPop" if p else "StartEnd" for p in push.tolist()]


def projection_ranges(nv: NvtxEvents) -> ProjRanges:
    keep = nv.end_global_tid == NULL
    idx = np.flatnonzero(keep)
    end = nv.end[idx].copy()
    if nv.range_max_ts is not None:
        end[end == NULL] = nv.range_max_ts
    return ProjRanges(
        range_id=nv.rowid[idx],
        start=nv.start[idx],
        end=end,
        tid=nv.global_tid[idx],
        name_code=nv.name_code[idx],
        names=nv.names,
        style=style_of(nv.event_type[idx]),
    )


def enclosing_pairs(
    r_start: np.ndarray,
    r_end: np.ndarray,
    r_tid: np.ndarray,
    q_start: np.ndarray,
    q_end: np.ndarray,
    q_tid: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """All (range, query) index pairs with the same tid and range enclosing the query."""
    out_r: list[np.ndarray] = []
    out_q: list[np.ndarray] = []
    if r_start.size == 0 or q_start.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    r_order = np.argsort(r_tid, kind="stable")
    q_order = np.argsort(q_tid, kind="stable")
    r_t = r_tid[r_order]
    q_t = q_tid[q_order]
    tids = np.intersect1d(r_t, q_t)
    for tid in tids.tolist():
        ri = r_order[np.searchsorted(r_t, tid, "left") : np.searchsorted(r_t, tid, "right")]
        qi = q_order[np.searchsorted(q_t, tid, "left") : np.searchsorted(q_t, tid, "right")]
        qs_order = np.argsort(q_start[qi], kind="stable")
        qi = qi[qs_order]
        qs = q_start[qi]
        # queries whose start lies in [range.start, range.end]; then filter on the end
        lo = np.searchsorted(qs, r_start[ri], "left")
        hi = np.searchsorted(qs, r_end[ri], "right")
        lens = np.maximum(hi - lo, 0)
        total = int(lens.sum())
        if total == 0:
            continue
        rep_r = np.repeat(ri, lens)
        offsets = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens) + np.repeat(lo, lens)
        rep_q = qi[offsets]
        keep = r_end[rep_r] >= q_end[rep_q]
        out_r.append(rep_r[keep])
        out_q.append(rep_q[keep])
    if not out_r:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(out_r), np.concatenate(out_q)


def few_unique(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values of an array with few distinct values (threads, processes).

    Checks a strided sample first: when it already holds every value (verified with one
    searchsorted pass), the full hash-based unique is skipped.
    """
    if values.size == 0:
        return values
    cand = np.unique(values[:: max(1, values.size // 4096)])
    pos = np.minimum(np.searchsorted(cand, values), cand.size - 1)
    if np.array_equal(cand[pos], values):
        return cand
    return np.unique(np.unique_values(values))


def thread_codes(gtid: np.ndarray) -> np.ndarray:
    """Dense codes (in value order) for globalTid-like keys."""
    return np.searchsorted(few_unique(gtid), gtid)


def match_runtime(
    rt_corr: np.ndarray, rt_gtid: np.ndarray, corr: np.ndarray, gpid: np.ndarray
) -> np.ndarray:
    """Index of the CUDA API row launching each GPU op (-1 when none).

    Join condition of the nsys reports: same correlationId and
    ``op.globalPid == api.globalTid & 0xFFFFFFFFFF000000``.
    """
    if corr.size == 0 or rt_corr.size == 0:
        return np.full(corr.size, -1, np.int64)
    rt_pid = rt_gtid & PID_MASK
    pids = np.union1d(few_unique(rt_pid), few_unique(gpid))
    if len(pids) == 1:  # one process (the usual case): codes are all 0
        rt_code = np.zeros(rt_corr.size, np.int64)
        op_code = np.zeros(corr.size, np.int64)
    else:
        rt_code = np.searchsorted(pids, rt_pid)
        op_code = np.searchsorted(pids, gpid)
    lo = int(min(rt_corr.min(), corr.min()))
    hi = int(max(rt_corr.max(), corr.max()))
    span = hi - lo + 1
    if lo >= 0 and span * len(pids) <= max(8 * (rt_corr.size + corr.size), 1 << 22):
        # direct lookup table keyed by (process, correlationId): no sort needed
        lut = np.full(span * len(pids), -1, np.int64)
        rows = np.arange(rt_corr.size)
        lut[(rt_code * span + rt_corr - lo)[::-1]] = rows[::-1]  # first row wins
        return lut[op_code * span + corr - lo]
    shift = max(hi.bit_length(), 1)
    if shift + max(len(pids), 1).bit_length() >= 63 or lo < 0:
        return _match_slow(rt_corr, rt_code, corr, op_code)
    rt_key = (rt_code.astype(np.int64) << shift) | rt_corr
    op_key = (op_code.astype(np.int64) << shift) | corr
    if rt_key.size > 1 and bool((rt_key[1:] > rt_key[:-1]).all()):
        # API rows usually come in correlationId order already (one process): no sort
        order = np.arange(rt_key.size)
        sorted_keys = rt_key
    else:
        order = np.argsort(rt_key, kind="stable")
        sorted_keys = rt_key[order]
    pos = np.searchsorted(sorted_keys, op_key, "left")
    pos_c = np.minimum(pos, sorted_keys.size - 1)
    found = sorted_keys[pos_c] == op_key
    return np.where(found, order[pos_c], -1)


def _match_slow(
    rt_corr: np.ndarray, rt_code: np.ndarray, corr: np.ndarray, op_code: np.ndarray
) -> np.ndarray:
    lookup: dict[tuple[int, int], int] = {}
    for i, key in enumerate(zip(rt_code.tolist(), rt_corr.tolist(), strict=True)):
        lookup.setdefault(key, i)
    return np.array(
        [lookup.get(k, -1) for k in zip(op_code.tolist(), corr.tolist(), strict=True)], np.int64
    )


@dataclass
class OpProjection:
    """GPU operations joined to their API call and the NVTX ranges enclosing that call."""

    api_index: np.ndarray  # per op: runtime row or -1
    pair_range: np.ndarray  # per (range, op) pair: index into ProjRanges
    pair_op: np.ndarray  # per pair: op index


def project_ops(
    ex: Export, ranges: ProjRanges | None, corr: np.ndarray, gpid: np.ndarray
) -> OpProjection:
    rt = ex.runtime()
    api = match_runtime(rt["correlationId"], rt["globalTid"], corr, gpid)
    if ranges is None:
        e = np.empty(0, np.int64)
        return OpProjection(api, e, e)
    has_api = np.flatnonzero(api >= 0)
    a = api[has_api]
    pr, pq = enclosing_pairs(
        ranges.start, ranges.end, ranges.tid, rt["start"][a], rt["end"][a], rt["globalTid"][a]
    )
    return OpProjection(api, pr, has_api[pq])


def parents(ranges: ProjRanges) -> np.ndarray:
    """Parent range index (tightest enclosing range on the same thread) or -1.

    As nsys' NVTX_PARENT: minimises (child.start - parent.start) + (parent.end - child.end)
    over other ranges with parent.start <= child.start and parent.end >= child.end.
    """
    n = ranges.start.size
    parent = np.full(n, -1, np.int64)
    if n == 0:
        return parent
    pr, cq = enclosing_pairs(
        ranges.start, ranges.end, ranges.tid, ranges.start, ranges.end, ranges.tid
    )
    keep = pr != cq
    pr, cq = pr[keep], cq[keep]
    if pr.size == 0:
        return parent
    tight = (ranges.start[cq] - ranges.start[pr]) + (ranges.end[pr] - ranges.end[cq])
    order = np.lexsort((ranges.range_id[pr], tight, cq))
    cq_s = cq[order]
    first = np.r_[True, cq_s[1:] != cq_s[:-1]]
    parent[cq_s[first]] = pr[order][first]
    return parent


def levels(parent: np.ndarray) -> np.ndarray:
    """Depth below a root (root = 0); NaN for ranges not reachable from a root (cycles)."""
    n = parent.size
    level = np.full(n, np.nan)
    level[parent < 0] = 0.0
    for _ in range(n):
        todo = np.isnan(level) & (parent >= 0)
        if not todo.any():
            break
        idx = np.flatnonzero(todo)
        ready = ~np.isnan(level[parent[idx]])
        if not ready.any():
            break
        level[idx[ready]] = level[parent[idx[ready]]] + 1
    return level
