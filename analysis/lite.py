"""numpy-free paths: NVTX naming shared with :mod:`analysis.export`, and the three small
reports (nvtx_sum, cuda_gpu_mem_time_sum, cuda_gpu_mem_size_sum) in pure Python.

Why: when one of these reports is asked for alone, its input is small and nsys answers in
about 0.1 s, less than importing numpy takes.  The CLI uses these implementations when
only these reports are requested; their output is identical to the numpy ones (the
parity tests run both).
"""

from __future__ import annotations

import math
import os
import sqlite3
from itertools import compress

from analysis import fmt
from analysis.errors import ExportError
from analysis.fmt import Table
from analysis.reports import HEADERS

TYPE_CHECKING = False  # typing, collections.abc, pathlib, urllib: too slow to import here
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

# Tables that every nsys export has, used to tell an nsys export from any other SQLite DB.
NSYS_MARKERS = ("StringIds", "TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT")


def connect(path: str | os.PathLike[str]) -> tuple[sqlite3.Connection, set[str]]:
    """Open an nsys export read-only; ExportError naming the file if it is not one."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise ExportError(p, "file does not exist")
    if not os.path.isfile(p):
        raise ExportError(p, "not a file")
    # SQLite URI: only "%", "?" and "#" need escaping in the path
    quoted = os.path.realpath(p).replace("%", "%25").replace("?", "%3f").replace("#", "%23")
    uri = f"file:{quoted}?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        con.execute("PRAGMA cache_size=-65536")
        rows = con.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
        ).fetchall()
    except sqlite3.Error as exc:
        raise ExportError(p, f"not a readable SQLite database ({exc})") from exc
    tables = {r[0] for r in rows}
    if not any(t in tables for t in NSYS_MARKERS):
        con.close()
        raise ExportError(p, "not an Nsight Systems SQLite export (no StringIds)")
    return con, tables

NVTX_DOMAIN_CREATE = 75
NVTX_RANGE_TYPES = (59, 60, 70, 71)
NVTX_PUSHPOP_TYPES = (59, 70)
LITE_REPORTS = frozenset({"nvtx_sum", "cuda_gpu_mem_time_sum", "cuda_gpu_mem_size_sum"})


Row = tuple


PID_BITS = 0x0000FFFFFF000000  # globalTid -> process part (domains are per process)
Domains = dict[tuple[int, int], tuple[int, "str | None"]]


def _col(columns: set[str], name: str) -> str:
    return name if name in columns else "NULL"


def nvtx_domains(
    con: sqlite3.Connection,
    columns: set[str],
    strings: dict[int, str],
    version: str,
    rows: list[tuple] | None = None,
) -> Domains:
    """First NVTX_DOMAIN_CREATE per (domainId, process): (start, domain name).

    ``rows``: the (start, globalTid, textId, domainId, text) rows of the domain-create
    events when already read (see :func:`_max_ts_and_domain_rows`).
    """
    if rows is None:
        rows = _domain_rows(con, columns)
    domains: Domains = {}
    for start, gtid, text_id, dom, text in rows:
        if dom is None or gtid is None:
            continue
        key = (dom, gtid & PID_BITS)
        dname = text
        if version == "2025" and text_id is not None and strings.get(text_id) is not None:
            dname = strings[text_id]
        if key not in domains or start < domains[key][0]:
            domains[key] = (start, dname)
    return domains


_NULL_INT = -(2**63)  # stands for NULL in min()/max() below (never a real id)


def _one_scan(
    con: sqlite3.Connection,
    where: str,
    text_id: str,
    dom: str,
    pid: str,
    is_pp: str,
    has_text: bool,
) -> tuple[Callable[[int | None], list[tuple] | None], bool, bool] | None:
    """nvtx_sum groups from one scan without a sort, when domain, process and style are
    the same for all ranges (the usual case): then the name depends on (textId, text)
    only.  SQLite returns textIds, durations and texts as one string each; Python groups.

    Returns (rows(max_ts), has a domainId, has ranges without end) or None when this does
    not apply; rows are (textId, text, domainId, globalTid, is_pushpop, durations).
    """
    same = ", ".join(f"min(ifnull({e}, {_NULL_INT})), max(ifnull({e}, {_NULL_INT}))" for e in (
        dom, pid, is_pp))  # fmt: skip
    texts = (
        "count(text), CAST(group_concat(text IS NOT NULL) AS BLOB), group_concat(text, char(30))"
        if has_text
        else "0, NULL, NULL"
    )
    row = con.execute(
        f"SELECT count(*), CAST(group_concat(ifnull({text_id}, '')) AS BLOB), "
        f"CAST(group_concat(ifnull(end - start, 'e' || ifnull(start, ''))) AS BLOB), "
        f"{same}, {texts} {where}"
    ).fetchone()
    count, ids, durs, *bounds = row
    n_text, flags, text_blob = bounds[6:]
    if not count:
        return (lambda _max_ts: []), False, False
    if any(bounds[i] != bounds[i + 1] for i in (0, 2, 4)):
        return None
    dm, gtid, pp = (None if b == _NULL_INT else b for b in bounds[0:6:2])
    keys: list = ids.split(b",")
    values = durs.split(b",")
    if len(keys) != count or len(values) != count:
        return None
    if n_text:
        text_list = text_blob.split("\x1e")
        if len(text_list) != n_text:  # the separator inside a text
            return None
        where_text = compress(range(count), map(b"1".__eq__, flags.split(b",")))
        for i, t in zip(where_text, text_list):  # noqa: B905
            keys[i] = (keys[i], t)
    open_ended = b"e" in durs

    def rows(max_ts: int | None) -> list[tuple] | None:
        out = []
        for k, v in _group_by_key(keys, values).items():
            tid_, txt = k if isinstance(k, tuple) else (k, None)
            if open_ended and any(d.startswith(b"e") for d in v):
                if max_ts is None or b"e" in v:  # NULL start: not a duration
                    return None
                d_ = [max_ts - int(d[1:]) if d.startswith(b"e") else int(d) for d in v]
            else:
                d_ = list(map(int, v))
            out.append((int(tid_) if tid_ else None, txt, dm, gtid, pp, d_))
        return out

    return rows, dm is not None, open_ended


def _domain_rows(con: sqlite3.Connection, columns: set[str]) -> list[tuple]:
    return con.execute(
        f"SELECT start, globalTid, {_col(columns, 'textId')}, {_col(columns, 'domainId')}, "
        f"{_col(columns, 'text')} FROM NVTX_EVENTS WHERE eventType = {NVTX_DOMAIN_CREATE}"
    ).fetchall()


def _unquote(v: str) -> int | str | None:
    """Invert SQLite's quote() for integers, text and NULL."""
    if v == "NULL":
        return None
    if v.startswith("'"):
        return v[1:-1].replace("''", "'")
    return int(v)


