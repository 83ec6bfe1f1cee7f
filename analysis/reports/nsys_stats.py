"""The seven ``nsys stats`` summary reports, computed from arrays instead of SQL.

Each ``report_*`` function mirrors the SQL of the report script of the same name shipped
with Nsight Systems (``host-linux-x64/reports/<name>.py``): same grouping keys, joins,
statistics, rounding, column names and ORDER BY.  Where the report script would print
"SKIPPED" (required table missing) the table is empty but keeps its header.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.reading.codes import dense_codes, densify
from analysis.reading.export import KERNEL, MEMCPY, MEMSET, NULL, NVTX, RUNTIME, Export
from analysis.reports import fmt
from analysis.reports.catalogue import HEADERS, REPORTS
from analysis.reports.fmt import Table
from analysis.reports.groupstats import GroupStats, codes_for, distinct_count, group_stats
from analysis.reports.nvtx import (
    OpProjection,
    ProjRanges,
    levels,
    parents,
    project_ops,
    projection_ranges,
    style_of,
    thread_codes,
)

NEEDS_RUNTIME = {"nvtx_kern_sum", "nvtx_gpu_proj_sum", "cuda_api_sum"}


def _stat_cols(st: GroupStats, order: np.ndarray) -> list[list[str]]:
    """Avg, Med, Min, Max, StdDev columns (nsys rounds avg/med/stddev to 1 decimal)."""
    return [
        fmt.round1(st.mean[order]),
        fmt.round1(st.median[order]),
        fmt.ints(st.min[order]),
        fmt.ints(st.max[order]),
        fmt.round1(st.std[order]),
    ]


def _null_first(name: str | None) -> tuple[bool, str]:
    """SQLite ORDER BY on text: NULL first, then binary (UTF-8 byte = code point) order."""
    return (name is not None, name or "")


@dataclass
class Context:
    """Shared, lazily computed joins (one Export -> all reports + extras)."""

    ex: Export
    _ranges: ProjRanges | None = None
    _ranges_done: bool = False
    _kproj: OpProjection | None = None
    _oproj: OpProjection | None = None
    _kernel_names: tuple[np.ndarray, list[str | None]] | None = None

    def ranges(self) -> ProjRanges | None:
        if not self._ranges_done:
            nv = self.ex.nvtx()
            self._ranges = projection_ranges(nv) if nv is not None else None
            self._ranges_done = True
        return self._ranges

    def kernel_names(self) -> tuple[np.ndarray, list[str | None]]:
        if self._kernel_names is None:
            self._kernel_names = self.ex.names_for(self.ex.kernels()["name"])
        return self._kernel_names

    def ops_projection(self) -> OpProjection:
        """Projection of all GPU ops: kernels, then memcpy, then memset rows (one join)."""
        if self._oproj is None:
            ex = self.ex
            k, mc, ms = ex.kernels(), ex.memcpy(), ex.memset()
            corr = np.concatenate([k["correlationId"], mc["correlationId"], ms["correlationId"]])
            gpid = np.concatenate([k["globalPid"], mc["globalPid"], ms["globalPid"]])
            self._oproj = project_ops(ex, self.ranges(), corr, gpid)
        return self._oproj

    def kernel_projection(self) -> OpProjection:
        """The kernels' part of :meth:`ops_projection` (kernels are its first ops)."""
        if self._kproj is None:
            ops = self.ops_projection()
            n = self.ex.kernels()["start"].size
            keep = ops.pair_op < n
            self._kproj = OpProjection(ops.api_index[:n], ops.pair_range[keep], ops.pair_op[keep])
        return self._kproj


def _empty(name: str) -> Table:
    return Table(HEADERS[name])


def _requires(ex: Export, *tables: str) -> bool:
    return all(ex.has(t) for t in ("StringIds", *tables))


