"""The timeline figure of one measured step (``timeline.png`` of ``python -m analysis trace``).

Rows, top to bottom, per rank (stacked for a distributed run, on one clock):

* **phase**: where on the GPU the ops of each training phase run (by the phase they were
  launched in, analysis/metrics/phases.py), as light tints named in place;
* **layer**: the same for the model's layers (numbered layer ranges, or a model's layer modules),
  one colour per layer along the layer colour map, labelled where there is room;
* **one row per GPU stream**: kernels and copies coloured by category; communication
  kernels also hatched;
* **host launches**: the CUDA API calls of the threads that launched the step's GPU work
  (launch calls dark, other calls light).

Each row is drawn at pixel resolution from the events' exact extents: a pixel's colour is
its busy share of the category (phase, layer) with most time in it, blended with white, so
idle time stays white and a short gap shows as a lighter column, never hidden by a bar
drawn wider than its kernel. The step is the median measured step of the trace's window
(analysis/outputs/traceevents.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from analysis.metrics.categories import CATEGORIES
from analysis.metrics.modules import natural_key
from analysis.metrics.phases import PHASES
from analysis.outputs import style
from analysis.outputs.traceevents import RankEvents

COMMUNICATION = CATEGORIES.index("Communication")
PIXELS = 1600  # columns a row is binned into (about the axes' width at report size)
ROW_GAP = 0.25  # blank rows between two ranks
LAUNCH_COLOR = "#333333"
OTHER_API_COLOR = "#BBBBBB"
_PHASE_LABEL = {name: label for name, label in style.PHASE_RANGES.items()}


@dataclass
class Row:
    """One row of the figure: a colour per pixel column."""

    label: str
    rgb: np.ndarray  # (PIXELS, 3)
    hatch: list[tuple[float, float]] = field(default_factory=list)  # communication: ms
    layer_labels: list[tuple[float, str]] = field(default_factory=list)  # (centre ms, text)
    bands: list[tuple[int, float, float]] = field(default_factory=list)  # (key, start, end) ns


@dataclass
class Timeline:
    """What the figure draws: rows per rank over one step's pixel columns."""

    groups: list[list[Row]]  # per rank
    edges: np.ndarray  # PIXELS + 1 column edges, ns on the ranks' clock
    step: int | None
    title: str


def busy_per_bin(start: np.ndarray, end: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Time each bin (between consecutive ``edges``) spends inside the intervals (their
    overlaps counted once per interval)."""
    if start.size == 0:
        return np.zeros(edges.size - 1)
    s, e = np.sort(start).astype(np.float64), np.sort(end).astype(np.float64)
    cs, ce = np.r_[0.0, np.cumsum(s)], np.r_[0.0, np.cumsum(e)]
    ns, ne = np.searchsorted(s, edges), np.searchsorted(e, edges)
    # total busy time before each edge: sum over intervals of clip(x - start, 0, end - start)
    before = edges * ns - cs[ns] - (edges * ne - ce[ne])
    return np.diff(before)


def _paint(start: np.ndarray, end: np.ndarray, key: np.ndarray, colors: dict[int, str],
           edges: np.ndarray) -> np.ndarray:
    """RGB per bin: the colour of the key with most time in it, blended with white by the
    bin's busy share."""
    width = edges[1] - edges[0]
    keys = [k for k in colors if (key == k).any()]
    rgb = np.ones((edges.size - 1, 3))
    if not keys:
        return rgb
    busy = np.stack([busy_per_bin(start[key == k], end[key == k], edges) for k in keys])
    top = busy.argmax(axis=0)
    # the square root: a pixel a fifth busy still shows its colour, an idle one stays white
    share = np.sqrt(np.clip(busy.sum(axis=0) / width, 0, 1))[:, None]
    palette = np.array([to_rgb(colors[k]) for k in keys])
    return 1 - share * (1 - palette[top])


def _spans(start: np.ndarray, end: np.ndarray, key: np.ndarray, colors: dict[int, object],
           edges: np.ndarray, group: np.ndarray | None = None
           ) -> tuple[np.ndarray, list[tuple[int, float, float]]]:
    """RGB per bin of solid bands: each key (per ``group``: a layer's forward and backward
    apart) from its first op's start to its last op's end, later keys drawn over earlier
    ones; and (key, start, end) of each band."""
    rgb = np.ones((edges.size - 1, 3))
    group = np.zeros(key.size, np.int64) if group is None else group
    bands = []
    for k in sorted(colors):
        for part in np.unique(group[key == k]).tolist():
            sel = (key == k) & (group == part)
            a, b = float(start[sel].min()), float(end[sel].max())
            cover = (edges[1:] > a) & (edges[:-1] < b)
            rgb[cover] = to_rgb(colors[k])
            bands.append((k, a, b))
    return rgb, bands


def _merged(start: np.ndarray, end: np.ndarray) -> list[tuple[int, int]]:
    if start.size == 0:
        return []
    order = np.argsort(start)
    out: list[list[int]] = []
    for s, e in zip(start[order].tolist(), end[order].tolist(), strict=True):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(a, b) for a, b in out]


