"""Cell formatting identical to ``nsys stats --format csv``.

* SQL ``round(x, 1)`` in nsys rounds the shortest decimal representation half away from
  zero: 0.15 -> 0.2, 1.25 -> 1.3, 0.35 -> 0.4 (probed with nsys 2024.2.3; Python's
  ``round`` would give 0.1 / 1.2 / 0.3).
* ``:mem_B`` columns are printed in MB (value / 1e6) with 3 decimals (C ``%.3f``).
* NULL prints as an empty cell; integers print as integers.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np

_TENTH = Decimal("0.1")


def round1(values: Iterable[float] | np.ndarray) -> list[str]:
    """Format floats as nsys' ``round(x, 1)`` prints them."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return []
    scaled = arr * 10.0
    frac = scaled - np.floor(scaled)
    near_tie = np.abs(frac - 0.5) < 1e-6
    fast = np.floor(scaled + 0.5) / 10.0
    out = [f"{v:.1f}" for v in fast.tolist()]
    for i in np.flatnonzero(near_tie | ~np.isfinite(arr)).tolist():
        x = float(arr[i])
        if not np.isfinite(x):
            out[i] = ""
            continue
        d = Decimal(repr(x)).quantize(_TENTH, rounding=ROUND_HALF_UP)
        out[i] = f"{d:f}"
    return out


def ints(values: Iterable[int] | np.ndarray, null: int | None = None) -> list[str]:
    """Format integers; ``null`` marks values printed as empty cells."""
    lst = np.asarray(values).tolist()
    if null is None:
        return [str(int(v)) for v in lst]
    return ["" if v == null else str(int(v)) for v in lst]


def megabytes(values: Iterable[float] | np.ndarray) -> list[str]:
    """Bytes -> MB with 3 decimals, as nsys converts ``:mem_B`` columns."""
    return [f"{v / 1e6:.3f}" for v in np.asarray(values, dtype=np.float64).tolist()]


def percent(totals: np.ndarray, grand: float) -> list[str]:
    """``round(total * 100.0 / grand, 1)`` as the nsys summaries compute Time (%)."""
    if grand == 0:
        return ["" for _ in range(len(totals))]
    return round1(np.asarray(totals, dtype=np.float64) * 100.0 / float(grand))


def text(values: Iterable[object]) -> list[str]:
    return ["" if v is None else str(v) for v in values]


class Table:
    """A report: header and already formatted rows (strings)."""

    def __init__(self, header: Sequence[str], rows: list[list[str]] | None = None) -> None:
        self.header = list(header)
        self.rows = rows or []

    @classmethod
    def from_columns(cls, header: Sequence[str], columns: Sequence[list[str]]) -> Table:
        rows = [list(r) for r in zip(*columns, strict=True)] if columns else []
        return cls(header, rows)

    def write(self, path: str | Path) -> None:
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(self.header)
            writer.writerows(self.rows)

    def __len__(self) -> int:
        return len(self.rows)