# -- cuda_gpu_kern_sum ------------------------------------------------------------------
def report_cuda_gpu_kern_sum(ctx: Context) -> Table:
    ex = ctx.ex
    if not _requires(ex, KERNEL):
        return _empty("cuda_gpu_kern_sum")
    ids, dur = ex.name_durations(KERNEL, "demangledName")
    codes, names = ex.names_for(ids)
    st = group_stats(codes, dur)
    gnames = [names[g] for g in st.group.tolist()]
    order = np.array(
        sorted(
            range(st.group.size),
            key=lambda i: (-int(st.total[i]), int(st.count[i]), _null_first(gnames[i])),
        ),
        dtype=np.int64,
    )
    return _summary_table("cuda_gpu_kern_sum", st, order, [fmt.text(gnames[i] for i in order)])


def _summary_table(
    name: str, st: GroupStats, order: np.ndarray, tail: list[list[str]]
) -> Table:
    grand = float(st.total.sum()) if st.total.size else 0.0
    cols = [
        fmt.percent(st.total[order], grand),
        fmt.ints(st.total[order]),
        fmt.ints(st.count[order]),
        *_stat_cols(st, order),
        *tail,
    ]
    return Table.from_columns(HEADERS[name], cols)


def _order_total_desc(st: GroupStats, labels: list[str]) -> np.ndarray:
    # nsys orders by total only; ties are unordered there, broken by label here.
    return np.array(
        sorted(range(st.group.size), key=lambda i: (-int(st.total[i]), labels[i])), np.int64
    )


# -- cuda_api_sum -----------------------------------------------------------------------
def _api_name(value: str | None) -> str | None:
    # CASE substr(value, -6, 2) WHEN '_v' THEN substr(value, 1, length(value) - 6)
    if value is not None and len(value) >= 6 and value[-6:-4] == "_v":
        return value[:-6]
    return value


def report_cuda_api_sum(ctx: Context) -> Table:
    ex = ctx.ex
    if not _requires(ex, RUNTIME):
        return _empty("cuda_api_sum")
    name_ids, dur = ex.name_durations(RUNTIME, "nameId")
    lo = int(name_ids.min()) if name_ids.size else 0
    inv, rep = densify(name_ids - lo, int(name_ids.max()) - lo + 1 if name_ids.size else 1)
    uniq = name_ids[rep]
    st = group_stats(inv, dur)
    strings = ex.strings
    labels = [_api_name(strings.get(int(uniq[g]))) for g in st.group.tolist()]
    order = _order_total_desc(st, [lb or "" for lb in labels])
    return _summary_table("cuda_api_sum", st, order, [fmt.text(labels[i] for i in order)])


# -- memory operations ------------------------------------------------------------------
def _memops(ex: Export) -> tuple[list[str], np.ndarray, np.ndarray] | None:
    """(names, durations, bytes) of memcpy + memset rows, as the mem reports build them."""
    if not (ex.has(MEMCPY) or ex.has(MEMSET)):
        return None
    if ex.has(MEMCPY) and not ex.has("ENUM_CUDA_MEMCPY_OPER"):
        return None
    names: list[str] = []
    durs: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    if ex.has(MEMCPY):
        mc = ex.memcpy()
        labels = ex.memcpy_labels()
        kinds = mc["copyKind"]
        known = np.isin(kinds, np.array(list(labels), dtype=np.int64))  # INNER JOIN
        names += [f"[CUDA memcpy {labels[c]}]" for c in kinds[known].tolist()]
        durs.append((mc["end"] - mc["start"])[known])
        sizes.append(mc["bytes"][known])
    if ex.has(MEMSET):
        ms = ex.memset()
        names += ["[CUDA memset]"] * ms["start"].size
        durs.append(ms["end"] - ms["start"])
        sizes.append(ms["bytes"])
    return names, np.concatenate(durs), np.concatenate(sizes)


def report_cuda_gpu_mem_time_sum(ctx: Context) -> Table:
    return _memop_report(ctx, "cuda_gpu_mem_time_sum")


def report_cuda_gpu_mem_size_sum(ctx: Context) -> Table:
    return _memop_report(ctx, "cuda_gpu_mem_size_sum")


