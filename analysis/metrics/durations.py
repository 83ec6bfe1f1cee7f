"""Kernel duration histogram with log-spaced bins (``kernel_durations.csv``).

Many kernels under ~10 µs is the signature of a launch-bound run: the GPU finishes each
kernel faster than the host can launch the next one. The bins are the same for every run
(two per decade, 100 ns .. 1 s, open at both ends) so runs can be compared bin by bin, and
10 µs is a bin edge.
"""

from __future__ import annotations

import numpy as np

from analysis.reading.export import Export
from analysis.reports.fmt import Table

SHORT_KERNEL_NS = 10_000  # 10 µs
# 0, 100 ns, 316 ns, 1 µs, ..., 1 s, inf
EDGES_NS = np.r_[0.0, np.round(10 ** np.arange(2.0, 9.01, 0.5)), np.inf]
HEADER = ["bin_low_ns", "bin_high_ns", "kernels", "time_ns", "share_of_kernels",
          "share_of_time"]  # fmt: skip


def duration_histogram(durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kernel count, summed ns) per bin of EDGES_NS; a bin is [low, high)."""
    idx = np.searchsorted(EDGES_NS, durations, side="right") - 1
    nbins = EDGES_NS.size - 1
    counts = np.bincount(idx, minlength=nbins)[:nbins]
    time = np.bincount(idx, durations.astype(float), minlength=nbins)[:nbins]
    return counts.astype(np.int64), time.astype(np.int64)


def durations_table(ex: Export) -> tuple[Table, dict[str, float | None]]:
    """``kernel_durations.csv`` and ``kernels_under_10us_share`` (+ its time share)."""
    k = ex.kernels()
    dur = (k["end"] - k["start"]).astype(np.int64)
    counts, time = duration_histogram(dur)
    n, total = int(dur.size), int(dur.sum())
    rows = [
        [str(int(lo)), "inf" if np.isinf(hi) else str(int(hi)), str(c), str(t),
         f"{c / n:.6f}" if n else "", f"{t / total:.6f}" if total else ""]
        for lo, hi, c, t in zip(EDGES_NS[:-1], EDGES_NS[1:], counts.tolist(), time.tolist(),
                                strict=True)
    ]  # fmt: skip
    short = dur < SHORT_KERNEL_NS
    metrics = {
        "kernels_under_10us_share": float(short.mean()) if n else None,
        "kernel_time_under_10us_share": float(dur[short].sum() / total) if total else None,
    }
    return Table(HEADER, rows), metrics


__all__ = ["EDGES_NS", "SHORT_KERNEL_NS", "duration_histogram", "durations_table"]
