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

import math

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs ~5 ms
if TYPE_CHECKING:  # type hints only: keep the small-report start-up free of these imports
    from collections.abc import Iterable, Sequence
    from pathlib import Path

#: rounding of the reference nsys version, see :func:`reference`
_MODE = {"version": "2025"}


class reference:  # noqa: N801 (used as a function: ``with fmt.reference("2024"):``)
    """Format as nsys ``version`` ("2025" = 2025.3.1, "2024" = 2024.2.3) does."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.old = _MODE["version"]

    def __enter__(self) -> None:
        self.old = _MODE["version"]
        _MODE["version"] = self.version

    def __exit__(self, *exc: object) -> None:
        _MODE["version"] = self.old


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
        from decimal import ROUND_HALF_UP, Decimal  # rare (ties only): imported lazily

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
        """CSV as ``csv.writer(fh, lineterminator="\\n")`` writes it (minimal quoting)."""
        lines = [_csv_line(self.header), *map(_csv_line, self.rows)]
        with open(path, "w", newline="", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")

    def __len__(self) -> int:
        return len(self.rows)


def _csv_field(v: str) -> str:
    if "," in v or '"' in v or "\n" in v:
        return '"' + v.replace('"', '""') + '"'
    return v


def _csv_line(row: Sequence[str]) -> str:
    """One CSV line with the csv module's QUOTE_MINIMAL rules (the csv import costs more
    than the small reports themselves)."""
    if len(row) == 1 and row[0] == "":
        return '""'
    try:
        line = ",".join(row)
    except TypeError:  # non-str cells: as csv writes them (None -> empty)
        row = ["" if v is None else str(v) for v in row]
        line = ",".join(row)
    if '"' in line or "\n" in line or line.count(",") != len(row) - 1:
        return ",".join(map(_csv_field, row))
    return line
