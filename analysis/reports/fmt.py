"""Cell formatting identical to ``nsys stats --format csv``.

* SQL ``round(x, 1)`` differs between the SQLite builds of the two nsys versions (probed
  on a real export with extra rows whose averages are 0.15, 0.35, 0.45 and 1.25):
  - 2025.3.1 (reference) rounds the exact binary value half away from zero:
    0.15 -> 0.1, 0.35 -> 0.3, 0.45 -> 0.5, 1.25 -> 1.3;
  - 2024.2.3 rounds the shortest decimal representation half away from zero:
    0.15 -> 0.2, 0.35 -> 0.4, 0.45 -> 0.5, 1.25 -> 1.3.
  (Python's ``round`` is half-to-even: 0.1 / 0.3 / 0.5 / 1.2.)
* ``:mem_B`` columns are printed in MB (value / 1e6) with 3 decimals (C ``%.3f``).
* NULL prints as an empty cell; integers print as integers.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

#: rounding of the reference nsys version, see :func:`reference`
_MODE = {"version": "2025"}


@contextmanager
def reference(version: str) -> Iterator[None]:
    """Format as nsys ``version`` ("2025" = 2025.3.1, "2024" = 2024.2.3) does, inside
    ``with fmt.reference(version):``."""
    old = _MODE["version"]
    _MODE["version"] = version
    try:
        yield
    finally:
        _MODE["version"] = old


def _floats(values: Iterable[float]) -> list[float]:
    tolist = getattr(values, "tolist", None)
    return [float(v) for v in (tolist() if tolist else values)]


def round1(values: Iterable[float]) -> list[str]:
    """Format floats as nsys' ``round(x, 1)`` prints them (NaN -> empty cell)."""
    exact = _MODE["version"] == "2025"
    out = []
    for x in _floats(values):
        if not math.isfinite(x):
            out.append("")
            continue
        scaled = x * 10.0
        frac = scaled - math.floor(scaled)
        if abs(frac - 0.5) > 1e-6:  # not near a tie: plain float rounding is exact enough
            out.append(f"{math.floor(scaled + 0.5) / 10.0:.1f}")
            continue
        dec = Decimal(x) if exact else Decimal(repr(x))
        out.append(f"{dec.quantize(Decimal('0.1'), rounding=ROUND_HALF_UP):f}")
    return out


def ints(values: Iterable[int], null: int | None = None) -> list[str]:
    """Format integers; ``null`` marks values printed as empty cells."""
    tolist = getattr(values, "tolist", None)
    lst = tolist() if tolist else list(values)
    if null is None:
        return [str(int(v)) for v in lst]
    return ["" if v == null else str(int(v)) for v in lst]


def megabytes(values: Iterable[float]) -> list[str]:
    """Bytes -> MB with 3 decimals, as nsys converts ``:mem_B`` columns."""
    return [f"{v / 1e6:.3f}" for v in _floats(values)]


def percent(totals: Iterable[float], grand: float) -> list[str]:
    """``round(total * 100.0 / grand, 1)`` as the nsys summaries compute Time (%)."""
    vals = _floats(totals)
    if grand == 0:
        return ["" for _ in vals]
    return round1([v * 100.0 / float(grand) for v in vals])


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
        """CSV with minimal quoting, ``\\n`` line ends (as ``nsys stats --format csv``)."""
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(self.header)
            writer.writerows(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

