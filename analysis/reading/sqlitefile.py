"""Read integer columns of an SQLite table straight from the database file, vectorized.

Why: the CUDA API and kernel tables of a large export hold millions of values; even with
one ``group_concat`` per column, SQLite spends ~0.1 µs per value stepping its VM and
formatting numbers.  The file format (https://www.sqlite.org/fileformat2.html) is simple
enough to decode with a few numpy passes per column: walk the table's B-tree to its leaf
pages, take every cell's record header (varint serial types) and gather the big-endian
integers.  This is ~5x faster than the SQL path.

Only what nsys exports need is supported: rowid tables whose requested columns hold
integers or NULL, cells without overflow pages, no WAL.  Anything else (or anything that
does not look like a well-formed page) returns None and the caller uses SQL, which also
reports corrupt files properly.
"""

from __future__ import annotations

import mmap
import os
import sqlite3
from collections.abc import Callable

import numpy as np

NULL = np.iinfo(np.int64).min  # same sentinel as analysis.export

# content size of integer serial types; 0 = NULL, 8/9 = constants 0/1, 7 (float),
# 10/11 (reserved) and >= 12 (blob/text) are not integers
_SIZE = np.array([0, 1, 2, 3, 4, 6, 8, 8, 0, 0], np.int64)
# right shift turning the 8 bytes read at a value's position into the value
_SHIFT = np.array([0, 56, 48, 40, 32, 16, 0, 0, 0, 0], np.int64)


class Unsupported(Exception):
    """The table cannot be read this way (use SQL)."""


def read_columns(
    path: str | os.PathLike[str], con: sqlite3.Connection, table: str, names: list[str]
) -> dict[str, np.ndarray] | None:
    """Integer columns ``names`` of ``table`` in rowid order (NULL -> ``NULL``), or None."""
    decode = prepare(path, con, table, names)
    return decode() if decode is not None else None


def prepare(
    path: str | os.PathLike[str], con: sqlite3.Connection, table: str, names: list[str]
) -> Callable[[], dict[str, np.ndarray] | None] | None:
    """Two steps of :func:`read_columns`: the schema look-ups (SQL, on ``con``) now, or
    None; the returned function decodes the file (numpy only, no SQLite: it may run in
    another thread, and numpy releases the GIL in its array loops) and returns the
    columns or None."""
    try:
        step = _read(os.fspath(path), con, table, names)
    except (Unsupported, sqlite3.Error, OSError, IndexError, ValueError, OverflowError):
        return None

    def decode() -> dict[str, np.ndarray] | None:
        try:
            return step()
        except (Unsupported, OSError, IndexError, ValueError, OverflowError, MemoryError):
            return None

    return decode


class _File:
    """The database file as bytes, with big-endian views at every byte offset."""

    def __init__(self, path: str) -> None:
        size = os.path.getsize(path)
        if size < 1024:
            raise Unsupported("empty file")
        with open(path, "rb") as fh:
            self.mm = mm = np.frombuffer(
                mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), np.uint8
            )
        self.size = size
        # unaligned views: u2[i] / u4[i] / i8[i] = the integer starting at byte i
        self.u2 = np.ndarray((size - 1,), ">u2", buffer=mm, strides=(1,))
        self.u4 = np.ndarray((size - 3,), ">u4", buffer=mm, strides=(1,))
        # native-order view: a gather then swaps the bytes of its copy in place
        self.i8 = np.ndarray((size - 7,), np.int64, buffer=mm, strides=(1,))
        #: whether positions near the file end (< 8 bytes left) can occur: set per chunk
        self.tail = True

    def word(self, pos: np.ndarray) -> np.ndarray:
        """The 8 bytes at ``pos`` as a big-endian int64 (zero-padded past the file end)."""
        if not self.tail or not pos.size or int(pos.max()) <= self.size - 8:
            w = self.i8[pos]
            w.byteswap(inplace=True)
            return w
        start = np.minimum(pos, self.size - 8)
        w = self.i8[start]
        w.byteswap(inplace=True)
        w <<= 8 * (pos - start)
        return w

    def varint(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray | int]:
        """(value, length) of the SQLite varints at ``pos``; values stay uint8 and the
        length is the scalar 1 when every varint is one byte (the usual case)."""
        b = self.mm[pos]
        if pos.size == 0 or int(b.max()) < 0x80:
            return b, 1
        w = self.word(pos)
        val = (b & 0x7F).astype(np.int64)
        length = np.ones(pos.shape, np.int64)
        more = b >= 0x80
        for k in range(1, 8):
            if not more.any():
                return val, length
            byte = (w >> (56 - 8 * k)) & 0xFF
            np.copyto(val, (val << 7) | (byte & 0x7F), where=more)
            length += more
            more &= byte >= 0x80
        if more.any():
            raise Unsupported("varint longer than 8 bytes")
        return val, length


