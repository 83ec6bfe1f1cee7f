"""Dense integer codes for keys: the grouping step shared by reading and the reports.

A group-by over millions of rows needs each key as a small integer (0..groups-1) in key
order.  A lookup table does that in O(n) when the key space is small; sparse keys are
compacted with a sort first.
"""

from __future__ import annotations

import numpy as np


def dense_codes(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Combine several int64 key arrays into dense group codes.

    Codes follow the lexicographic order of the keys.  Returns (codes, rep) where
    ``rep[c]`` is one row holding group ``c``.  Keys are combined into one int64 (mixed
    radix); sparse keys are compacted first and the partial combination is re-densified
    before it could overflow, so no row-wise (axis=0) unique is ever needed.
    """
    if not keys or keys[0].size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    n = keys[0].size
    combined: np.ndarray | None = None
    radix = 1
    for k in keys:
        k = np.asarray(k, dtype=np.int64)
        lo = int(k.min())
        base = int(k.max()) - lo + 1
        if base > max(8 * n, 1 << 20):  # sparse values: order-preserving compaction
            k, _ = densify_sparse(k)
            base = int(k.max()) + 1
        elif lo:
            k = k - lo
        if combined is None:
            combined, radix = k, base
            continue
        if radix * base >= 2**62:
            combined, rep = densify(combined, radix)
            radix = rep.size
        combined = combined * base + k
        radix *= base
    assert combined is not None
    return densify(combined, radix)


def densify_sparse(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense codes (in key order) and representatives for arbitrary int64 keys."""
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return inv.reshape(-1).astype(np.int64), first


def densify(key: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """Dense codes (in key order) for non-negative keys < ``bound``, plus representatives.

    A lookup table replaces sorting when the key space is small (O(n) instead of a sort).
    """
    n = key.size
    if bound <= max(8 * n, 1 << 20):
        present = np.zeros(bound, np.int64)
        present[key] = 1
        lut = np.cumsum(present) - 1
        codes = lut[key]
        rep = np.empty(int(lut[-1]) + 1, np.int64)
        rep[codes] = np.arange(n)
        return codes, rep
    return densify_sparse(key)
