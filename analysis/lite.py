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
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from analysis import fmt
from analysis.errors import ExportError
from analysis.fmt import Table

# Tables that every nsys export has, used to tell an nsys export from any other SQLite DB.
NSYS_MARKERS = ("StringIds", "TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT")


def connect(path: str | os.PathLike[str]) -> tuple[sqlite3.Connection, set[str]]:
    """Open an nsys export read-only; ExportError naming the file if it is not one."""
    p = Path(path)
    if not p.exists():
        raise ExportError(p, "file does not exist")
    if not p.is_file():
        raise ExportError(p, "not a file")
    query = urllib.parse.urlencode({"mode": "ro", "immutable": "1"})
    uri = urllib.parse.urlunsplit(["file", "", str(p.resolve()), query, ""])
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

DUR_STATS = ["Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)", "StdDev (ns)"]
HEADERS = {
    "nvtx_sum": ["Time (%)", "Total Time (ns)", "Instances", *DUR_STATS, "Style", "Range"],
    "cuda_gpu_mem_time_sum": ["Time (%)", "Total Time (ns)", "Count", *DUR_STATS, "Operation"],
    "cuda_gpu_mem_size_sum": [
        "Total (MB)", "Count", "Avg (MB)", "Med (MB)", "Min (MB)", "Max (MB)", "StdDev (MB)",
        "Operation",
    ],
}  # fmt: skip

Row = tuple


PID_BITS = 0x0000FFFFFF000000  # globalTid -> process part (domains are per process)
Domains = dict[tuple[int, int], tuple[int, "str | None"]]


def _col(columns: set[str], name: str) -> str:
    return name if name in columns else "NULL"


def nvtx_domains(
    con: sqlite3.Connection, columns: set[str], strings: dict[int, str], version: str
) -> Domains:
    """First NVTX_DOMAIN_CREATE per (domainId, process): (start, domain name)."""
    rows = con.execute(
        f"SELECT start, globalTid, {_col(columns, 'textId')}, {_col(columns, 'domainId')}, "
        f"{_col(columns, 'text')} FROM NVTX_EVENTS WHERE eventType = {NVTX_DOMAIN_CREATE}"
    ).fetchall()
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
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
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


def _ints(blob: bytes | None) -> list[int]:
    return [int(v) for v in blob.split(b",")] if blob else []


def report_nvtx_sum(con: sqlite3.Connection, version: str) -> Table:
    """nvtx_sum with SQLite doing the per-row work.

    Rows are grouped in SQL by everything the name depends on (textId, text, domainId,
    process) and the style; each group returns its durations as one group_concat string, so
    Python only sees a handful of groups.  Groups whose names coincide are merged after.
    """
    tables = _tables(con)
    if not {"StringIds", "NVTX_EVENTS"} <= tables:
        return Table(HEADERS["nvtx_sum"])
    columns = {r[1] for r in con.execute("PRAGMA table_info(NVTX_EVENTS)")}
    types = ",".join(str(t) for t in NVTX_RANGE_TYPES)
    pushpop = ",".join(str(t) for t in NVTX_PUSHPOP_TYPES)
    text_id, dom, text = (_col(columns, c) for c in ("textId", "domainId", "text"))
    max_ts = con.execute("SELECT max(max(start), max(end)) FROM NVTX_EVENTS").fetchone()[0]
    # Sorting on two keys is ~2x cheaper than on five; usually the text fixes the domain,
    # process and style, which the min/max columns confirm (else group on all five).
    pid, is_pp = f"globalTid & {PID_BITS}", f"eventType IN ({pushpop})"
    rows = con.execute(
        f"SELECT {text_id}, {text}, min({dom}), min(globalTid), min({is_pp}), "
        f"CAST(group_concat(ifnull(end, ?) - start) AS BLOB), count(*), "
        f"min({dom}) IS max({dom}) AND min({pid}) IS max({pid}) AND min({is_pp}) IS max({is_pp})"
        f" AND count({dom}) IN (0, count(*)) AND count({pid}) IN (0, count(*)) "
        f"FROM NVTX_EVENTS WHERE eventType IN ({types}) GROUP BY 1, 2",
        (max_ts,),
    ).fetchall()
    if not all(r[7] for r in rows):
        rows = con.execute(
            f"SELECT {text_id}, {text}, {dom}, min(globalTid), {is_pp}, "
            f"CAST(group_concat(ifnull(end, ?) - start) AS BLOB), count(*), 1 "
            f"FROM NVTX_EVENTS WHERE eventType IN ({types}) GROUP BY 1, 2, 3, {pid}, 5",
            (max_ts,),
        ).fetchall()
    durations = [_ints(r[5]) for r in rows]
    if any(len(d) != r[6] for d, r in zip(durations, rows, strict=True)):
        return _report_nvtx_sum_rows(con, columns, version)  # NULL start/end values
    ids = {r[0] for r in rows if r[0] is not None}
    strings = _strings(con, ids | _domain_text_ids(con, columns))
    domains = nvtx_domains(con, columns, strings, version)
    groups: dict[object, list[int]] = {}
    label: dict[object, list[str]] = {}
    for (tid_, txt, dm, gtid, is_pushpop, *_), durs in zip(rows, durations, strict=True):
        name = range_name(tid_, txt, dm, gtid, strings, domains, version)
        style = "PushPop" if is_pushpop else "StartEnd"
        key = (name, style)
        label.setdefault(key, [style, name or ""])
        groups.setdefault(key, []).extend(durs)
    return Table(HEADERS["nvtx_sum"], _summary_rows(groups, label))


def _domain_text_ids(con: sqlite3.Connection, columns: set[str]) -> set[int]:
    if "textId" not in columns:
        return set()
    rows = con.execute(
        f"SELECT DISTINCT textId FROM NVTX_EVENTS WHERE eventType = {NVTX_DOMAIN_CREATE}"
    ).fetchall()
    return {r[0] for r in rows if r[0] is not None}


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

    SQLite groups by copy kind and returns each group's values as one string.
    """
    tables = _tables(con)
    if not ({"CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"} & tables):
        return None
    expr = "{t}end - {t}start" if col == "dur" else "{t}bytes"
    parts = []
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        if "ENUM_CUDA_MEMCPY_OPER" not in tables:
            return None
        parts += con.execute(
            f"SELECT '[CUDA memcpy ' || mos.label || ']', "
            f"CAST(group_concat({expr.format(t='m.')}) AS BLOB), count(*) "
            "FROM CUPTI_ACTIVITY_KIND_MEMCPY AS m "
            "JOIN ENUM_CUDA_MEMCPY_OPER AS mos ON mos.id == m.copyKind GROUP BY m.copyKind"
        ).fetchall()
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        parts += con.execute(
            f"SELECT '[CUDA memset]', CAST(group_concat({expr.format(t='')}) AS BLOB), count(*) "
            "FROM CUPTI_ACTIVITY_KIND_MEMSET HAVING count(*) > 0"
        ).fetchall()
    groups: dict[object, list[int]] = {}
    for name, blob, count in parts:
        values = _ints(blob)
        if len(values) != count:
            raise sqlite3.DataError(f"NULL {col} values in {name} rows")
        groups.setdefault(name, []).extend(values)
    return groups


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