def _max_ts_and_domain_rows(
    con: sqlite3.Connection, columns: set[str]
) -> tuple[int | None, list[tuple]]:
    """max(max(start), max(end)) over all NVTX events and the domain-create rows, in one
    scan: each domain-create row comes back quote()d and joined by control characters."""
    fields = ["start", "globalTid", *(_col(columns, c) for c in ("textId", "domainId", "text"))]
    packed = " || char(31) || ".join(f"quote({f})" for f in fields)
    max_ts, blob = con.execute(
        f"SELECT max(max(start), max(end)), group_concat(CASE eventType WHEN "
        f"{NVTX_DOMAIN_CREATE} THEN {packed} END, char(30)) FROM NVTX_EVENTS"
    ).fetchone()
    if not blob:
        return max_ts, []
    rows = [r.split("\x1f") for r in blob.split("\x1e")]
    try:
        if all(len(r) == len(fields) for r in rows):
            return max_ts, [tuple(_unquote(v) for v in r) for r in rows]
    except ValueError:  # a non-integer in an integer column
        pass
    return max_ts, _domain_rows(con, columns)  # or separators inside a domain name


def range_name(
    text_id: int | None,
    text: str | None,
    dom: int | None,
    gtid: int | None,
    strings: dict[int, str],
    domains: Domains,
    version: str,
) -> str | None:
    """The range name as the report SQL of nsys ``version`` builds it.

    2025: ``coalesce(domain, '') || ':' || coalesce(sid.value, text, '')``;
    2024: ``domain:text`` for named domains, the bare text otherwise (NULL without text).
    """
    value = strings.get(text_id) if text_id is not None else None
    label = value if value is not None else text
    dname = None
    if domains and dom is not None and gtid is not None:
        hit = domains.get((dom, gtid & PID_BITS))
        dname = hit[1] if hit else None
    if version == "2025":
        return f"{dname or ''}:{label or ''}"
    if dname is not None:
        return None if label is None else f"{dname}:{label}"
    return label


