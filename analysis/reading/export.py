"""One Nsight Systems SQLite export, read table by table into numpy arrays.

:class:`Export` knows which tables and columns the analysis needs and caches them; how a
column is read is its collaborators' business: :class:`~analysis.reading.database.Database`
(the connection, schema, StringIds), :class:`~analysis.reading.columns.ColumnReader`
(the page decoder, SQL otherwise) and :mod:`analysis.reading.prefetch` (the CUDA API
table loaded in the background).

Schema differences handled here (nsys 2024.x vs 2025.x): tables that are absent when
nothing was traced (CPU-only capture), optional columns (``shortName``, ``endGlobalTid``,
``textId``, ``domainId``), NVTX names stored inline (``text``) or via ``StringIds``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from analysis.reading import nvtxnames
from analysis.reading.codes import densify
from analysis.reading.columns import ColumnReader, Columns
from analysis.reading.database import Database
from analysis.reading.prefetch import InChild, InThread
from analysis.reading.sqlitefile import NULL

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX = nvtxnames.NVTX

# NVTX event types (ENUM_NSYS_EVENT_TYPE)
NVTX_PUSHPOP = 59
NVTX_STARTEND = 60
NVTXT_PUSHPOP = 70
NVTXT_STARTEND = 71
NVTX_RANGE_TYPES = (NVTX_PUSHPOP, NVTX_STARTEND, NVTXT_PUSHPOP, NVTXT_STARTEND)
NVTX_PUSHPOP_TYPES = (NVTX_PUSHPOP, NVTXT_PUSHPOP)

#: NVTX range naming of the reference nsys version (see analysis.reading.nvtxnames)
NSYS_VERSIONS = ("2025", "2024")

_RUNTIME_PLAIN = {"start": "start", "end": "end", "globalTid": "globalTid"}
_RUNTIME_PAIRS = [("nameId", "nameId", "correlationId", "correlationId")]
_MEMOP_COLUMNS = ("start", "end", "correlationId", "globalPid", "bytes", "deviceId")


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


class Export:
    """One nsys SQLite export opened read-only; tables are loaded lazily and cached.

    ``nsys_version`` selects how NVTX range names are printed: "2025" (the reference,
    Nsight Systems 2025.3.1) or "2024" (2024.2.3).  ``read_pages``: decode the big tables
    from the file's pages (default, unless ``PROFBENCH_ANALYSIS_SQL_ONLY`` is set) or
    always use SQL (False).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        nsys_version: str = "2025",
        read_pages: bool | None = None,
    ) -> None:
        if nsys_version not in NSYS_VERSIONS:
            raise ValueError(f"nsys_version must be one of {NSYS_VERSIONS}")
        self.nsys_version = nsys_version
        self.db = Database(path)
        self.path = self.db.path
        self.columns = ColumnReader(self.db, read_pages)
        self._cache: dict[str, object] = {}
        self._runtime_job: InThread | tuple[InChild, int] | None = None
        #: set when several reports run: load whole tables once instead of per report
        self.prefer_full = False
        #: set when the extras will run: read the kernels' launch configuration with the
        #: first kernel read (one pass over the table instead of two)
        self.with_launch_config = False
        # Touch every table we may read so that truncation is reported up front.
        for table in (KERNEL, RUNTIME, MEMCPY, MEMSET, NVTX, "StringIds"):
            if self.has(table):
                self.db.query(f"SELECT max(rowid) FROM {table}")

    def has(self, table: str) -> bool:
        return self.db.has(table)

    @property
    def strings(self) -> dict[int, str]:
        return self.db.strings

    def names_for(self, ids: np.ndarray) -> tuple[np.ndarray, list[str | None]]:
        """Map string ids to (codes, unique names); equal strings share one code."""
        if ids.size == 0:
            return np.empty(0, np.int64), []
        lo = int(ids.min())
        inv, rep = densify(ids - lo, int(ids.max()) - lo + 1)
        strings = self.strings
        names: list[str | None] = []
        index: dict[str | None, int] = {}
        remap = np.empty(rep.size, np.int64)
        for i, sid in enumerate(ids[rep].tolist()):
            name = strings.get(sid)
            code = index.get(name)
            if code is None:
                code = index[name] = len(names)
                names.append(name)
            remap[i] = code
        return remap[inv].astype(np.int64), names

    def _cached(self, key: str, load: Callable[[], Columns]) -> Columns:
        if key not in self._cache:
            self._cache[key] = load()
        return self._cache[key]  # type: ignore[return-value]

    # -- GPU activity ----------------------------------------------------------------------
    def kernels(self, launch_config: bool = False) -> Columns:
        """Kernel rows: start, end, globalPid, name (demangled), correlationId; with
        ``launch_config`` also device, stream, grid, block, registers, shared memory."""
        full = launch_config or self.with_launch_config or "kernels:True" in self._cache
        return self._cached(f"kernels:{full}", lambda: self._load_kernels(full))

    def _load_kernels(self, launch_config: bool) -> Columns:
        cols = self.db.columns_of(KERNEL) if self.has(KERNEL) else set()
        exprs = {"start": "start", "end": "end", "globalPid": "globalPid"}
        if launch_config:
            exprs.update(
                deviceId="deviceId" if "deviceId" in cols else "0",
                streamId="streamId" if "streamId" in cols else "0",
                gridX="gridX", gridY="gridY", gridZ="gridZ",
                blockX="blockX", blockY="blockY", blockZ="blockZ",
                regs="registersPerThread",
                staticSmem="staticSharedMemory", dynamicSmem="dynamicSharedMemory",
            )  # fmt: skip
        pairs = [("name", "demangledName", "correlationId", "correlationId")]
        return self.columns.packed_columns(KERNEL, exprs, pairs)

    def memcpy(self) -> Columns:
        exprs = {c: c for c in (*_MEMOP_COLUMNS, "copyKind")}
        return self._cached("memcpy", lambda: self.columns.int_columns(MEMCPY, exprs))

    def memset(self) -> Columns:
        exprs = {c: c for c in _MEMOP_COLUMNS}
        return self._cached("memset", lambda: self.columns.int_columns(MEMSET, exprs))

    def memcpy_labels(self) -> dict[int, str]:
        if not self.has("ENUM_CUDA_MEMCPY_OPER"):
            return {}
        return dict(self.db.query("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER"))

    # -- CUDA API --------------------------------------------------------------------------
    def runtime(self) -> Columns:
        """CUDA API rows: start, end, globalTid, nameId, correlationId (rowid order)."""
        job, self._runtime_job = self._runtime_job, None
        if isinstance(job, InThread):
            data = job.result()
            if data is not None:
                self._cache["runtime"] = data
        elif job is not None:
            child, split = job
            # this process reads the rows after the child's share meanwhile
            tail = self._load_runtime(f"WHERE rowid > {split}")
            head = child.result()
            self._cache["runtime"] = {k: np.concatenate([head[k], tail[k]]) for k in head}
        return self._cached("runtime", self._load_runtime)

    def _load_runtime(self, where: str = "") -> Columns:
        return self.columns.packed_columns(RUNTIME, _RUNTIME_PLAIN, _RUNTIME_PAIRS, where)

    def prefetch_runtime(self, min_rows: int = 200_000) -> None:
        """Start loading the CUDA API table while this process reads the other tables.

        Decoded from the file in a thread where the page decoder serves it; on the SQL
        path a forked child reads the first rows (no-op for small tables or without fork).
        """
        if "runtime" in self._cache or self._runtime_job is not None or not self.has(RUNTIME):
            return
        plan = self.columns.page_plan(
            RUNTIME, {**_RUNTIME_PLAIN, "nameId": "nameId", "correlationId": "correlationId"}
        )
        if plan is not None:
            self._runtime_job = InThread(plan)
            return
        if not hasattr(os, "fork"):
            return
        n_api = self.db.query(f"SELECT max(rowid) FROM {RUNTIME}")[0][0] or 0
        if n_api < min_rows:
            return
        # Balance the two processes: this one also reads the kernel and NVTX tables (a
        # kernel row costs about as much as an API row), so it takes the API rows after
        # ``split`` and the child the ones before.
        n_kern = 0
        if self.has(KERNEL):
            n_kern = self.db.query(f"SELECT max(rowid) FROM {KERNEL}")[0][0] or 0
        split = min(n_api, int((n_kern + n_api) / 2 * 1.05))
        path, version = self.path, self.nsys_version

        def head() -> Columns:  # in the child: a connection of its own
            return Export(path, version)._load_runtime(f"WHERE rowid <= {split}")

        self._runtime_job = (InChild(path, head), split)

    def name_durations(self, table: str, name_col: str) -> tuple[np.ndarray, np.ndarray]:
        """(name id, end - start) of every row, read as one packed value per row.

        For a report that needs nothing else (cuda_gpu_kern_sum, cuda_api_sum run on their
        own): a quarter of the values of the full table load.  Uses the full load when it
        is already cached, prefetching or wanted anyway (``prefer_full``).
        """
        cached = {KERNEL: ("kernels:False", "kernels:True"), RUNTIME: ("runtime",)}.get(table, ())
        loading = table == RUNTIME and self._runtime_job is not None
        if not (self._cache.keys() & set(cached) or self.prefer_full or loading):
            pair = [("name", name_col, "dur", "end - start")]
            cols = self.columns.packed_columns(table, {}, pair)
            return cols["name"], cols["dur"]
        c = self.kernels() if table == KERNEL else self.runtime()
        return (c["name"] if table == KERNEL else c["nameId"]), c["end"] - c["start"]

    # -- NVTX ------------------------------------------------------------------------------
    def nvtx(self) -> NvtxEvents | None:
        """NVTX range events with names resolved as nsys does, or None without NVTX."""
        if "nvtx" not in self._cache:
            self._cache["nvtx"] = self._load_nvtx() if self.has(NVTX) else None
        return self._cache["nvtx"]  # type: ignore[return-value]

    def _load_nvtx(self) -> NvtxEvents:
        where = f"WHERE eventType IN ({','.join(str(t) for t in NVTX_RANGE_TYPES)})"
        optional = ("endGlobalTid", "textId", "domainId")
        exprs = {c: c for c in ("rowid", "start", "end", "eventType", "globalTid")}
        exprs.update({c: nvtxnames.column_or_null(self.db, c) for c in optional})
        data = self.columns.int_columns(NVTX, exprs, where, nullable=optional)
        max_ts = self.db.query(f"SELECT max(max(start), max(end)) FROM {NVTX}")[0][0]
        rmin, rmax = _sql_min_max(data["start"], data["end"])
        text_code, texts = nvtxnames.text_codes(self.db, where, data["rowid"])
        name_code, names = nvtxnames.name_codes(
            self.db, self.nsys_version, data["textId"], data["domainId"], data["globalTid"],
            text_code, texts,
        )  # fmt: skip
        return NvtxEvents(
            start=data["start"],
            end=data["end"],
            event_type=data["eventType"],
            global_tid=data["globalTid"],
            end_global_tid=data["endGlobalTid"],
            rowid=data["rowid"],
            name_code=name_code,
            names=names,
            max_ts=max_ts,
            range_max_ts=rmax,
            range_min_ts=rmin,
        )

    # -- GPU description -------------------------------------------------------------------
    def gpu_info(self) -> dict[int, dict[str, object]]:
        """TARGET_INFO_GPU rows keyed by CUDA device id (``id``/``cuDevice``)."""
        if not self.has("TARGET_INFO_GPU"):
            return {}
        cols = sorted(self.db.columns_of("TARGET_INFO_GPU"))
        rows = self.db.query(f"SELECT {', '.join(cols)} FROM TARGET_INFO_GPU")
        out: dict[int, dict[str, object]] = {}
        for row in rows:
            info = dict(zip(cols, row, strict=True))
            dev = info.get("cuDevice", info.get("id"))
            out[int(dev) if dev is not None else len(out)] = info
        return out

    def product_version(self) -> str | None:
        """The Nsight Systems version that exported this file (META_DATA_EXPORT)."""
        if not self.has("META_DATA_EXPORT"):
            return None
        rows = self.db.query(
            "SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PRODUCT_VERSION'"
        )
        return str(rows[0][0]) if rows else None

    def close(self) -> None:
        self.db.close()

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
