"""Integer columns of an export table as int64 arrays: from the file's pages, else by SQL.

Why not ``pd.read_sql``: building one Python object per cell dominates the run time of
large exports.  Whole tables are decoded from the database file itself
(:mod:`analysis.reading.sqlitefile`, the page decoder); otherwise (a ``WHERE`` clause,
the NVTX table, or whatever the decoder declines) every column is fetched with one
``group_concat`` inside a single table scan (SQLite formats the numbers in C) and parsed
by numpy.  NULLs become the sentinel :data:`NULL`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from analysis.reading import sqlitefile
from analysis.reading.database import Database
from analysis.reading.errors import ExportError
from analysis.reading.sqlitefile import NULL

Columns = dict[str, np.ndarray]
#: (hi_name, hi_expr, lo_name, lo_expr): two small ids read as one packed value
Pair = tuple[str, str, str, str]


class EventArrays:
    """Events held as parallel arrays, one per field, all as long as ``start``."""

    start: np.ndarray

    @property
    def size(self) -> int:
        return int(self.start.size)


def _unpacked(plain: dict[str, str], pairs: Sequence[Pair]) -> dict[str, str]:
    exprs = dict(plain)
    for hn, he, ln, le in pairs:
        exprs[hn] = he
        exprs[ln] = le
    return exprs


class ColumnReader:
    """Reads integer expressions of one export's tables into arrays.

    ``read_pages``: decode whole tables from the file (default unless the environment
    sets ``PROFBENCH_ANALYSIS_SQL_ONLY``); False: always SQL.
    """

    def __init__(self, db: Database, read_pages: bool | None = None) -> None:
        self.db = db
        if read_pages is None:
            read_pages = os.environ.get("PROFBENCH_ANALYSIS_SQL_ONLY", "") == ""
        self.read_pages = read_pages

    def int_columns(
        self, table: str, exprs: dict[str, str], where: str = "", nullable: Sequence[str] = ()
    ) -> Columns:
        """Integer expressions of ``table`` as int64 arrays (NULL -> ``NULL``).

        SQL path: one table scan; every expression is aggregated with group_concat so
        that SQLite does the number formatting and numpy the parsing.  Columns declared
        NOT NULL are read as is; for the others a count() tells whether NULLs are present,
        and only then is the column re-read through ifnull().  Names in ``nullable``
        (columns that usually hold NULLs) go through ifnull() at once.
        """
        whole = self._without_sql(table, exprs, where)
        if whole is not None:
            return whole
        notnull = self.db.notnull(table)
        aggs = []
        for n, e in exprs.items():
            if n in nullable:
                aggs.append(f"CAST(group_concat(ifnull({e}, {NULL})) AS BLOB)")
            else:
                aggs.append(f"CAST(group_concat({e}) AS BLOB)")
            aggs.append("count(*)" if e in notnull or n in nullable else f"count({e})")
        row = self.db.query(f"SELECT count(*), {', '.join(aggs)} FROM {table} {where}")[0]
        count = row[0]
        out: Columns = {}
        for i, n in enumerate(exprs):
            text, present = row[1 + 2 * i], row[2 + 2 * i]
            if present != count:  # NULLs would be skipped by group_concat: re-read
                text = self.db.query(
                    f"SELECT CAST(group_concat(ifnull({exprs[n]}, {NULL})) AS BLOB) "
                    f"FROM {table} {where}"
                )[0][0]
            out[n] = self._parse(text, count, table, n)
        return out

    def packed_columns(
        self, table: str, plain: dict[str, str], pairs: Sequence[Pair], where: str = ""
    ) -> Columns:
        """Like :meth:`int_columns`, packing pairs of small ids into one value on SQL.

        group_concat's cost is per value, so ``(hi << 40) | lo`` (e.g. name id and
        correlationId) halves the work for that pair.  When a value is NULL, negative or
        too large to pack, the table is re-read unpacked.
        """
        exprs = _unpacked(plain, pairs)
        whole = self._without_sql(table, exprs, where)
        if whole is not None:
            return whole
        packed = self._packed_sql(table, plain, pairs, where)
        return packed if packed is not None else self.int_columns(table, exprs, where)

    def _packed_sql(
        self, table: str, plain: dict[str, str], pairs: Sequence[Pair], where: str
    ) -> Columns | None:
        notnull = self.db.notnull(table)
        aggs: list[str] = []
        for e in plain.values():
            aggs.append(f"CAST(group_concat({e}) AS BLOB)")
            aggs.append("count(*)" if e in notnull else f"count({e})")
        for _hn, he, _ln, le in pairs:
            aggs.append(f"CAST(group_concat(({he} << 40) | {le}) AS BLOB)")
            aggs.append(f"count(({he} << 40) | {le})")
            aggs.append(f"min({he}), max({he}), min({le}), max({le})")
        row = self.db.query(f"SELECT count(*), {', '.join(aggs)} FROM {table} {where}")[0]
        count = row[0]
        out: Columns = {}
        pos = 1
        for n in plain:
            text, present = row[pos], row[pos + 1]
            pos += 2
            if present != count:
                return None
            out[n] = self._parse(text, count, table, n)
        for hn, _he, ln, _le in pairs:
            text, present, hmin, hmax, lmin, lmax = row[pos : pos + 6]
            pos += 6
            fits = not count or (0 <= hmin and hmax < 2**22 and 0 <= lmin and lmax < 2**40)
            if present != count or not fits:
                return None
            packed = self._parse(text, count, table, hn)
            out[hn] = packed >> 40
            out[ln] = packed & (2**40 - 1)
        return out

    def _without_sql(self, table: str, exprs: dict[str, str], where: str) -> Columns | None:
        """Empty columns for an absent table; a whole table from the page decoder; else
        None (read by SQL)."""
        if not self.db.has(table):
            return {n: np.empty(0, np.int64) for n in exprs}
        return None if where else self.from_pages(table, exprs)

    def from_pages(self, table: str, exprs: dict[str, str]) -> Columns | None:
        """Columns decoded from the file's pages, or None (then SQL is used)."""
        plan = self.page_plan(table, exprs)
        return plan() if plan is not None else None

    def page_plan(self, table: str, exprs: dict[str, str]) -> Callable[[], Columns | None] | None:
        """:meth:`from_pages` in two steps: the SQL schema look-ups now (None when the
        decoder cannot serve these expressions), the decoding (numpy only, thread-safe)
        in the returned function.

        Expressions served: a column name, an integer literal or ``end - start``.
        """
        if not self.read_pages:
            return None
        cols = self.db.columns_of(table)
        needed: list[str] = []
        for e in exprs.values():
            if e == "end - start":
                needed += ["start", "end"]
            elif e in cols:
                needed.append(e)
            elif not e.isdigit():
                return None
        decode = sqlitefile.prepare(self.db.path, self.db.con, table, sorted(set(needed)))
        if decode is None:
            return None
        rows = None if needed else self.db.query(f"SELECT count(*) FROM {table}")[0][0]

        def run() -> Columns | None:
            data = decode()
            if data is None:
                return None
            n = next(iter(data.values())).size if data else rows
            return {name: _evaluate(e, data, n) for name, e in exprs.items()}

        return run

    def _parse(self, text: bytes | None, count: int, table: str, name: str) -> np.ndarray:
        if not count or text is None:
            return np.empty(0, np.int64)
        try:
            # np.fromstring's text mode is the fastest integer parser numpy ships
            arr = np.fromstring(text, dtype=np.int64, sep=",")  # type: ignore[call-overload]
        except ValueError:
            arr = np.empty(0, np.int64)
        if arr.size != count:
            raise ExportError(self.db.path, f"unexpected (non-integer) values in {table}.{name}")
        return arr


def _evaluate(expr: str, data: Columns, n: int | None) -> np.ndarray:
    """One expression of :meth:`ColumnReader.page_plan` over the decoded columns."""
    if expr == "end - start":
        start, end = data["start"], data["end"]
        dur = end - start
        dur[(start == NULL) | (end == NULL)] = NULL
        return dur
    if expr in data:
        return data[expr]
    return np.full(n, int(expr), np.int64)
