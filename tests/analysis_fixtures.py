"""Helpers for the analysis tests: fixture discovery and cell-by-cell CSV comparison."""

from __future__ import annotations

import csv
from collections import Counter
from decimal import Decimal, InvalidOperation
from pathlib import Path

from analysis.reports import REPORTS

FIXTURES = Path(__file__).parent / "fixtures"
H100 = FIXTURES / "h100"
CPU = FIXTURES / "cpu"
NSYS2025 = FIXTURES / "nsys2025"


# ORDER BY of each report, as column names; direction -1 = DESC.  Rows whose keys tie
# may come in any order (nsys leaves them unordered too).
ORDER_KEYS: dict[str, list[tuple[str, int]]] = {
    "cuda_gpu_kern_sum": [("Total Time (ns)", -1), ("Instances", 1), ("Name", 1)],
    "nvtx_sum": [("Total Time (ns)", -1)],
    "nvtx_kern_sum": [("NVTX Range", 1), ("PID", 1), ("TID", 1), ("Total Time (ns)", -1)],
    "nvtx_gpu_proj_sum": [("Total Proj Time (ns)", -1)],
    "cuda_api_sum": [("Total Time (ns)", -1)],
    "cuda_gpu_mem_time_sum": [("Total Time (ns)", -1)],
    "cuda_gpu_mem_size_sum": [("Total (MB)", -1)],
}


def read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows; an empty file (nsys' SKIPPED report) reads as no header."""
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        return [], []
    rows = list(csv.reader(text.splitlines()))
    return rows[0], rows[1:]


def _cell(value: str) -> object:
    try:
        return Decimal(value)
    except InvalidOperation:
        return value


def _norm(row: list[str]) -> tuple[object, ...]:
    return tuple(_cell(v) for v in row)


def compare_report(ours: Path, ref: Path, report: str) -> list[str]:
    """Differences between our CSV and nsys' CSV for one report (empty list = parity).

    Cells are compared as printed: numbers by decimal value (so ``3.0`` == ``3.00``),
    text exactly.  Row order must follow the report's ORDER BY keys like the reference.
    """
    o_head, o_rows = read_csv(ours)
    r_head, r_rows = read_csv(ref)
    problems: list[str] = []
    if not r_head:  # nsys skipped the report: we must write a header-only CSV
        if o_rows:
            problems.append(f"{report}: nsys printed nothing but we have {len(o_rows)} rows")
        return problems
    if o_head != r_head:
        return [f"{report}: header differs\n  ours: {o_head}\n  nsys: {r_head}"]
    o_count = Counter(_norm(r) for r in o_rows)
    r_count = Counter(_norm(r) for r in r_rows)
    if o_count != r_count:
        missing = list((r_count - o_count).elements())
        extra = list((o_count - r_count).elements())
        lines = [f"{report}: rows differ ({len(o_rows)} ours vs {len(r_rows)} nsys)"]
        for row in missing[:10]:
            lines.append(f"  only in nsys: {_show(row, r_head)}")
        for row in extra[:10]:
            lines.append(f"  only in ours: {_show(row, o_head)}")
        lines.extend(_closest_diffs(missing, extra, r_head))
        problems.append("\n".join(lines))
        return problems
    idx = [(r_head.index(c), d) for c, d in ORDER_KEYS[report] if c in r_head]
    o_keys = [tuple(_cell(r[i]) for i, _ in idx) for r in o_rows]
    r_keys = [tuple(_cell(r[i]) for i, _ in idx) for r in r_rows]
    if o_keys != r_keys:
        first = next(i for i, (a, b) in enumerate(zip(o_keys, r_keys, strict=True)) if a != b)
        problems.append(
            f"{report}: row order differs at row {first}: ours {o_keys[first]} nsys {r_keys[first]}"
        )
    return problems


def _show(row: tuple[object, ...], head: list[str]) -> str:
    return ", ".join(f"{h}={str(v)[:60]}" for h, v in zip(head, row, strict=False))


def _closest_diffs(
    missing: list[tuple[object, ...]], extra: list[tuple[object, ...]], head: list[str]
) -> list[str]:
    """For each missing row, the cells that differ from the most similar extra row."""
    out = []
    for m in missing[:5]:
        if not extra:
            break
        best = max(extra, key=lambda e: sum(a == b for a, b in zip(m, e, strict=False)))
        diffs = [
            f"{h}: nsys={a!s:.50} ours={b!s:.50}"
            for h, a, b in zip(head, m, best, strict=False)
            if a != b
        ]
        out.append("  closest row differs in: " + "; ".join(diffs))
    return out


def main(argv: list[str]) -> int:
    """``python tests/analysis_fixtures.py OURS_DIR REF_DIR [PREFIX]``: print differences."""
    ours, ref = Path(argv[0]), Path(argv[1])
    prefix = argv[2] if len(argv) > 2 else ""
    bad = 0
    for r in REPORTS:
        problems = compare_report(ours / f"{r}.csv", ref / f"{prefix}{r}.csv", r)
        print(r, "OK" if not problems else "\n".join(problems))
        bad += bool(problems)
    print("FAIL" if bad else "ALL OK")
    return 1 if bad else 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