def nvtx_rows(
    con: sqlite3.Connection, columns: set[str], strings: dict[int, str], version: str
) -> tuple[list[Row], list[str | None], int | None, int | None, int | None]:
    """NVTX range rows, their nsys names, max ts (all events) and range min/max ts.

    Rows are (rowid, start, end, eventType, globalTid, endGlobalTid, textId, domainId,
    text).  Names are computed
    once per distinct (textId, text, domainId, process) (see :func:`range_name`).
    """
    types = ",".join(str(t) for t in NVTX_RANGE_TYPES)
    rows = con.execute(
        f"SELECT rowid, start, end, eventType, globalTid, {_col(columns, 'endGlobalTid')}, "
        f"{_col(columns, 'textId')}, {_col(columns, 'domainId')}, {_col(columns, 'text')} "
        f"FROM NVTX_EVENTS WHERE eventType IN ({types})"
    ).fetchall()
    max_ts = con.execute("SELECT max(max(start), max(end)) FROM NVTX_EVENTS").fetchone()[0]
    rmin, rmax = con.execute(
        "SELECT min(min(start), min(end)), max(max(start), max(end)) FROM NVTX_EVENTS "
        f"WHERE eventType IN ({types})"
    ).fetchone()
    domains = nvtx_domains(con, columns, strings, version)
    cache: dict[tuple, str | None] = {}
    names: list[str | None] = []
    for r in rows:
        gtid = r[4]
        key = (r[6], r[8], r[7], None if gtid is None else gtid & PID_BITS)
        if key not in cache:
            cache[key] = range_name(r[6], r[8], r[7], gtid, strings, domains, version)
        names.append(cache[key])
    return rows, names, max_ts, rmin, rmax


def summarize(values: list[int]) -> tuple[int, int, float, float, int, int, float]:
    """(count, total, mean, median, min, max, sample stddev) with nsys' definitions."""
    values.sort()
    n = len(values)
    total = sum(values)
    mean = total / n
    mid = (n - 1) // 2
    median = float(values[mid]) if n % 2 else (values[mid] + values[mid + 1]) / 2
    if n > 1:
        devs = [v - mean for v in values]
        std = math.sqrt(sum([d * d for d in devs]) / (n - 1))
    else:
        std = 0.0
    return n, total, mean, median, values[0], values[-1], std


def _summary_rows(
    groups: dict[object, list[int]], label: dict[object, list[str]], bytes_: bool = False
) -> list[list[str]]:
    stats = {k: summarize(v) for k, v in groups.items()}
    order = sorted(stats, key=lambda k: (-stats[k][1], "\0".join(label[k])))
    grand = sum(s[1] for s in stats.values())
    rows = []
    for k in order:
        n, total, mean, med, lo, hi, std = stats[k]
        if bytes_:
            mb = fmt.megabytes([total, mean, med, lo, hi, std])
            rows.append([mb[0], str(n), *mb[1:], *label[k]])
        else:
            pct = fmt.percent([total], grand)[0]
            r = fmt.round1([mean, med, std])
            rows.append([pct, str(total), str(n), r[0], r[1], str(lo), str(hi), r[2], *label[k]])
    return rows


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _group_by_key(keys: list[bytes], values: list[bytes]) -> dict[bytes, list[bytes]]:
    """Values grouped by their (unparsed) key, in first-seen order of the keys."""
    if len(set(keys)) == 1:
        return {keys[0]: values}
    groups: dict[bytes, list[bytes]] = {}
    for k, v in zip(keys, values):  # noqa: B905 (equal lengths checked by the callers)
        g = groups.get(k)
        if g is None:
            groups[k] = g = []
        g.append(v)
    return groups