def _memop_report(ctx: Context, name: str) -> Table:
    """GPU MemOps by time (durations in ns) or by size (bytes printed in MB)."""
    ops = _memops(ctx.ex)
    if ops is None:
        return _empty(name)
    labels, durs, sizes = ops
    by_size = name == "cuda_gpu_mem_size_sum"
    codes, uniq = codes_for(labels)
    st = group_stats(codes, sizes if by_size else durs)
    glabels = [str(uniq[g]) for g in st.group.tolist()]
    order = _order_total_desc(st, glabels)
    operation = [fmt.text(glabels[i] for i in order)]
    if not by_size:
        return _summary_table(name, st, order, operation)
    mb = [fmt.megabytes(v[order]) for v in (st.total, st.mean, st.median, st.min, st.max, st.std)]
    cols = [mb[0], fmt.ints(st.count[order]), *mb[1:], *operation]
    return Table.from_columns(HEADERS[name], cols)


# -- nvtx_sum ---------------------------------------------------------------------------
def report_nvtx_sum(ctx: Context) -> Table:
    ex = ctx.ex
    nv = ex.nvtx() if _requires(ex, NVTX) else None
    if nv is None or nv.start.size == 0:
        return _empty("nvtx_sum")
    end = nv.end.copy()
    end[end == NULL] = nv.max_ts if nv.max_ts is not None else 0
    styles = style_of(nv.event_type)
    name_codes, names = nv.name_code, nv.names
    style_codes = np.array([s == "StartEnd" for s in styles], np.int64)
    codes, first = dense_codes(name_codes, style_codes)
    st = group_stats(codes, end - nv.start)
    gname = [names[name_codes[first[g]]] for g in st.group.tolist()]
    gstyle = [styles[first[g]] for g in st.group.tolist()]
    order = _order_total_desc(st, [f"{n or ''}\0{s}" for n, s in zip(gname, gstyle, strict=True)])
    tail = [fmt.text(gstyle[i] for i in order), fmt.text(gname[i] for i in order)]
    return _summary_table("nvtx_sum", st, order, tail)


# -- nvtx_kern_sum ----------------------------------------------------------------------
def report_nvtx_kern_sum(ctx: Context) -> Table:
    ex = ctx.ex
    if not _requires(ex, NVTX, KERNEL, RUNTIME) or ex.nvtx() is None:
        return _empty("nvtx_kern_sum")
    ranges = ctx.ranges()
    assert ranges is not None
    k = ex.kernels()
    kcode, knames = ctx.kernel_names()
    proj = ctx.kernel_projection()
    rt = ex.runtime()
    n = k["start"].size
    # combo rows: every (range, kernel) pair plus one NULL-range row per kernel without one
    in_range = np.zeros(n, bool)
    in_range[proj.pair_op] = True
    lone = np.flatnonzero(~in_range)
    op = np.concatenate([proj.pair_op, lone])
    rng = np.concatenate([proj.pair_range, np.full(lone.size, -1, np.int64)])
    api = proj.api_index[op]
    gtid = np.where(api >= 0, rt["globalTid"][np.maximum(api, 0)], NULL)
    pid = np.where(api >= 0, (gtid >> 24) & 0xFFFFFF, -1)
    tid = np.where(api >= 0, gtid & 0xFFFFFF, -1)
    # a trailing dummy entry makes index -1 (no range) map to "NULL"
    name_code = np.r_[ranges.name_code, -1][rng]
    style_code = np.r_[[s == "StartEnd" for s in ranges.style], False][rng].astype(np.int64)
    # (pid, tid) is a function of globalTid: group on a small thread code instead
    codes, first = dense_codes(thread_codes(gtid), name_code + 1, style_code, kcode[op])
    dur = (k["end"] - k["start"])[op]
    st = group_stats(codes, dur)
    ngroups = first.size
    # count(DISTINCT nvtxid): a range fixes pid/tid/name/style, so key = (range, kernel name)
    nk = len(knames)
    has = rng >= 0
    nvtx_inst = distinct_count(
        codes[has], rng[has] * nk + kcode[op[has]], max(ranges.start.size, 1) * nk, ngroups
    )
    # count(DISTINCT kernid): a kernel fixes pid/tid/kernel name, so key = (kernel, name, style)
    nn = len(ranges.names) + 1
    kern_key = (op * nn + (name_code + 1)) * 2 + style_code
    kern_inst = distinct_count(codes, kern_key, max(n, 1) * nn * 2, ngroups)

    def gname(g: int) -> str | None:
        c = int(name_code[first[g]])
        return ranges.names[c] if c >= 0 else None

    groups = st.group.tolist()
    rows_key = []
    for i, g in enumerate(groups):
        f = first[g]
        rows_key.append(
            (_null_first(gname(g)), _null_int(pid[f]), _null_int(tid[f]), -int(st.total[i]))
        )
    order = np.array(sorted(range(len(groups)), key=lambda i: rows_key[i]), np.int64)
    og = st.group[order]
    f = first[og]
    cols = [
        fmt.text(gname(g) for g in og.tolist()),
        ["" if rng[x] < 0 else ranges.style[rng[x]] for x in f.tolist()],
        ["" if v < 0 else str(v) for v in pid[f].tolist()],
        ["" if v < 0 else str(v) for v in tid[f].tolist()],
        fmt.ints(nvtx_inst[og]),
        fmt.ints(kern_inst[og]),
        fmt.ints(st.total[order]),
        *_stat_cols(st, order),
        fmt.text(knames[c] for c in kcode[op][f].tolist()),
    ]
    return Table.from_columns(HEADERS["nvtx_kern_sum"], cols)


