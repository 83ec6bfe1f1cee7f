"""A vs B ("simple vs optimized"): time per kernel category and per NVTX range.

``python -m analysis compare A B -o DIR`` where A and B are nsys SQLite exports, run folders
containing ``profile.sqlite``, or a run's statistics folder (``<run>/stats``, as ``analysis
all`` wrote it: ``metrics.json``, ``nvtx_sum.csv``, ``nvtx_categories.csv``).  Writes
``compare_categories.csv``, ``compare_nvtx.csv`` and ``compare_metrics.csv`` into DIR and
prints them.  Ratios are B / A (below 1: B is faster).

The pipeline compares statistics folders: a comparison then needs neither capture, so
re-capturing one run (or resuming without captures) redoes its comparisons without
capturing their other side again, and both sides read the same tables as their reports
(compiled kernels attributed with the run's own inputs).
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

from analysis.metrics.categories import CATEGORIES
from analysis.metrics.extras import compute_extras
from analysis.reading import Export, ExportError
from analysis.reports.fmt import Table
from analysis.reports.nsys_stats import Context, report_nvtx_sum

RUN_EXPORT = "profile.sqlite"
# What a side needs from a statistics folder (analysis all: reports + extras).
STATS_FILES = ("metrics.json", "nvtx_sum.csv", "nvtx_categories.csv")


def is_stats_folder(path: Path) -> bool:
    return path.is_dir() and all((path / name).is_file() for name in STATS_FILES)


def resolve_side(path: str | os.PathLike[str]) -> Path:
    """A .sqlite export, a statistics folder, or a run folder holding ``profile.sqlite`` (or,
    without one, its ``stats`` folder)."""
    p = Path(path)
    if not p.is_dir() or is_stats_folder(p):
        return p
    cand = p / RUN_EXPORT
    if cand.exists():
        return cand
    found = sorted(p.glob("*.sqlite"))
    if len(found) == 1:
        return found[0]
    if is_stats_folder(p / "stats"):
        return p / "stats"
    raise ExportError(p, f"run folder without {RUN_EXPORT} or a stats folder with "
                         f"{', '.join(STATS_FILES)}")


@dataclass
class Side:
    categories: dict[str, int]
    nvtx_range: dict[tuple[str, str], int]
    nvtx_gpu: dict[tuple[str, str], int]
    metrics: dict[str, object]


def _side(path: Path) -> Side:
    if is_stats_folder(path):
        return _side_of_tables(_read_csv(path / "nvtx_sum.csv"),
                               _read_csv(path / "nvtx_categories.csv")[1],
                               json.loads((path / "metrics.json").read_text()))
    with Export(path) as ex:
        ctx = Context(ex)
        extras = compute_extras(ex, ctx)
        nvtx = report_nvtx_sum(ctx)
    return _side_of_tables((nvtx.header, nvtx.rows),
                           extras.tables["nvtx_categories.csv"].rows, extras.metrics)


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="utf-8") as fh:
        header, *rows = list(csv.reader(fh))
    return header, rows


def _side_of_tables(nvtx_sum: tuple[list[str], list[list[str]]],
                    nvtx_categories: list[list[str]], metrics: dict[str, object]) -> Side:
    """A side from the nvtx_sum report, the nvtx_categories rows (range, style, category,
    total ns, ...) and the extras' metrics."""
    cats = {c: int(metrics.get(f"category_time_ns.{c}") or 0) for c in CATEGORIES}
    rng: dict[tuple[str, str], int] = {}
    h, rows = nvtx_sum
    for row in rows:
        key = (row[h.index("Range")], row[h.index("Style")])
        rng[key] = rng.get(key, 0) + int(row[h.index("Total Time (ns)")])
    gpu: dict[tuple[str, str], int] = {}
    for row in nvtx_categories:
        key = (row[0], row[1])
        gpu[key] = gpu.get(key, 0) + int(row[3])
    return Side(cats, rng, gpu, metrics)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0:
        return ""
    return f"{b / a:.3f}"


@dataclass
class Comparison:
    categories: Table
    nvtx: Table
    metrics: Table


def compare(a: str | os.PathLike[str], b: str | os.PathLike[str], outdir: str | os.PathLike[str]
            ) -> Comparison:
    """Compare two exports, statistics folders or run folders; write the CSVs into
    ``outdir``."""
    sa, sb = _side(resolve_side(a)), _side(resolve_side(b))
    cats = Table(["Category", "A (ns)", "B (ns)", "B/A"])
    for c in CATEGORIES:
        va, vb = sa.categories[c], sb.categories[c]
        if va or vb:
            cats.rows.append([c, str(va), str(vb), _ratio(va, vb)])
    ta, tb = sum(sa.categories.values()), sum(sb.categories.values())
    cats.rows.append(["Total", str(ta), str(tb), _ratio(ta, tb)])
    nv = Table(
        ["Range", "Style", "A Range Time (ns)", "B Range Time (ns)", "Range B/A",
         "A GPU Time (ns)", "B GPU Time (ns)", "GPU B/A"]
    )  # fmt: skip
    keys = sorted(set(sa.nvtx_range) | set(sb.nvtx_range) | set(sa.nvtx_gpu) | set(sb.nvtx_gpu))
    for key in keys:
        ra, rb = sa.nvtx_range.get(key), sb.nvtx_range.get(key)
        ga, gb = sa.nvtx_gpu.get(key), sb.nvtx_gpu.get(key)
        nv.rows.append(
            [key[0], key[1], _s(ra), _s(rb), _ratio(ra, rb), _s(ga), _s(gb), _ratio(ga, gb)]
        )
    met = Table(["Metric", "A", "B", "B/A"])
    for k, va in sa.metrics.items():
        vb = sb.metrics.get(k)
        num = isinstance(va, int | float) and isinstance(vb, int | float)
        met.rows.append([k, _s(va), _s(vb), _ratio(va, vb) if num else ""])  # type: ignore[arg-type]
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    cats.write(out / "compare_categories.csv")
    nv.write(out / "compare_nvtx.csv")
    met.write(out / "compare_metrics.csv")
    return Comparison(cats, nv, met)


def _s(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def format_table(c: Comparison) -> str:
    """Plain-text rendering of the three comparison tables."""
    parts = []
    for title, table in (("Kernel categories", c.categories), ("NVTX ranges", c.nvtx),
                         ("Metrics", c.metrics)):  # fmt: skip
        widths = [len(h) for h in table.header]
        for row in table.rows:
            widths = [max(w, len(v[:60])) for w, v in zip(widths, row, strict=True)]
        lines = [title, "  ".join(h.ljust(w) for h, w in zip(table.header, widths, strict=True))]
        for row in table.rows:
            lines.append("  ".join(v[:60].ljust(w) for v, w in zip(row, widths, strict=True)))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
