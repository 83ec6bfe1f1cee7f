"""Protocol Buffers wire format for many messages at once, with numpy.

A trace holds millions of small messages (one per slice begin or end); building each as a
Python protobuf object costs microseconds, so the messages are encoded column by column:
a message is described once as a tree of :class:`Field` whose values are arrays (one value
per message), every message's size is computed from the values, and each field is then
written into one output buffer at every message's offset at once.

The layout is the standard one (https://protobuf.dev/programming-guides/encoding/): a tag
``field << 3 | wire type``, then a varint, 8 little-endian bytes, or a length-prefixed
payload. A field whose ``present`` is False in a row is left out of that row's message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

VARINT, FIXED64, LENGTH = 0, 1, 2


def varint_bytes(value: int) -> bytes:
    """One varint (non-negative ``value``)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint_bytes(number << 3 | wire)


@dataclass
class Field:
    """One field of N messages: a varint or fixed64 per message, or a sub-message."""

    number: int
    wire: int
    values: np.ndarray | int | None = None  # VARINT, FIXED64: one per message, or one for all
    fields: list[Field] = field(default_factory=list)  # LENGTH: the sub-message's fields
    present: np.ndarray | None = None  # bool per message; None: in every message
    _inner: np.ndarray | None = None  # LENGTH: the sub-message's size per message
    _lens: np.ndarray | None = None  # VARINT: each value's size


def varint(number: int, values: np.ndarray | int, present: np.ndarray | None = None) -> Field:
    """Unsigned (or non-negative) integers; an int: the same value in every message."""
    if isinstance(values, int):
        return Field(number, VARINT, values, present=present)
    return Field(number, VARINT, np.asarray(values).astype(np.uint64), present=present)


def fixed64(number: int, values: np.ndarray, present: np.ndarray | None = None) -> Field:
    return Field(number, FIXED64, np.asarray(values).astype("<u8"), present=present)


def message(number: int, fields: list[Field], present: np.ndarray | None = None) -> Field:
    return Field(number, LENGTH, fields=fields, present=present)


_LIMITS = np.array([1 << (7 * k) for k in range(1, 10)], np.uint64)


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes of each value's varint."""
    return np.searchsorted(_LIMITS, values, side="right").astype(np.int64) + 1


def _sizes(f: Field, rows: int) -> np.ndarray:
    """Bytes of the field in each message (tag included; 0 where absent)."""
    if f.wire == VARINT and isinstance(f.values, int):
        body = np.full(rows, len(varint_bytes(f.values)), np.int64)
    elif f.wire == VARINT:
        body = f._lens = varint_sizes(f.values)
    elif f.wire == FIXED64:
        body = np.full(rows, 8, np.int64)
    else:
        inner = np.zeros(rows, np.int64)
        for child in f.fields:
            inner += _sizes(child, rows)
        f._inner = inner
        body = varint_sizes(inner.astype(np.uint64)) + inner
    size = body + len(tag(f.number, f.wire))
    if f.present is not None:
        size[~f.present] = 0
    return size


def _put_bytes(buf: np.ndarray, at: np.ndarray, data: bytes) -> None:
    """The same bytes at every position (``at`` moves past them)."""
    for k, byte in enumerate(data):
        buf[at + k] = byte
    at += len(data)


def _put_varints(buf: np.ndarray, pos: np.ndarray, values: np.ndarray,
                 n: np.ndarray | None = None) -> None:
    """Write each value's varint at its position (``pos`` moves past it); ``n``: their
    sizes, when known."""
    n = varint_sizes(values) if n is None else n
    for k in range(int(n.max(initial=0))):
        sel = np.flatnonzero(n > k)
        byte = (values[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (n[sel] - 1 > k).astype(np.uint64) << np.uint64(7)
        buf[pos[sel] + k] = (byte | more).astype(np.uint8)
    pos += n


def _put(f: Field, buf: np.ndarray, pos: np.ndarray, rows: np.ndarray) -> None:
    """Write the field of the messages ``rows`` at their cursors ``pos[rows]``."""
    if f.present is not None:
        rows = rows[f.present[rows]]
    if rows.size == 0:
        return
    at = pos[rows]
    _put_bytes(buf, at, tag(f.number, f.wire))
    if f.wire == VARINT and isinstance(f.values, int):
        _put_bytes(buf, at, varint_bytes(f.values))
    elif f.wire == VARINT:
        _put_varints(buf, at, f.values[rows], f._lens[rows])
    elif f.wire == FIXED64:
        raw = f.values[rows].view(np.uint8).reshape(-1, 8)
        buf[at[:, None] + np.arange(8)] = raw
        at += 8
    else:
        _put_varints(buf, at, f._inner[rows].astype(np.uint64))
        pos[rows] = at
        for child in f.fields:
            _put(child, buf, pos, rows)
        return
    pos[rows] = at


def encode(groups: list[tuple[np.ndarray, Field]], total: int) -> bytes:
    """``total`` messages laid one after another; each group is (the messages' places in
    that order, the field that encodes them): e.g. packets of two kinds interleaved."""
    sizes = np.zeros(total, np.int64)
    for places, f in groups:
        sizes[places] = _sizes(f, places.size)
    offsets = np.cumsum(sizes) - sizes
    buf = np.empty(int(sizes.sum()), np.uint8)
    for places, f in groups:
        pos = offsets[places].copy()
        _put(f, buf, pos, np.arange(places.size))
    return buf.tobytes()