def _null_int(v: int) -> tuple[bool, int]:
    return (v >= 0, int(v))


# -- nvtx_gpu_proj_sum ------------------------------------------------------------------
def report_nvtx_gpu_proj_sum(ctx: Context) -> Table:
    ex = ctx.ex
    if not _requires(ex, NVTX, RUNTIME) or ex.nvtx() is None:
        return _empty("nvtx_gpu_proj_sum")
    if not (ex.has(KERNEL) or ex.has(MEMCPY) or ex.has(MEMSET)):
        return _empty("nvtx_gpu_proj_sum")
    ranges = ctx.ranges()
    assert ranges is not None
    k = ex.kernels()
    mc = ex.memcpy()
    ms = ex.memset()
    # gpuops: kernels, then memcpy, then memset
    o_start = np.concatenate([k["start"], mc["start"], ms["start"]])
    o_end = np.concatenate([k["end"], mc["end"], ms["end"]])
    proj = ctx.ops_projection()
    pr, po = proj.pair_range, proj.pair_op
    nr = ranges.start.size
    if pr.size == 0:
        return _empty("nvtx_gpu_proj_sum")
    # per range: min(op.start), max(op.end), count(DISTINCT correlationId)
    pstart = np.full(nr, np.iinfo(np.int64).max)
    np.minimum.at(pstart, pr, o_start[po])
    pend = np.full(nr, np.iinfo(np.int64).min)
    np.maximum.at(pend, pr, o_end[po])
    has_ops = np.zeros(nr, bool)
    has_ops[pr] = True
    op_nb = _distinct_api_per_range(pr, proj.api_index[po], proj.api_index, nr)
    parent = parents(ranges)
    level = levels(parent)
    child_nb = np.bincount(parent[has_ops & (parent >= 0)], minlength=nr)
    sel = np.flatnonzero(has_ops)
    names = [ranges.names[c] for c in ranges.name_code[sel].tolist()]
    named = np.array([nm is not None for nm in names], bool)
    sel = sel[named]
    if sel.size == 0:
        return _empty("nvtx_gpu_proj_sum")
    style_code = np.array([s == "StartEnd" for s in ranges.style], np.int64)
    codes, first = dense_codes(ranges.name_code[sel], style_code[sel])
    proj_dur = pend[sel] - pstart[sel]
    st = group_stats(codes, proj_dur)
    nvtx_dur = _int_sum(codes, ranges.end[sel] - ranges.start[sel], first.size)
    ops_sum = _int_sum(codes, op_nb[sel], first.size)
    lv = level[sel]
    lv_ok = ~np.isnan(lv)
    lv_sum = np.bincount(codes[lv_ok], weights=lv[lv_ok], minlength=first.size)
    lv_cnt = np.bincount(codes[lv_ok], minlength=first.size)
    child_sum = np.bincount(codes, weights=child_nb[sel], minlength=first.size)
    g = st.group
    gname = [ranges.names[ranges.name_code[sel][first[x]]] for x in g.tolist()]
    gstyle = [ranges.style[sel[first[x]]] for x in g.tolist()]
    order = _order_total_desc(st, [f"{a}\0{b}" for a, b in zip(gname, gstyle, strict=True)])
    og = g[order]
    with np.errstate(invalid="ignore", divide="ignore"):
        avg_lvl = np.where(lv_cnt[og] > 0, lv_sum[og] / np.maximum(lv_cnt[og], 1), np.nan)
    cols = [
        fmt.text(gname[i] for i in order),
        fmt.text(gstyle[i] for i in order),
        fmt.ints(st.total[order]),
        fmt.ints(nvtx_dur[og]),
        fmt.ints(st.count[order]),
        *_stat_cols(st, order),
        fmt.ints(ops_sum[og]),
        fmt.round1(ops_sum[og] / st.count[order]),
        fmt.round1(avg_lvl),
        fmt.round1(child_sum[og] / st.count[order]),
    ]
    return Table.from_columns(HEADERS["nvtx_gpu_proj_sum"], cols)


