"""The overview's page model and its three renderings: Markdown (SUMMARY.md), a
self-contained HTML page (overview.html) and reStructuredText (the report's landing text).

A page is a list of blocks: headings, paragraphs, numbered items, tables (:class:`Grid`),
groups of small tables laid side by side (:class:`Cards`), collapsed details and figures.
Cell and paragraph text may hold **bold** and `code`, nothing else.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

EMPTY = "—"
# A number as the overview writes one: 6.61, 1.0×, 25%, 58.54 [57.34, 66.04], 109.3–110.5,
# optionally bold.
_NUMBER = re.compile(r"^\**[-+]?\d[\d.,]*(e[-+]?\d+)?\s*[×%]?(\s*[\[–-][^\]]*\]?)?\**$")
# A long name (a Triton kernel's, a failure message) in a table marked to shorten them: its
# start and its end (the kernel's index) in the HTML, all of it in the cell's tooltip.
LONG_CELL, CELL_HEAD, CELL_TAIL = 48, 33, 12


@dataclass
class Grid:
    """A table: a header, rows of text cells, the caption that says what the rows are."""
    header: list[str]
    rows: list[list[str]]
    caption: str = ""
    shorten: bool = False  # long text cells shortened in HTML (kernel names, messages)

    def numeric(self) -> list[bool]:
        """Per column: numbers (right-aligned) or text (left-aligned)."""
        out = []
        for i in range(len(self.header)):
            cells = [r[i] for r in self.rows if r[i] not in ("", EMPTY)]
            numbers = sum(bool(_NUMBER.match(c)) for c in cells)
            out.append(bool(cells) and numbers * 2 >= len(cells))
        return out

    def without_empty_columns(self, keep: int = 1) -> Grid:
        """The table without the columns (after the first ``keep``) that no row fills."""
        cols = [i for i in range(len(self.header))
                if i < keep or any(r[i] not in ("", EMPTY) for r in self.rows)]
        return Grid([self.header[i] for i in cols], [[r[i] for i in cols] for r in self.rows],
                    self.caption, self.shorten)


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Para:
    text: str


@dataclass
class Items:
    texts: list[str]


@dataclass
class Titled:
    """A table under its own small heading (a card of :class:`Cards`)."""
    title: str
    grid: Grid


@dataclass
class Cards:
    """Small tables side by side where the width allows (one under another in Markdown)."""
    cards: list[Titled]


@dataclass
class Details:
    """Collapsed content: the summary line shows, the blocks open on a click."""
    summary: str
    blocks: list = field(default_factory=list)


@dataclass
class Figures:
    paths: list[Path]


Block = Heading | Para | Items | Grid | Titled | Cards | Details | Figures


# --- Markdown ---------------------------------------------------------------------------------


def md_table(grid: Grid) -> str:
    """A GitHub Markdown table, numbers right-aligned."""
    def cell(v: str) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    align = ["---:" if n else "---" for n in grid.numeric()]
    lines = ["| " + " | ".join(cell(c) for c in grid.header) + " |",
             "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in grid.rows]
    return "\n".join(lines)


def to_markdown(blocks: list[Block], results: Path) -> str:
    parts: list[str] = []
    for block in blocks:
        parts += _md(block, results)
    return "\n".join(parts)


def _md(block: Block, results: Path) -> list[str]:
    if isinstance(block, Heading):
        return [f"{'#' * block.level} {block.text}", ""]
    if isinstance(block, Para):
        return [block.text, ""]
    if isinstance(block, Items):
        return [f"{i}. {t}" for i, t in enumerate(block.texts, 1)] + [""]
    if isinstance(block, Grid):
        return ([block.caption, ""] if block.caption else []) + [md_table(block), ""]
    if isinstance(block, Titled):
        return [f"### {block.title}", "", *_md(block.grid, results)]
    if isinstance(block, Cards):
        return [line for card in block.cards for line in _md(card, results)]
    if isinstance(block, Details):
        inner = [line for b in block.blocks for line in _md(b, results)]
        return [f"<details><summary>{html.escape(block.summary)}</summary>", "", *inner,
                "</details>", ""]
    return [line for p in block.paths
            for line in (f"![{p.stem}]({p.relative_to(results).as_posix()})", "")]


# --- HTML -------------------------------------------------------------------------------------

# Fits 1400 px: a page of at most 1320 px, numbers in one line, long text cells wrapped.
_STYLE = """
body{font-family:system-ui,sans-serif;font-size:14px;line-height:1.35;max-width:1320px;
margin:auto;padding:0 1.5em 1em;color:#1a1a1a}
h1{font-size:1.5em;margin:.6em 0 .2em}h2{font-size:1.15em;margin:1.1em 0 .3em}
h3{font-size:1em;margin:.2em 0}
p{margin:.25em 0 .4em}p.caption{color:#555;font-size:.9em;max-width:60em}
table{border-collapse:collapse;margin:.2em 0 .6em;font-size:13px}
td,th{border:1px solid #d0d0d0;padding:2px 7px;text-align:left;vertical-align:top;
max-width:30em;overflow-wrap:anywhere}
th{background:#f3f3f3;font-weight:600}
td.n,th.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums;
overflow-wrap:normal}
.cards{display:flex;flex-wrap:wrap;gap:0 2.2em;align-items:flex-start}
.cards>div{max-width:100%;min-width:16em}
.cards h3,.cards p.caption{width:0;min-width:100%}
details{margin:.3em 0}details td{max-width:none}summary{cursor:pointer;color:#333}
ol{margin:.2em 0;padding-left:1.6em}li{margin:.15em 0;overflow-wrap:anywhere}
code{font-size:.88em}
.figs{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:.8em}
.figs figure{margin:0}.figs img{width:100%;max-height:430px;object-fit:contain;
object-position:left top;cursor:zoom-in}
.figs figure.big{grid-column:1/-1}.figs figure.big img{max-height:none;cursor:zoom-out}
.figs figcaption{font-size:.85em;color:#555}
"""
# Counts the figures the browser decoded (the report tests read it back).
_SCRIPT = ("<script>window.addEventListener('load',()=>{const i=[...document.images];"
           "document.body.dataset.images=i.length;document.body.dataset.imagesDecoded="
           "i.filter(x=>x.complete&&x.naturalWidth>0).length;});</script>")


def to_html(blocks: list[Block], results: Path, title: str = "profbench results") -> str:
    """A self-contained page (figures embedded; nothing is fetched)."""
    body = "".join(_html(b, results) for b in blocks)
    style = re.sub(r"\n", "", _STYLE)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{style}</style></head><body>{body}{_SCRIPT}</body></html>")


def _html(block: Block, results: Path) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{inline_html(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        return f"<p>{inline_html(block.text)}</p>"
    if isinstance(block, Items):
        return "<ol>" + "".join(f"<li>{inline_html(t)}</li>" for t in block.texts) + "</ol>"
    if isinstance(block, Grid):
        return html_table(block)
    if isinstance(block, Titled):
        return f"<div><h3>{inline_html(block.title)}</h3>{html_table(block.grid)}</div>"
    if isinstance(block, Cards):
        return "<div class='cards'>" + "".join(_html(c, results) for c in block.cards) + "</div>"
    if isinstance(block, Details):
        inner = "".join(_html(b, results) for b in block.blocks)
        return f"<details><summary>{inline_html(block.summary)}</summary>{inner}</details>"
    return "<div class='figs'>" + "".join(_figure(p, results) for p in block.paths) + "</div>"


def _figure(path: Path, results: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    src = html.escape(path.relative_to(results).as_posix())
    # a click shows the figure at full width, another one shrinks it back
    return (f"<figure onclick=\"this.classList.toggle('big')\"><img alt=\"{src}\" "
            f"src=\"data:image/png;base64,{data}\"><figcaption>{html.escape(path.stem)}"
            "</figcaption></figure>")


def html_table(grid: Grid) -> str:
    numeric = grid.numeric()
    th = "".join(f"<th{' class=n' if n else ''}>{inline_html(c)}</th>"
                 for c, n in zip(grid.header, numeric, strict=True))
    rows = "".join("<tr>" + "".join(_td(c, n, grid.shorten)
                                    for c, n in zip(r, numeric, strict=True))
                   + "</tr>" for r in grid.rows)
    caption = f"<p class='caption'>{inline_html(grid.caption)}</p>" if grid.caption else ""
    return f"{caption}<table><tr>{th}</tr>{rows}</table>"


def _td(cell: str, numeric: bool, shorten: bool) -> str:
    if numeric:
        return f"<td class=n>{inline_html(cell)}</td>"
    if shorten and len(cell) > LONG_CELL:
        short = cell[:CELL_HEAD].rstrip() + "…" + cell[-CELL_TAIL:].lstrip()
        return f"<td title=\"{html.escape(cell)}\">{inline_html(short)}</td>"
    return f"<td>{inline_html(cell)}</td>"


def inline_html(text: str) -> str:
    """**bold** and `code` as HTML, everything else escaped."""
    code = html.escape(text).split("`")
    out = []
    for i, part in enumerate(code):
        if i % 2:
            out.append(f"<code>{part}</code>")
        else:
            bold = part.split("**")
            out.append("".join(f"<b>{b}</b>" if j % 2 else b for j, b in enumerate(bold)))
    return "".join(out)


# --- reStructuredText (the Snakemake report's landing page) ---------------------------------


def rst_inline(text: str) -> str:
    """The Markdown's **bold** and `code` as reStructuredText."""
    code = text.split("`")
    return "".join(f"``{c}``" if i % 2 else c for i, c in enumerate(code))


def rst_table(grid: Grid, name: str) -> str:
    """A list-table of class ``name`` (:func:`rst_alignment` right-aligns its numbers)."""
    def cell(v: str) -> str:
        return rst_inline(str(v)).replace("\n", " ").replace("|", "\\|") or "\\"

    lines = [".. list-table::", "   :header-rows: 1", f"   :class: {name}", ""]
    for row in [grid.header, *grid.rows]:
        lines.append("   * - " + cell(row[0]))
        lines += [f"     - {cell(v)}" for v in row[1:]]
    return "\n".join(lines) + "\n"


def rst_alignment(grid: Grid, name: str) -> str:
    """CSS that right-aligns the numeric columns of the list-table of class ``name``."""
    columns = [i for i, n in enumerate(grid.numeric(), 1) if n]
    cells = ",".join(f"table.{name} td:nth-child({i}),table.{name} th:nth-child({i})"
                     for i in columns)
    return f"{cells}{{text-align:right;white-space:nowrap}}" if cells else ""
