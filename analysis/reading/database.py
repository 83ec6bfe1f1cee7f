"""An Nsight Systems SQLite export opened read-only: SQL queries, schema and strings.

Every SQLite error becomes an :class:`ExportError` naming the file, so a corrupt or
truncated export fails with one line, not a traceback.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from analysis.reading.errors import ExportError

# Tables that every nsys export has, used to tell an nsys export from any other SQLite DB.
NSYS_MARKERS = ("StringIds", "TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT")


def connect(path: Path) -> tuple[sqlite3.Connection, set[str]]:
    """Open an nsys export read-only; ExportError naming the file if it is not one."""
    if not path.exists():
        raise ExportError(path, "file does not exist")
    if not path.is_file():
        raise ExportError(path, "not a file")
    # SQLite URI: only "%", "?" and "#" need escaping in the path
    quoted = os.path.realpath(path).replace("%", "%25").replace("?", "%3f").replace("#", "%23")
    uri = f"file:{quoted}?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        con.execute("PRAGMA cache_size=-65536")
        rows = con.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
        ).fetchall()
    except sqlite3.Error as exc:
        raise ExportError(path, f"not a readable SQLite database ({exc})") from exc
    tables = {r[0] for r in rows}
    if not any(t in tables for t in NSYS_MARKERS):
        con.close()
        raise ExportError(path, "not an Nsight Systems SQLite export (no StringIds)")
    return con, tables


class Database:
    """The export's SQLite connection, its table names and cached schema look-ups."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.con, self.tables = connect(self.path)
        self._columns: dict[str, set[str]] = {}
        self._notnull: dict[str, set[str]] = {}
        self._strings: dict[int, str] | None = None

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple]:
        try:
            return self.con.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise ExportError(self.path, f"corrupt or truncated export ({exc})") from exc

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns_of(self, table: str) -> set[str]:
        if table not in self._columns:
            rows = self.query("SELECT name FROM pragma_table_info(?)", (table,))
            self._columns[table] = {r[0] for r in rows}
        return self._columns[table]

    def notnull(self, table: str) -> set[str]:
        """Columns declared NOT NULL (their values need no NULL check)."""
        if table not in self._notnull:
            rows = self.query('SELECT name FROM pragma_table_info(?) WHERE "notnull"', (table,))
            self._notnull[table] = {r[0] for r in rows}
        return self._notnull[table]

    @property
    def strings(self) -> dict[int, str]:
        """StringIds: id -> value (kernel, API and NVTX names)."""
        if self._strings is None:
            rows = self.query("SELECT id, value FROM StringIds") if self.has("StringIds") else []
            self._strings = dict(rows)
        return self._strings

    def close(self) -> None:
        self.con.close()