def _distinct_api_per_range(
    pr: np.ndarray, pair_api: np.ndarray, op_api: np.ndarray, nr: int
) -> np.ndarray:
    """count(DISTINCT correlationId) per range; one API row = one correlation id."""
    if pair_api.size == 0:
        return np.zeros(nr, np.int64)
    launched = op_api[op_api >= 0]
    if launched.size == 0 or np.bincount(launched).max() <= 1:
        return np.bincount(pr, minlength=nr)  # one op per API call: pairs are distinct
    bound = int(pair_api.max()) + 1
    return distinct_count(pr, pr * bound + pair_api, nr * bound, nr)


def _int_sum(codes: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, np.int64)
    np.add.at(out, codes, values.astype(np.int64))
    return out


BUILDERS: dict[str, Callable[[Context], Table]] = {
    "cuda_gpu_kern_sum": report_cuda_gpu_kern_sum,
    "nvtx_sum": report_nvtx_sum,
    "nvtx_kern_sum": report_nvtx_kern_sum,
    "nvtx_gpu_proj_sum": report_nvtx_gpu_proj_sum,
    "cuda_api_sum": report_cuda_api_sum,
    "cuda_gpu_mem_time_sum": report_cuda_gpu_mem_time_sum,
    "cuda_gpu_mem_size_sum": report_cuda_gpu_mem_size_sum,
}


def prepare_reading(ex: Export, names: Sequence[str], with_extras: bool = False) -> None:
    """Tell ``ex`` how these reports (and the extras) will read it.

    Several reports: load whole tables once rather than the few columns each needs (with
    the extras: the kernels' launch configuration too, for one pass over them).  The
    CUDA API table (the largest) is loaded in the background whenever this process has
    other tables to read meanwhile (the projection reports also need kernels and NVTX).
    """
    ex.prefer_full = len(names) > 1 or with_extras
    ex.with_launch_config = with_extras
    wanted = set(names)
    if (
        wanted & {"nvtx_kern_sum", "nvtx_gpu_proj_sum"}
        or (ex.prefer_full and wanted & NEEDS_RUNTIME)
        or with_extras
    ):
        ex.prefetch_runtime()


def run_reports(ctx: Context, names: Sequence[str] = REPORTS) -> dict[str, Table]:
    """Compute the named nsys reports (default: all seven).

    Names and rounding follow the export's ``nsys_version`` reference version.
    """
    with fmt.reference(ctx.ex.nsys_version):
        return {name: BUILDERS[name](ctx) for name in names}
