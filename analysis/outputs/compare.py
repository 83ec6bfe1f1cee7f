"""A vs B ("simple vs optimized"): time per kernel category and per NVTX range.

``python -m analysis compare A B -o DIR`` where A and B are nsys SQLite exports or run
folders containing ``profile.sqlite``.  Writes ``compare_categories.csv``,
``compare_nvtx.csv`` and ``compare_metrics.csv`` into DIR and prints them.  Ratios are
B / A (below 1: B is faster).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from analysis.metrics.categories import CATEGORIES
from analysis.metrics.extras import compute_extras
from analysis.reading import Export, ExportError
from analysis.reports.fmt import Table
from analysis.reports.nsys_stats import Context, report_nvtx_sum

RUN_EXPORT = "profile.sqlite"


def resolve_export(path: str | os.PathLike[str]) -> Path:
    """A .sqlite export, or a run folder holding ``profile.sqlite``."""
    p = Path(path)
    if p.is_dir():
        cand = p / RUN_EXPORT
        if not cand.exists():
            found = sorted(p.glob("*.sqlite"))
            if len(found) == 1:
                return found[0]
            raise ExportError(p, f"run folder without {RUN_EXPORT}")
        return cand
    return p


@dataclass
class Side:
    categories: dict[str, int]
    nvtx_range: dict[tuple[str, str], int]
    nvtx_gpu: dict[tuple[str, str], int]
    metrics: dict[str, object]


def _side(path: Path) -> Side:
    with Export(path) as ex:
        ctx = Context(ex)
        extras = compute_extras(ex, ctx)
        nvtx = report_nvtx_sum(ctx)
    cats = {c: int(extras.metrics.get(f"category_time_ns.{c}") or 0) for c in CATEGORIES}
    rng: dict[tuple[str, str], int] = {}
    h = nvtx.header
    for row in nvtx.rows:
        key = (row[h.index("Range")], row[h.index("Style")])
        rng[key] = rng.get(key, 0) + int(row[h.index("Total Time (ns)")])
    gpu: dict[tuple[str, str], int] = {}
    for row in extras.tables["nvtx_categories.csv"].rows:
        key = (row[0], row[1])
        gpu[key] = gpu.get(key, 0) + int(row[3])
    return Side(cats, rng, gpu, extras.metrics)


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
    """Compare two exports (or run folders); write the CSVs into ``outdir``."""
    sa, sb = _side(resolve_export(a)), _side(resolve_export(b))
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