def _read(
    path: str, con: sqlite3.Connection, table: str, names: list[str]
) -> Callable[[], dict[str, np.ndarray]]:
    if os.path.exists(path + "-wal") and os.path.getsize(path + "-wal") > 0:
        raise Unsupported("WAL")
    row = con.execute(
        "SELECT rootpage, sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    if row is None or not row[0] or "WITHOUT ROWID" in (row[1] or "").upper():
        raise Unsupported("not a rowid table")
    root = int(row[0])
    info = con.execute(f"PRAGMA table_xinfo({table})").fetchall()  # cid, name, type, ., ., pk
    if any(r[6] for r in info):  # hidden / generated columns: record layout differs
        raise Unsupported("generated columns")
    cols = [r[1] for r in info]
    pks = [r for r in info if r[5]]
    ipk = pks[0][1] if len(pks) == 1 and (pks[0][2] or "").upper() == "INTEGER" else None
    want = {n: cols.index(n) for n in names}  # ValueError for an unknown column
    return lambda: _decode_table(path, root, cols, ipk, want)


def _decode_table(
    path: str, root: int, cols: list[str], ipk: str | None, want: dict[str, int]
) -> dict[str, np.ndarray]:
    f = _File(path)
    mm = f.mm
    page_size = int(f.u2[16])
    page_size = 65536 if page_size == 1 else page_size
    usable = page_size - int(mm[20])
    if page_size < 512 or f.size % page_size:
        raise Unsupported("page size")
    n_pages = f.size // page_size

    def header(pages: np.ndarray) -> np.ndarray:
        if pages.size and (int(pages.min()) < 1 or int(pages.max()) > n_pages):
            raise Unsupported("page number out of range")
        return (pages - 1) * page_size + np.where(pages == 1, 100, 0)

    def cells(pages: np.ndarray, hdr: np.ndarray, ptrs: int) -> tuple[np.ndarray, np.ndarray]:
        """(file offset of every cell in page order, owning page's index)."""
        ncell = f.u2[hdr + 3].astype(np.int64)
        total = int(ncell.sum())
        rep = np.repeat(np.arange(pages.size), ncell)
        k = np.arange(total) - (np.cumsum(ncell) - ncell)[rep]
        ptr = f.u2[hdr[rep] + ptrs + 2 * k].astype(np.int64)
        if total and (int(ptr.min()) < 8 or int(ptr.max()) >= usable):
            raise Unsupported("cell pointer")
        return (pages[rep] - 1) * page_size + ptr, rep

    # walk the B-tree level by level (all leaves are at the same depth)
    pages = np.array([root], np.int64)
    for _ in range(64):
        hdr = header(pages)
        kind = mm[hdr]
        if (kind == 0x0D).all():
            break
        if not (kind == 0x05).all():
            raise Unsupported("unexpected page type")
        cell, rep = cells(pages, hdr, 12)
        # children in key order: each page's left children, then its right-most child
        children = np.empty(cell.size + pages.size, np.int64)
        is_right = np.zeros(children.size, bool)
        is_right[np.cumsum(np.bincount(rep, minlength=pages.size) + 1) - 1] = True
        children[~is_right] = f.u4[cell]
        children[is_right] = f.u4[hdr + 8]
        pages = children
    else:
        raise Unsupported("B-tree too deep")
    # leaf pages, decoded in chunks of about CHUNK cells (bounded temporaries, cache-sized)
    hdr = header(pages)
    ncell = f.u2[hdr + 3].astype(np.int64)
    bounds = np.cumsum(ncell)
    total = int(bounds[-1]) if bounds.size else 0
    last = max(want.values(), default=-1)
    out = {c: np.empty(total, np.int64) for c in want}
    cut = np.searchsorted(bounds, np.arange(CHUNK, total, CHUNK), "right")
    lo = 0
    for a, b in zip(np.r_[0, cut].tolist(), np.r_[cut, pages.size].tolist(), strict=True):
        if a == b:
            continue
        cell, rep = cells(pages[a:b], hdr[a:b], 8)
        if not cell.size:
            continue
        page_end = (pages[a:b][rep] - 1) * page_size + usable
        del rep
        hi = lo + cell.size
        # values lie before their page's end: only the file's last page needs padding
        f.tail = int(page_end.max()) + 8 > f.size
        _decode(f, cell, page_end, usable, last, want, cols, ipk, out, lo, hi)
        lo = hi
    return out


CHUNK = 1 << 20


def _decode(
    f: _File,
    cell: np.ndarray,
    page_end: np.ndarray,
    usable: int,
    last: int,
    want: dict[str, int],
    cols: list[str],
    ipk: str | None,
    out: dict[str, np.ndarray],
    lo: int,
    hi: int,
) -> None:
    """Decode the records of ``cell`` (leaf cell offsets) into ``out[c][lo:hi]``."""
    payload, n1 = f.varint(cell)
    if int(payload.max()) > usable - 35 or int(payload.min()) < 1:
        raise Unsupported("overflow pages")
    pos = cell + n1
    rowid, n2 = f.varint(pos)
    rec = pos + n2
    end = rec + payload
    if int((end - page_end).max()) > 0:
        raise Unsupported("cell beyond page")
    del cell, pos, page_end
    hsize, n3 = f.varint(rec)
    cur = rec + n3
    offset = rec + hsize
    if int((offset - cur).min()) < last + 1:
        raise Unsupported("record without all columns (ALTER TABLE ADD COLUMN) or long types")
    word = cur
    for j in range(last + 1):
        # serial types are one-byte varints for integer columns: 8 per word read
        if j % 8 == 0:
            word = f.word(cur + j)
        st = (word >> (56 - 8 * (j % 8))) & 0xFF
        if int(st.max()) > 9:
            raise Unsupported("not an integer column (or multi-byte serial type)")
        targets = [c for c, idx in want.items() if idx == j]
        if targets:
            if (st == 7).any():
                raise Unsupported("float value")
            values = rowid if cols[j] == ipk else _ints(f, offset, st)
            for c in targets:
                out[c][lo:hi] = values
        if j < last:
            offset = offset + _SIZE[st]
    if last >= 0 and int((offset - end).max()) > 0:
        raise Unsupported("record longer than its cell")


def _ints(f: _File, pos: np.ndarray, st: np.ndarray) -> np.ndarray:
    """Values of integer serial types ``st`` (0..9, not 7) whose content starts at ``pos``.

    The 8 bytes at each position are read as one big-endian int64 and shifted right to
    keep the value's own bytes (an arithmetic shift, so it also sign-extends).
    """
    raw = f.word(pos)
    if not st.size:
        return raw
    lo, hi = int(st.min()), int(st.max())
    if lo == hi:  # one integer width for the whole column: scalar shift
        raw >>= int(_SHIFT[lo])
    else:
        raw >>= _SHIFT[st]
    if lo == 0 or hi >= 8:  # NULL and the constants 0 / 1
        raw[st == 8] = 0
        raw[st == 9] = 1
        raw[st == 0] = NULL
    return raw
