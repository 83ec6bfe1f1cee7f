"""Vectorized group-by statistics with nsys' exact definitions.

nsys' SQL aggregates (``median``, ``stdev`` are C extensions registered by nsys):
sum/count/min/max exact on integers, avg = sum / count, median = middle value or the mean
of the two middle values for an even count, stdev = *sample* standard deviation
(n - 1 denominator) and 0 for a single value.  Checked against nsys 2024.2.3 output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.reading.codes import densify


@dataclass
class GroupStats:
    """Statistics for the groups that have at least one value (``group`` = group code)."""

    group: np.ndarray
    count: np.ndarray
    total: np.ndarray
    mean: np.ndarray
    median: np.ndarray
    min: np.ndarray
    max: np.ndarray
    std: np.ndarray


def _sorted_groups(codes: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, values) sorted by code then value.

    Sorting one combined int64 key (np.sort, no gather) is several times faster than a
    lexsort; the general path is kept for keys that do not fit.
    """
    vmin = int(values.min())
    span = int(values.max()) - vmin + 1
    ncodes = int(codes.max()) + 1
    if int(codes.min()) >= 0 and span * ncodes < 2**62:
        key = np.sort(codes * span + (values - vmin))
        return key // span, key % span + vmin
    order = np.lexsort((values, codes))
    return codes[order], values[order]


def group_stats(codes: np.ndarray, values: np.ndarray) -> GroupStats:
    """Per-group count/sum/mean/median/min/max/sample-stddev of int64 ``values``."""
    codes = np.asarray(codes, dtype=np.int64)
    values = np.asarray(values, dtype=np.int64)
    n = codes.size
    if n == 0:
        e_i = np.empty(0, np.int64)
        e_f = np.empty(0, np.float64)
        return GroupStats(e_i, e_i, e_i, e_f, e_f, e_i, e_i, e_f)
    gs, vs = _sorted_groups(codes, values)
    starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
    counts = np.diff(np.r_[starts, n])
    ends = starts + counts - 1
    totals = np.add.reduceat(vs, starts)
    mean = totals / counts
    mid = starts + (counts - 1) // 2
    upper = np.minimum(mid + 1, n - 1)
    even = counts % 2 == 0
    median = np.where(even, (vs[mid] + vs[upper]) / 2, vs[mid].astype(np.float64))
    # two-pass variance: numerically safe for long durations with tiny spread
    dev = vs - np.repeat(mean, counts)
    ss = np.add.reduceat(dev * dev, starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.where(counts > 1, np.sqrt(ss / np.maximum(counts - 1, 1)), 0.0)
    return GroupStats(gs[starts], counts, totals, mean, median, vs[starts], vs[ends], std)


def distinct_count(codes: np.ndarray, key: np.ndarray, bound: int, ngroups: int) -> np.ndarray:
    """Number of distinct ``key`` values per group, where each key belongs to one group."""
    if key.size == 0:
        return np.zeros(ngroups, np.int64)
    _, rep = densify(key, bound)
    return np.bincount(codes[rep], minlength=ngroups)


def codes_for(values: list[object]) -> tuple[np.ndarray, list[object]]:
    """Dense codes for a list of hashable labels (None allowed)."""
    index: dict[object, int] = {}
    out = np.empty(len(values), np.int64)
    labels: list[object] = []
    for i, v in enumerate(values):
        c = index.get(v)
        if c is None:
            c = index[v] = len(labels)
            labels.append(v)
        out[i] = c
    return out, labels