def _gc(expr: str) -> str:
    """One row's values of ``expr`` as one comma-separated string, NULL as empty."""
    return f"CAST(group_concat(ifnull({expr}, '')) AS BLOB)"


def report_nvtx_sum(con: sqlite3.Connection, version: str) -> Table:
    """nvtx_sum with SQLite doing the per-row work.

    Usually one scan (:func:`_one_scan`) returns each column as one string and Python
    groups the rows.  Otherwise rows are grouped in SQL by everything the name depends on
    (textId, text, domainId, process) and the style; each group returns its durations as
    one group_concat string.  Groups whose names coincide are merged after.
    """
    tables = _tables(con)
    if not {"StringIds", "NVTX_EVENTS"} <= tables:
        return Table(HEADERS["nvtx_sum"])
    columns = {r[1] for r in con.execute("PRAGMA table_info(NVTX_EVENTS)")}
    types = ",".join(str(t) for t in NVTX_RANGE_TYPES)
    pushpop = ",".join(str(t) for t in NVTX_PUSHPOP_TYPES)
    text_id, dom, text = (_col(columns, c) for c in ("textId", "domainId", "text"))
    pid, is_pp = f"globalTid & {PID_BITS}", f"eventType IN ({pushpop})"
    where = f"FROM NVTX_EVENTS WHERE eventType IN ({types})"

    def grouped(extra: str) -> list[tuple] | None:
        # Sorting on two keys is ~2x cheaper than on five; usually the text fixes the
        # domain, process and style, which the min/max columns confirm (else group on all
        # five).  None when start/end values are NULL.
        rows = con.execute(
            f"SELECT {text_id}, {text}, min({dom}), min(globalTid), min({is_pp}), "
            f"CAST(group_concat(ifnull(end, ?) - start) AS BLOB), count(*), "
            f"min({dom}) IS max({dom}) AND min({pid}) IS max({pid}) AND "
            f"min({is_pp}) IS max({is_pp}) AND count({dom}) IN (0, count(*)) AND "
            f"count({pid}) IN (0, count(*)) {where} {extra} GROUP BY 1, 2",
            (max_ts,),
        ).fetchall()
        if not all(r[7] for r in rows):
            rows = con.execute(
                f"SELECT {text_id}, {text}, {dom}, min(globalTid), {is_pp}, "
                f"CAST(group_concat(ifnull(end, ?) - start) AS BLOB), count(*), 1 "
                f"{where} {extra} GROUP BY 1, 2, 3, {pid}, 5",
                (max_ts,),
            ).fetchall()
        out = []
        for r in rows:
            durs = list(map(int, r[5].split(b","))) if r[5] else []
            if len(durs) != r[6]:
                return None
            out.append((*r[:5], durs))
        return out

    scan = _one_scan(con, where, text_id, dom, pid, is_pp, "text" in columns)
    if scan is None or scan[2]:  # ranges without end end at the last NVTX timestamp
        max_ts, domain_rows = _max_ts_and_domain_rows(con, columns)
    else:  # domain names only where a range has a domainId
        max_ts, domain_rows = None, (_domain_rows(con, columns) if scan[1] else [])
    rows = scan[0](max_ts) if scan is not None else None
    if rows is None:
        rows = grouped("")
    if rows is None:
        return _report_nvtx_sum_rows(con, columns, version)  # NULL start/end values
    ids = {r[0] for r in rows if r[0] is not None}
    strings = _strings(con, ids | {r[2] for r in domain_rows if r[2] is not None})
    domains = nvtx_domains(con, columns, strings, version, domain_rows)
    groups: dict[object, list[int]] = {}
    label: dict[object, list[str]] = {}
    for tid_, txt, dm, gtid, is_pushpop, durs in rows:
        name = range_name(tid_, txt, dm, gtid, strings, domains, version)
        style = "PushPop" if is_pushpop else "StartEnd"
        key = (name, style)
        label.setdefault(key, [style, name or ""])
        groups.setdefault(key, []).extend(durs)
    return Table(HEADERS["nvtx_sum"], _summary_rows(groups, label))