def step_of(r: RankEvents) -> tuple[int, int, int | None]:
    """The window's median measured step: (start, end, index); the window itself when the
    capture has no step ranges."""
    chosen = r.window.chosen
    if not chosen:
        return r.window.start, r.window.end, None
    steps = r.window.steps[chosen]
    i = int(np.argsort(steps[:, 1] - steps[:, 0], kind="stable")[(len(chosen) - 1) // 2])
    return int(steps[i, 0]), int(steps[i, 1]), chosen[i]


def _own_step(r: RankEvents, index: int | None, lo: int, hi: int) -> tuple[int, int]:
    """This rank's own span of the figure's step (ns, on the figure's clock): the phase and
    layer bands end there, so the next step's first ops of an earlier rank do not stretch
    them over the whole window."""
    if index is None or index >= len(r.window.steps):
        return lo, hi
    return (int(r.window.steps[index, 0]) + r.offset_ns,
            int(r.window.steps[index, 1]) + r.offset_ns)


def _rank_rows(r: RankEvents, lo: int, hi: int, edges: np.ndarray, prefix: str,
               own: tuple[int, int] | None = None) -> list[Row]:
    """The rows of one rank (times on the figure's clock, ns); ``own``: its own step."""
    g, shift = r.gpu, r.offset_ns
    gs, ge = g.start + shift, g.end + shift
    inside = (ge > lo) & (gs < hi)
    own_lo, own_hi = own or (lo, hi)
    in_step = (ge > own_lo) & (gs < own_hi)
    rows: list[Row] = []
    # phases as tints named in place: their hues are the kernel categories' palette too, and
    # a full-strength "forward" band would read as a run of GEMMs
    phase_colors = {p: _tint(style.PHASE_COLORS[_PHASE_LABEL[name]])
                    for p, name in enumerate(PHASES)}
    if (g.phase[in_step] >= 0).any():
        rgb, bands = _spans(gs[in_step], ge[in_step], g.phase[in_step], phase_colors, edges)
        names = [_PHASE_LABEL[name] for name in PHASES]
        rows.append(Row(f"{prefix}phase", rgb, bands=bands,
                        layer_labels=_band_labels(bands, names, edges)))
    layer_row = _layer_row(r, in_step, gs, ge, edges, prefix)
    if layer_row is not None:
        rows.append(layer_row)
    cat_colors = {i: style.CATEGORY_COLORS[c] for i, c in enumerate(CATEGORIES)}
    streams = sorted(set(zip(g.device[inside].tolist(), g.stream[inside].tolist(),
                             strict=True)))
    for dev, stream in streams:
        sel = inside & (g.device == dev) & (g.stream == stream)
        comm = sel & (g.category == COMMUNICATION)
        hatch = [((a - lo) / 1e6, (b - a) / 1e6) for a, b in _merged(gs[comm], ge[comm])]
        label = f"{prefix}GPU{dev} stream {stream}" if len(set(g.device.tolist())) > 1 \
            else f"{prefix}stream {stream}"
        rows.append(Row(label, _paint(gs[sel], ge[sel], g.category[sel], cat_colors, edges),
                        hatch))
    host = _host_row(r, lo, hi, edges, prefix)
    if host is not None:
        rows.append(host)
    return rows


def _layer_row(r: RankEvents, inside: np.ndarray, gs: np.ndarray, ge: np.ndarray,
               edges: np.ndarray, prefix: str) -> Row | None:
    g = r.gpu
    codes = np.unique(g.layer[inside & (g.layer > 0)])
    if codes.size == 0:
        return None
    names = sorted((g.labels[c] for c in codes.tolist()), key=natural_key)
    order = {name: i for i, name in enumerate(names)}
    index = np.full(len(g.labels), -1, np.int64)
    for c in codes.tolist():
        index[c] = order[g.labels[c]]
    key = index[g.layer[inside]]
    colors = {i: style.layer_color(i, len(names)) for i in range(len(names))}
    rgb, bands = _spans(gs[inside], ge[inside], key, colors, edges, g.phase[inside])
    labels = _band_labels(bands, short_layer_labels(names), edges)
    return Row(f"{prefix}layer", rgb, layer_labels=labels, bands=bands)


def _band_labels(bands: list[tuple[int, float, float]], names: list[str], edges: np.ndarray
                 ) -> list[tuple[float, str]]:
    """(centre ms, text) of each band wide enough for its name: ~6 px a character of the
    ~1000 px wide axes."""
    lo, span = edges[0], edges[-1] - edges[0]
    labels = []
    for i, a, b in bands:
        text = names[i]
        if (b - a) / span * PIXELS >= (6 * len(text) + 4) * PIXELS / 1000:
            labels.append(((a + b) / 2 / 1e6 - lo / 1e6, text))
    return labels


def _tint(color: str, white: float = 0.55) -> tuple[float, float, float]:
    """``color`` blended with ``white`` parts of white."""
    return tuple(c + (1.0 - c) * white for c in to_rgb(color))  # type: ignore[return-value]


def short_layer_labels(names: list[str]) -> list[str]:
    """Band labels of layers: ``L3`` for ``layers.3`` / ``layer_3`` where the numbers alone
    tell the layers apart; else the name from its first digit (ResNet's blocks ``layer1.0``
    ... ``layer4.2``: ``1.0`` ... ``4.2``); else the name."""
    tails = [name.rsplit("_", 1)[-1].rsplit(".", 1)[-1] for name in names]
    if all(t.isdigit() for t in tails) and len(set(tails)) == len(tails):
        return [f"L{t}" for t in tails]
    numbered = [re.sub(r"^\D+", "", name) for name in names]
    if all(numbered) and len(set(numbered)) == len(numbered):
        return numbered
    return list(names)


def _host_row(r: RankEvents, lo: int, hi: int, edges: np.ndarray, prefix: str
              ) -> Row | None:
    api, shift = r.api, r.offset_ns
    launchers = np.unique(api.tid[api.launches])
    if launchers.size == 0:
        return None
    s, e = api.start + shift, api.end + shift
    sel = np.isin(api.tid, launchers) & (e > lo) & (s < hi)
    key = np.where(api.launches[sel], 1, 0)
    rgb = _paint(s[sel], e[sel], key, {1: LAUNCH_COLOR, 0: OTHER_API_COLOR}, edges)
    return Row(f"{prefix}host launches", rgb)


def _title(ranks: list[RankEvents], index: int | None, lo: int, hi: int, name: str) -> str:
    what = f"step {index}" if index is not None else "capture"
    busy = []
    for r in ranks:
        g = r.gpu
        s = np.clip(g.start + r.offset_ns, lo, hi)
        e = np.clip(g.end + r.offset_ns, lo, hi)
        merged = sum(b - a for a, b in _merged(s[e > s], e[e > s]))
        busy.append(merged / (hi - lo) if hi > lo else 0.0)
    share = ", ".join(style.fmt_pct(b) for b in busy)
    return (f"{name}: {what}, {style.fmt_ns(hi - lo)}, GPU busy {share}"
            if name else f"{what}, {style.fmt_ns(hi - lo)}, GPU busy {share}")


def timeline(ranks: list[RankEvents], name: str = "") -> Timeline | None:
    """The rows of the window's median step (module docstring); None without events."""
    if not ranks or all(r.gpu.size == 0 and r.api.start.size == 0 for r in ranks):
        return None
    first = ranks[0]
    lo, hi, index = step_of(first)
    lo, hi = lo + first.offset_ns, hi + first.offset_ns
    if len(ranks) > 1 and index is not None:  # the same step on every rank, on one clock
        spans = [(int(r.window.steps[index, 0]) + r.offset_ns,
                  int(r.window.steps[index, 1]) + r.offset_ns)
                 for r in ranks if index < len(r.window.steps)]
        lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    hi = max(hi, lo + 1)
    edges = np.linspace(lo, hi, PIXELS + 1)
    groups = []
    for r in ranks:
        prefix = f"rank {r.rank}  " if len(ranks) > 1 or r.rank is not None else ""
        groups.append(_rank_rows(r, lo, hi, edges, prefix, _own_step(r, index, lo, hi)))
    return Timeline(groups, edges, index, _title(ranks, index, lo, hi, name))


def timeline_figure(ranks: list[RankEvents], name: str = "") -> Figure | None:
    """The figure of :func:`timeline` (None without events)."""
    tl = timeline(ranks, name)
    if tl is None:
        return None
    return _draw(tl.groups, (tl.edges[-1] - tl.edges[0]) / 1e6, tl.title,
                 [r.gpu for r in ranks])


def draw_timeline(ranks: list[RankEvents], path: Path, name: str = "") -> Path:
    """``timeline.png``: :func:`timeline_figure`, or a labelled placeholder."""
    fig = timeline_figure(ranks, name)
    if fig is None:
        return style.empty_figure(path, "Timeline", "no GPU or CUDA API events in the capture")
    return style.save(fig, path)


def _draw(groups: list[list[Row]], span_ms: float, title: str, gpus: list) -> Figure:
    rows: list[Row | None] = []
    for i, group in enumerate(groups):
        if i:
            rows.append(None)
        rows.extend(group)
    heights = [ROW_GAP if row is None else 1.0 for row in rows]
    fig, axes = style.figure(height=1.9 + 0.32 * sum(heights))
    ax = axes[0][0]
    top = 0.0
    ticks, labels = [], []
    for row, h in zip(rows, heights, strict=True):
        if row is not None:
            ax.imshow(row.rgb[None, :, :], aspect="auto", interpolation="nearest",
                      extent=(0, span_ms, top + 0.9, top + 0.1))
            for start, width in row.hatch:
                ax.add_patch(_hatched(start, top, width))
            for centre, text in row.layer_labels:
                ax.text(centre, top + 0.5, text, ha="center", va="center", fontsize=7,
                        color=_ink(row.rgb[min(int(centre / span_ms * PIXELS), PIXELS - 1)]),
                        clip_on=True)
            ticks.append(top + 0.5)
            labels.append(row.label)
        top += h
    ax.set_xlim(0, span_ms)
    ax.set_ylim(top, 0)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_xlabel("time in the step (ms)")
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="y", length=0)
    for spine in ("top", "right", "left"):
        ax.spines[spine].set_visible(False)
    _legend(fig, gpus)
    return fig


def _ink(rgb: np.ndarray) -> str:
    """Black on a light colour, white on a dark one."""
    return "black" if float(np.dot(rgb, (0.299, 0.587, 0.114))) > 0.5 else "white"


def _hatched(start: float, top: float, width: float) -> Rectangle:
    return Rectangle((start, top + 0.1), width, 0.8, fill=False, hatch="////",
                     edgecolor="#1F4E79", linewidth=0)


def _legend(fig, gpus: list) -> None:
    present = sorted({int(c) for g in gpus for c in np.unique(g.category).tolist()})
    # communication kernels are hatched in the rows: so is their legend entry
    handles = [Patch(facecolor=style.CATEGORY_COLORS[CATEGORIES[c]], label=CATEGORIES[c],
                     edgecolor="#1F4E79" if c == COMMUNICATION else "none",
                     hatch="////" if c == COMMUNICATION else None, linewidth=0)
               for c in present]
    handles += [Patch(color=LAUNCH_COLOR, label="launch call"),
                Patch(color=OTHER_API_COLOR, label="other CUDA API call")]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6),
               fontsize=7, frameon=False)
