"""Read an Nsight Systems SQLite export once, into numpy arrays.

Why not ``pd.read_sql``: building one Python object per cell dominates the run time of
large exports.  Whole integer tables are decoded from the file itself
(:mod:`analysis.sqlitefile`); otherwise (and for the NVTX table) integer columns are
fetched with one ``group_concat`` per column inside a single table scan (SQLite formats
the numbers in C) and parsed by numpy.  NULLs are mapped to a sentinel first because
``group_concat`` skips them.

Schema differences handled here (nsys 2024.x vs 2025.x): tables that are absent when
nothing was traced (CPU-only capture), optional columns (``shortName``, ``endGlobalTid``,
``textId``, ``domainId``), NVTX names stored inline (``text``) or via ``StringIds``.
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from analysis.errors import ExportError
from analysis.groupstats import dense_codes, densify
from analysis.lite import PID_BITS, connect, nvtx_domains, range_name
from analysis.sqlitefile import prepare

NULL = np.iinfo(np.int64).min  # sentinel for SQL NULL in integer columns

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX = "NVTX_EVENTS"

# NVTX event types (ENUM_NSYS_EVENT_TYPE)
NVTX_DOMAIN_CREATE = 75
NVTX_PUSHPOP = 59
NVTX_STARTEND = 60
NVTXT_PUSHPOP = 70
NVTXT_STARTEND = 71
NVTX_RANGE_TYPES = (NVTX_PUSHPOP, NVTX_STARTEND, NVTXT_PUSHPOP, NVTXT_STARTEND)
NVTX_PUSHPOP_TYPES = (NVTX_PUSHPOP, NVTXT_PUSHPOP)


Columns = dict[str, np.ndarray]


@dataclass
class NvtxEvents:
    """NVTX range events (push/pop and start/end) with resolved names."""

    start: np.ndarray  # int64
    end: np.ndarray  # int64, NULL where the export has no end
    event_type: np.ndarray  # int64
    global_tid: np.ndarray  # int64
    end_global_tid: np.ndarray  # int64, NULL when the range ended on its start thread
    rowid: np.ndarray  # int64
    name_code: np.ndarray  # per event: index into ``names``
    names: list[str | None]  # distinct range names, "domain:text" as nsys builds them
    max_ts: int | None  # max(max(start), max(end)) over all NVTX_EVENTS rows
    range_max_ts: int | None  # same, over range events only (nvtx_kern/proj reports)
    range_min_ts: int | None


#: NVTX range naming of the reference nsys version.  2025.3.1 names every range
#: "<domain>:<text>" with an empty domain for the default one (":step_0"); 2024.2.3 writes
#: "<domain>:<text>" only for named domains ("step_0").
NSYS_VERSIONS = ("2025", "2024")


class Export:
    """One nsys SQLite export opened read-only; tables are loaded lazily and cached.

    ``nsys_version`` selects how NVTX range names are printed: "2025" (the reference,
    Nsight Systems 2025.3.1) or "2024" (2024.2.3); see :data:`NSYS_VERSIONS`.
    """

    def __init__(self, path: str | os.PathLike[str], nsys_version: str = "2025") -> None:
        if nsys_version not in NSYS_VERSIONS:
            raise ValueError(f"nsys_version must be one of {NSYS_VERSIONS}")
        self.nsys_version = nsys_version
        self.path = Path(path)
        self.con, self.tables = connect(self.path)
        self._cache: dict[str, object] = {}
        #: set when several reports run: load whole tables once instead of per report
        self.prefer_full = False
        self._strings: dict[int, str] | None = None
        #: read the big integer tables from the file directly (False: always SQL)
        self.raw_reader = os.environ.get("PROFBENCH_ANALYSIS_SQL_ONLY", "") == ""
        # Touch every table we may read so that truncation is reported up front.
        self._check_integrity()

    # -- low level -------------------------------------------------------------------------
    def _check_integrity(self) -> None:
        for table in (KERNEL, RUNTIME, MEMCPY, MEMSET, NVTX, "StringIds"):
            if table in self.tables:
                self.query(f"SELECT max(rowid) FROM {table}")

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        try:
            return self.con.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise ExportError(self.path, f"corrupt or truncated export ({exc})") from exc

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns_of(self, table: str) -> set[str]:
        key = f"cols:{table}"
        if key not in self._cache:
            rows = self.query("SELECT name FROM pragma_table_info(?)", (table,))
            self._cache[key] = {r[0] for r in rows}
        return self._cache[key]  # type: ignore[return-value]

    def notnull(self, table: str) -> set[str]:
        key = f"notnull:{table}"
        if key not in self._cache:
            rows = self.query('SELECT name FROM pragma_table_info(?) WHERE "notnull"', (table,))
            self._cache[key] = {r[0] for r in rows}
        return self._cache[key]  # type: ignore[return-value]

    def int_columns(
        self, table: str, exprs: dict[str, str], where: str = "", nullable: Sequence[str] = ()
    ) -> Columns:
        """Fetch integer expressions of ``table`` as int64 arrays (NULL -> ``NULL``).

        One table scan; every expression is aggregated with group_concat so that SQLite
        does the number formatting and numpy the parsing (no per-cell Python objects).
        Columns declared NOT NULL are read as is; for the others a count() tells whether
        NULLs are present, and only then is the column re-read through ifnull().  Names in
        ``nullable`` (columns that usually hold NULLs) go through ifnull() at once.
        """
        names = list(exprs)
        if not self.has(table):
            return {n: np.empty(0, np.int64) for n in names}
        if not where:
            raw = self._raw_columns(table, exprs)
            if raw is not None:
                return raw
        notnull = self.notnull(table)
        aggs = []
        for n in names:
            e = exprs[n]
            if n in nullable:
                aggs.append(f"CAST(group_concat(ifnull({e}, {NULL})) AS BLOB)")
            else:
                aggs.append(f"CAST(group_concat({e}) AS BLOB)")
            aggs.append("count(*)" if e in notnull or n in nullable else f"count({e})")
        row = self.query(f"SELECT count(*), {', '.join(aggs)} FROM {table} {where}")[0]
        count = row[0]
        out: Columns = {}
        for i, n in enumerate(names):
            text, present = row[1 + 2 * i], row[2 + 2 * i]
            if present != count:  # NULLs would be skipped by group_concat: re-read
                text = self.query(
                    f"SELECT CAST(group_concat(ifnull({exprs[n]}, {NULL})) AS BLOB) "
                    f"FROM {table} {where}"
                )[0][0]
            out[n] = self._parse_column(text, count, table, n)
        return out

    def packed_columns(
        self,
        table: str,
        plain: dict[str, str],
        pairs: list[tuple[str, str, str, str]],
        where: str = "",
    ) -> Columns:
        """Like :meth:`int_columns`, packing pairs of small ids into one value.

        group_concat's cost is per value, so ``(hi << 40) | lo`` (e.g. name id and
        correlationId) halves the work for that pair.  Each pair is (hi_name, hi_expr,
        lo_name, lo_expr); when a value is NULL, negative or too large to pack, the
        table is re-read unpacked.
        """
        if not self.has(table):
            names = [*plain, *(p[0] for p in pairs), *(p[2] for p in pairs)]
            return {n: np.empty(0, np.int64) for n in names}
        if not where:
            exprs = dict(plain)
            for hn, he, ln, le in pairs:
                exprs[hn] = he
                exprs[ln] = le
            raw = self._raw_columns(table, exprs)
            if raw is not None:
                return raw
        notnull = self.notnull(table)
        aggs: list[str] = []
        for e in plain.values():
            aggs.append(f"CAST(group_concat({e}) AS BLOB)")
            aggs.append("count(*)" if e in notnull else f"count({e})")
        for _hn, he, _ln, le in pairs:
            aggs.append(f"CAST(group_concat(({he} << 40) | {le}) AS BLOB)")
            aggs.append(f"count(({he} << 40) | {le})")
            aggs.append(f"min({he}), max({he}), min({le}), max({le})")
        row = self.query(f"SELECT count(*), {', '.join(aggs)} FROM {table} {where}")[0]
        count = row[0]
        out: Columns = {}
        pos = 1
        ok = True
        for n in plain:
            text, present = row[pos], row[pos + 1]
            pos += 2
            if present != count:
                ok = False
                break
            out[n] = self._parse_column(text, count, table, n)
        for hn, _he, ln, _le in pairs:
            if not ok:
                break
            text, present, hmin, hmax, lmin, lmax = row[pos : pos + 6]
            pos += 6
            if present != count or (count and not (
                0 <= hmin and hmax < 2**22 and 0 <= lmin and lmax < 2**40
            )):
                ok = False
                break
            packed = self._parse_column(text, count, table, hn)
            out[hn] = packed >> 40
            out[ln] = packed & (2**40 - 1)
        if ok:
            return out
        exprs = dict(plain)
        for hn, he, ln, le in pairs:
            exprs[hn] = he
            exprs[ln] = le
        return self.int_columns(table, exprs, where)

    def _raw_columns(self, table: str, exprs: dict[str, str]) -> Columns | None:
        """Columns read from the file itself (:mod:`analysis.sqlitefile`), or None.

        Supports expressions that are a column name, an integer literal or
        ``end - start``; None (use SQL) for anything else or when the reader declines.
        """
        plan = self._raw_plan(table, exprs)
        return plan() if plan is not None else None

    def _raw_plan(self, table: str, exprs: dict[str, str]) -> Callable[[], Columns | None] | None:
        """:meth:`_raw_columns` in two steps: SQL look-ups now, the decoding (numpy only,
        thread-safe) in the returned function."""
        if not self.raw_reader:
            return None
        cols = self.columns_of(table)
        needed: list[str] = []
        for e in exprs.values():
            if e == "end - start":
                needed += ["start", "end"]
            elif e in cols:
                needed.append(e)
            elif not e.isdigit():
                return None
        decode = prepare(self.path, self.con, table, sorted(set(needed)))
        if decode is None:
            return None
        rows = None if needed else self.query(f"SELECT count(*) FROM {table}")[0][0]

        def run() -> Columns | None:
            data = decode()
            if data is None:
                return None
            n = next(iter(data.values())).size if data else rows
            out: Columns = {}
            for name, e in exprs.items():
                if e == "end - start":
                    start, end = data["start"], data["end"]
                    dur = end - start
                    dur[(start == NULL) | (end == NULL)] = NULL
                    out[name] = dur
                elif e in data:
                    out[name] = data[e]
                else:
                    out[name] = np.full(n, int(e), np.int64)
            return out

        return run

    def _parse_column(self, text: bytes | None, count: int, table: str, name: str) -> np.ndarray:
        if not count or text is None:
            return np.empty(0, np.int64)
        try:
            arr = _parse(text)
        except ValueError:
            arr = np.empty(0, np.int64)
        if arr.size != count:
            raise ExportError(self.path, f"unexpected (non-integer) values in {table}.{name}")
        return arr

    # -- strings ---------------------------------------------------------------------------
    @property
    def strings(self) -> dict[int, str]:
        if self._strings is None:
            if self.has("StringIds"):
                self._strings = dict(self.query("SELECT id, value FROM StringIds"))
            else:
                self._strings = {}
        return self._strings

    def names_for(self, ids: np.ndarray) -> tuple[np.ndarray, list[str | None]]:
        """Map string ids to (codes, unique names); equal strings share one code."""
        if ids.size == 0:
            return np.empty(0, np.int64), []
        lo = int(ids.min())
        inv, rep = densify(ids - lo, int(ids.max()) - lo + 1)
        uniq = ids[rep]
        strings = self.strings
        names: list[str | None] = []
        index: dict[str | None, int] = {}
        remap = np.empty(len(uniq), np.int64)
        for i, sid in enumerate(uniq.tolist()):
            name = strings.get(sid)
            code = index.get(name)
            if code is None:
                code = index[name] = len(names)
                names.append(name)
            remap[i] = code
        return remap[inv].astype(np.int64), names

    # -- tables ----------------------------------------------------------------------------
    def kernels(self, launch_config: bool = False) -> Columns:
        key = f"kernels:{launch_config}"
        if key not in self._cache:
            cols = self.columns_of(KERNEL) if self.has(KERNEL) else set()
            exprs = {"start": "start", "end": "end", "globalPid": "globalPid"}
            pairs = [("name", "demangledName", "correlationId", "correlationId")]
            if launch_config:
                exprs.update(
                    deviceId="deviceId" if "deviceId" in cols else "0",
                    streamId="streamId" if "streamId" in cols else "0",
                    gridX="gridX",
                    gridY="gridY",
                    gridZ="gridZ",
                    blockX="blockX",
                    blockY="blockY",
                    blockZ="blockZ",
                    regs="registersPerThread",
                    staticSmem="staticSharedMemory",
                    dynamicSmem="dynamicSharedMemory",
                )
            self._cache[key] = self.packed_columns(KERNEL, exprs, pairs)
        return self._cache[key]  # type: ignore[return-value]

    def runtime(self) -> Columns:
        thread = self._cache.pop("runtime_thread", None)
        if thread is not None:
            worker, result = thread  # type: ignore[misc]
            worker.join()
            if result.get("data") is not None:
                self._cache["runtime"] = result["data"]
        if "runtime" not in self._cache:
            future = self._cache.pop("runtime_future", None)
            if future is not None:
                pid, rfd, split = future  # type: ignore[misc]
                # this process reads the rows after the child's share meanwhile
                tail = self._load_runtime(f"WHERE rowid > {split}")
                head = _receive(self.path, pid, rfd)
                self._cache["runtime"] = {k: np.concatenate([head[k], tail[k]]) for k in head}
            else:
                self._cache["runtime"] = self._load_runtime()
        return self._cache["runtime"]  # type: ignore[return-value]

    def _load_runtime(self, where: str = "") -> Columns:
        """The CUDA API columns, in rowid order (``where``: a rowid range)."""
        return self.packed_columns(
            RUNTIME,
            {"start": "start", "end": "end", "globalTid": "globalTid"},
            [("nameId", "nameId", "correlationId", "correlationId")],
            where,
        )

    def prefetch_runtime(self, min_rows: int = 200_000) -> None:
        """Load the CUDA API table while this process reads the other tables.

        Usually the table is decoded from the file in a thread (:meth:`_raw_plan`).  On the
        SQL path a thread would not help (SQLite's per-value work holds the GIL between
        rows), so a forked child on the second core reads it and pickles the arrays back
        through a pipe; no-op there for small tables or where fork is unavailable.
        """
        if any(k in self._cache for k in ("runtime", "runtime_future", "runtime_thread")):
            return
        if not self.has(RUNTIME):
            return
        plan = self._raw_plan(
            RUNTIME,
            {"start": "start", "end": "end", "globalTid": "globalTid", "nameId": "nameId",
             "correlationId": "correlationId"},
        )  # fmt: skip
        if plan is not None:
            # decoded from the file in a thread: numpy releases the GIL in its loops, so
            # this overlaps with reading the other tables here
            result: dict[str, Columns | None] = {}
            worker = threading.Thread(target=lambda: result.update(data=plan()), daemon=True)
            worker.start()
            self._cache["runtime_thread"] = (worker, result)
            return
        if not hasattr(os, "fork"):
            return
        n_api = self.query(f"SELECT max(rowid) FROM {RUNTIME}")[0][0] or 0
        if n_api < min_rows:
            return
        # Balance the two processes: this one also reads the kernel and NVTX tables (a
        # kernel row costs about as much as an API row), so it takes the API rows after
        # ``split`` and the child the ones before.
        n_kern = 0
        if self.has(KERNEL):
            n_kern = self.query(f"SELECT max(rowid) FROM {KERNEL}")[0][0] or 0
        split = min(n_api, int((n_kern + n_api) / 2 * 1.05))
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never returns
            os.close(rfd)
            code = 0
            try:
                with os.fdopen(wfd, "wb") as fh:
                    try:
                        payload: object = Export(self.path, self.nsys_version)._load_runtime(
                            f"WHERE rowid <= {split}"
                        )
                    except Exception as exc:  # report any failure to the parent
                        payload = exc
                        code = 1
                    pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
            finally:
                os._exit(code)
        os.close(wfd)
        self._cache["runtime_future"] = (pid, rfd, split)

    def name_durations(self, table: str, name_col: str) -> tuple[np.ndarray, np.ndarray]:
        """(name id, end - start) of every row, read as one packed value per row.

        For a report that needs nothing else (cuda_gpu_kern_sum, cuda_api_sum run on their
        own): a quarter of the values of the full table load.  Uses the full load when it
        is already cached or when the values do not fit the packing.
        """
        full = {KERNEL: "kernels:False", RUNTIME: "runtime"}.get(table)
        cached = self._cache.get(full) if full else None
        if (
            cached is None
            and not self.prefer_full
            and (
                table != RUNTIME
                or not ({"runtime_future", "runtime_thread"} & self._cache.keys())
            )
        ):
            cols = self.packed_columns(table, {}, [("name", name_col, "dur", "end - start")])
            return cols["name"], cols["dur"]
        c = self.kernels() if table == KERNEL else self.runtime()
        return (c["name"] if table == KERNEL else c["nameId"]), c["end"] - c["start"]

    def memcpy(self) -> Columns:
        if "memcpy" not in self._cache:
            self._cache["memcpy"] = self.int_columns(
                MEMCPY,
                {
                    "start": "start",
                    "end": "end",
                    "correlationId": "correlationId",
                    "globalPid": "globalPid",
                    "bytes": "bytes",
                    "copyKind": "copyKind",
                    "deviceId": "deviceId",
                },
            )
        return self._cache["memcpy"]  # type: ignore[return-value]

    def memset(self) -> Columns:
        if "memset" not in self._cache:
            self._cache["memset"] = self.int_columns(
                MEMSET,
                {
                    "start": "start",
                    "end": "end",
                    "correlationId": "correlationId",
                    "globalPid": "globalPid",
                    "bytes": "bytes",
                    "deviceId": "deviceId",
                },
            )
        return self._cache["memset"]  # type: ignore[return-value]

    def memcpy_labels(self) -> dict[int, str]:
        if not self.has("ENUM_CUDA_MEMCPY_OPER"):
            return {}
        return dict(self.query("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER"))

    def nvtx(self) -> NvtxEvents | None:
        """NVTX range events with names resolved as nsys does, or None without NVTX."""
        if "nvtx" in self._cache:
            return self._cache["nvtx"]  # type: ignore[return-value]
        result = self._load_nvtx() if self.has(NVTX) else None
        self._cache["nvtx"] = result
        return result

    def _load_nvtx(self) -> NvtxEvents:
        """Range events: integer columns as arrays, names built once per distinct
        (textId, text, domainId, process) combination."""
        cols = self.columns_of(NVTX)
        types = ",".join(str(t) for t in NVTX_RANGE_TYPES)
        where = f"WHERE eventType IN ({types})"

        def col(c: str) -> str:
            return c if c in cols else "NULL"

        data = self.int_columns(
            NVTX,
            {
                "rowid": "rowid",
                "start": "start",
                "end": "end",
                "eventType": "eventType",
                "globalTid": "globalTid",
                "endGlobalTid": col("endGlobalTid"),
                "textId": col("textId"),
                "domainId": col("domainId"),
            },
            where,
            nullable=("endGlobalTid", "textId", "domainId"),
        )
        max_ts = self.query("SELECT max(max(start), max(end)) FROM NVTX_EVENTS")[0][0]
        rmin, rmax = _sql_min_max(data["start"], data["end"])
        n = data["rowid"].size
        # per row: index of its text among the distinct texts (0 = NULL)
        text_code = np.zeros(n, np.int64)
        texts: list[str | None] = [None]
        if "text" in cols:
            rows = self.query(f"SELECT rowid, text FROM NVTX_EVENTS {where} AND text IS NOT NULL")
            if rows:
                index: dict[str, int] = {}
                ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
                code = np.fromiter(
                    (index.setdefault(r[1], len(index) + 1) for r in rows), np.int64, len(rows)
                )
                texts += list(index)
                text_code[np.searchsorted(data["rowid"], ids)] = code  # rowid order
        gtid = data["globalTid"]
        pid = np.where(gtid == NULL, NULL, gtid & PID_BITS)
        keys = [data["textId"], text_code, data["domainId"], pid]
        inverse = []
        uniques = []
        for k in keys:
            u, inv = np.unique(k, return_inverse=True)
            uniques.append(u)
            inverse.append(inv.reshape(-1).astype(np.int64))
        combo, first = dense_codes(*inverse)
        strings = self.strings
        domains = nvtx_domains(self.con, cols, strings, self.nsys_version)

        def opt(v: int) -> int | None:
            return None if v == NULL else v

        names: list[str | None] = []
        name_index: dict[str | None, int] = {}
        combo_name = np.empty(first.size, np.int64)
        for c, row in enumerate(first.tolist()):
            tid_, tcode, dom, p = (
                int(u[inv[row]]) for u, inv in zip(uniques, inverse, strict=True)
            )
            name = range_name(
                opt(tid_), texts[tcode], opt(dom), opt(p), strings, domains, self.nsys_version
            )
            combo_name[c] = name_index.setdefault(name, len(names))
            if combo_name[c] == len(names):
                names.append(name)
        return NvtxEvents(
            start=data["start"],
            end=data["end"],
            event_type=data["eventType"],
            global_tid=gtid,
            end_global_tid=data["endGlobalTid"],
            rowid=data["rowid"],
            name_code=combo_name[combo] if n else np.empty(0, np.int64),
            names=names,
            max_ts=max_ts,
            range_max_ts=rmax,
            range_min_ts=rmin,
        )

    def gpu_info(self) -> dict[int, dict[str, object]]:
        """TARGET_INFO_GPU rows keyed by CUDA device id (``id``/``cuDevice``)."""
        if not self.has("TARGET_INFO_GPU"):
            return {}
        cols = sorted(self.columns_of("TARGET_INFO_GPU"))
        rows = self.query(f"SELECT {', '.join(cols)} FROM TARGET_INFO_GPU")
        out: dict[int, dict[str, object]] = {}
        for row in rows:
            info = dict(zip(cols, row, strict=True))
            dev = info.get("cuDevice", info.get("id"))
            out[int(dev) if dev is not None else len(out)] = info
        return out

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Export:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sql_min_max(a: np.ndarray, b: np.ndarray) -> tuple[int | None, int | None]:
    """SQL ``min(min(a), min(b)), max(max(a), max(b))`` (NULL when either column is)."""
    va, vb = a[a != NULL], b[b != NULL]
    if not va.size or not vb.size:
        return None, None
    return min(int(va.min()), int(vb.min())), max(int(va.max()), int(vb.max()))


def _receive(path: Path, pid: int, rfd: int) -> Columns:
    """Read the prefetched API table from the child process."""
    try:
        with os.fdopen(rfd, "rb") as fh:
            payload = pickle.load(fh)
    except (EOFError, pickle.UnpicklingError) as exc:
        raise ExportError(path, f"reading CUDA API rows failed ({exc})") from exc
    finally:
        os.waitpid(pid, 0)
    if isinstance(payload, ExportError):
        raise payload
    if isinstance(payload, Exception):
        raise ExportError(path, f"reading CUDA API rows failed ({payload})")
    return payload  # type: ignore[no-any-return]


def _parse(text: bytes) -> np.ndarray:
    # np.fromstring's text mode is the fastest integer parser numpy ships.
    return np.fromstring(text, dtype=np.int64, sep=",")  # type: ignore[call-overload]
