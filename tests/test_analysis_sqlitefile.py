"""The direct SQLite file reader (analysis.reading.sqlitefile) returns what SQL returns, or None."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from analysis.reading.sqlitefile import NULL, read_columns
from tests.analysis_fixtures import H100

TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
)


def _sql(con: sqlite3.Connection, table: str, cols: list[str]) -> dict[str, np.ndarray]:
    rows = con.execute(f"SELECT {', '.join(cols)} FROM {table} ORDER BY rowid").fetchall()
    return {
        c: np.array([NULL if r[i] is None else r[i] for r in rows], np.int64)
        for i, c in enumerate(cols)
    }


def _check(path: Path, table: str, cols: list[str]) -> None:
    con = sqlite3.connect(path)
    got = read_columns(path, con, table, cols)
    assert got is not None, f"{path.name}:{table} not read"
    want = _sql(con, table, cols)
    for c in cols:
        np.testing.assert_array_equal(got[c], want[c], err_msg=f"{path.name}:{table}.{c}")
    con.close()


@pytest.mark.parametrize("path", sorted(H100.glob("*.sqlite")), ids=lambda p: p.stem)
def test_activity_tables_match_sql(path: Path) -> None:
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for table in TABLES:
        if table in tables:
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
            _check(path, table, cols)
    con.close()


@pytest.mark.parametrize("page_size", [512, 4096, 65536])
def test_synthetic_values_and_deep_btree(tmp_path: Path, page_size: int) -> None:
    """Every integer width, NULL, the constants 0/1, negatives; a tree several levels deep."""
    path = tmp_path / "t.sqlite"
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size={page_size}")
    con.execute("CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER, note TEXT, d INTEGER)")
    rnd = random.Random(page_size)
    widths = [0, 1, 2, 3, 4, 6, 8]
    rows = []
    for i in range(20000):
        vals = []
        for _ in range(3):
            w = rnd.choice(widths)
            if w == 0:
                vals.append(rnd.choice([None, 0, 1]))
            else:
                lim = 2 ** (8 * w - 1)
                vals.append(rnd.randrange(-lim, lim))
        rows.append((*vals, "x" * rnd.randrange(0, 300) if i % 7 else None, i - 10000))
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
    con.execute("DELETE FROM t WHERE rowid % 13 = 0")  # gaps, freed space
    con.commit()
    _check(path, "t", ["a", "b", "c"])
    _check(path, "t", ["c", "a"])
    # a text column before the requested one: declined (SQL reads it)
    assert read_columns(path, con, "t", ["d"]) is None
    con.close()


def test_integer_primary_key_and_empty_table(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE s (id INTEGER PRIMARY KEY, v INTEGER)")
    con.executemany("INSERT INTO s VALUES (?, ?)", [(i * 3, -i) for i in range(5000)])
    con.execute("CREATE TABLE e (x INTEGER)")
    con.commit()
    _check(path, "s", ["id", "v"])
    got = read_columns(path, con, "e", ["x"])
    assert got is not None and got["x"].size == 0
    con.close()


def test_declines_what_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE f (x REAL, y INTEGER)")
    con.execute("INSERT INTO f VALUES (1.5, 2)")
    con.execute("CREATE TABLE w (x INTEGER PRIMARY KEY, y INTEGER) WITHOUT ROWID")
    con.execute("INSERT INTO w VALUES (1, 2)")
    con.commit()
    assert read_columns(path, con, "f", ["x"]) is None  # float
    assert read_columns(path, con, "w", ["y"]) is None  # WITHOUT ROWID
    assert read_columns(path, con, "f", ["nope"]) is None  # unknown column
    assert read_columns(path, con, "missing", ["x"]) is None
    con.close()
    trunc = tmp_path / "trunc.sqlite"
    trunc.write_bytes(path.read_bytes()[:1500])
    con = sqlite3.connect(trunc)
    try:
        assert read_columns(trunc, con, "f", ["y"]) is None
    except sqlite3.DatabaseError:
        pass  # reading the schema of the truncated file already fails
    con.close()