def _strings(con: sqlite3.Connection, ids: set[int]) -> dict[int, str]:
    """StringIds values of the given ids only (the table can hold every kernel name)."""
    if not ids:
        return {}
    marks = ",".join(str(int(i)) for i in ids)
    return dict(con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})").fetchall())


def _report_nvtx_sum_rows(con: sqlite3.Connection, columns: set[str], version: str) -> Table:
    """Row-by-row nvtx_sum (exports with NULL start/end values)."""
    strings = dict(con.execute("SELECT id, value FROM StringIds").fetchall())
    rows, names, max_ts, _lo, _hi = nvtx_rows(con, columns, strings, version)
    groups: dict[object, list[int]] = {}
    label: dict[object, list[str]] = {}
    for row, name in zip(rows, names, strict=True):
        style = "PushPop" if row[3] in NVTX_PUSHPOP_TYPES else "StartEnd"
        end = row[2] if row[2] is not None else max_ts
        key = (name, style)
        if key not in groups:
            groups[key] = []
            label[key] = [style, name or ""]
        groups[key].append(end - row[1])
    return Table(HEADERS["nvtx_sum"], _summary_rows(groups, label))


def _memop_groups(con: sqlite3.Connection, col: str) -> dict[object, list[int]] | None:
    """Operation name -> values of ``col`` ('dur' or 'bytes') of memcpy + memset rows.

    One scan per table returns the copy kinds and the values as two strings; Python groups
    them (cheaper than SQLite sorting the rows for a GROUP BY).
    """
    tables = _tables(con)
    if not ({"CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"} & tables):
        return None
    expr = "end - start" if col == "dur" else "bytes"
    groups: dict[object, list[int]] = {}
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        if "ENUM_CUDA_MEMCPY_OPER" not in tables:
            return None
        labels = dict(con.execute("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER").fetchall())
        count, kinds, values = con.execute(
            f"SELECT count(*), {_gc('copyKind')}, {_gc(expr)} FROM CUPTI_ACTIVITY_KIND_MEMCPY"
        ).fetchone()
        if count:
            for kind, vals in _group_by_key(kinds.split(b","), values.split(b",")).items():
                if kind and int(kind) in labels:  # INNER JOIN ENUM_CUDA_MEMCPY_OPER
                    name = f"[CUDA memcpy {labels[int(kind)]}]"
                    groups.setdefault(name, []).extend(_ints(vals, col))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        count, values = con.execute(
            f"SELECT count(*), {_gc(expr)} FROM CUPTI_ACTIVITY_KIND_MEMSET"
        ).fetchone()
        if count:
            groups["[CUDA memset]"] = _ints(values.split(b","), col)
    return groups


def _ints(values: list[bytes], col: str) -> list[int]:
    try:
        return list(map(int, values))
    except ValueError:  # empty string = NULL
        raise sqlite3.DataError(f"NULL {col} values in memory operation rows") from None


def report_mem(con: sqlite3.Connection, name: str) -> Table:
    groups = _memop_groups(con, "bytes" if name == "cuda_gpu_mem_size_sum" else "dur")
    if groups is None:
        return Table(HEADERS[name])
    label = {k: [str(k)] for k in groups}
    return Table(
        HEADERS[name], _summary_rows(groups, label, bytes_=name == "cuda_gpu_mem_size_sum")
    )


def run_lite(
    path: str | os.PathLike[str], names: Sequence[str], version: str
) -> dict[str, Table]:
    """The requested small reports (a subset of LITE_REPORTS) without numpy."""
    con, _ = connect(path)
    out: dict[str, Table] = {}
    try:
        with fmt.reference(version):
            for name in names:
                if name == "nvtx_sum":
                    out[name] = report_nvtx_sum(con, version)
                else:
                    out[name] = report_mem(con, name)
    except sqlite3.Error as exc:
        raise ExportError(path, f"corrupt or truncated export ({exc})") from exc
    finally:
        con.close()
    return out
