"""The report's one visual vocabulary: colors, status marks, units, figure size, saving.

Every figure in analysis/outputs/figures.py draws with these, so a category, a phase or a
failure looks the same in all of them; every figure is written by :func:`save`.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # files only; no display on CI or GPU nodes
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from analysis.metrics.categories import CATEGORIES  # noqa: E402
from analysis.outputs.png import compact  # noqa: E402

# -- size: ~10 in at 120 dpi is 1200 px, the width of the HTML report's figure column ----
WIDTH_IN = 10.0
DPI = 120
ROW_IN = 0.3  # height per bar row of a horizontal bar chart

# -- the one categorical palette (seaborn "deep"): every categorical colour below is one of
# these, so no figure falls back to matplotlib's default cycle ------------------------------
PALETTE: tuple[str, ...] = (
    "#4C72B0",  # blue
    "#DD8452",  # orange
    "#8172B3",  # purple
    "#55A868",  # green
    "#C44E52",  # red
    "#64B5CD",  # cyan
    "#937860",  # brown
    "#DA8BC3",  # pink
    "#CCB974",  # olive
    "#8C8C8C",  # grey
)
NEUTRAL = "#B0B0B0"  # "other" / the rest


def palette_colors(names: list[str]) -> dict[str, str]:
    """A colour of :data:`PALETTE` per name, in the given order (cycling past ten)."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


# -- kernel categories: fixed order of CATEGORIES, so a color never moves between runs ----
_CATEGORY_PALETTE = (*PALETTE, "#2F4B7C", "#E8A33D")  # + FP8GEMM (navy), FP8Cast (amber)
CATEGORY_COLORS: dict[str, str] = dict(zip(CATEGORIES, _CATEGORY_PALETTE, strict=True))

# -- attention implementations (workloads/attention.py): impl, or sdpa:<backend> -----------
IMPL_COLORS: dict[str, str] = {
    "naive": PALETTE[9],
    "sdpa": PALETTE[0],
    "sdpa:math": PALETTE[8],
    "sdpa:efficient": PALETTE[3],
    "sdpa:flash": PALETTE[1],
    "sdpa:cudnn": PALETTE[4],
}
#: (line style, marker) per variant of one implementation (dtype, heads, ...), in order
VARIANT_STYLES: tuple[tuple[object, str], ...] = (
    ("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"))

# -- training phases (NVTX ranges of workloads/steps.py) ---------------------------------
PHASES: tuple[str, ...] = ("forward", "loss", "backward", "optimizer", "other")
PHASE_COLORS: dict[str, str] = {
    "forward": PALETTE[0],
    "loss": PALETTE[8],
    "backward": PALETTE[1],
    "optimizer": PALETTE[4],
    "other": NEUTRAL,
}
#: NVTX range name -> phase
PHASE_RANGES: dict[str, str] = {
    "forward_pass": "forward",
    "loss_computation": "loss",
    "backward_pass": "backward",
    "optimizer_step": "optimizer",
    "(step, outside phases)": "other",
}

#: the steps of the naive attention core (NVTX ranges of workloads/attention.py); colours
#: apart from the phases' and the sublayers' (:func:`part_color`)
ATTENTION_STEP_COLORS: dict[str, str] = {
    "computing attention scores": PALETTE[5],
    "causal mask construction": PALETTE[9],
    "computing softmax": PALETTE[7],
    "final matmul": PALETTE[6],
}

# -- idle time causes (analysis/metrics/idle.py) -------------------------------------------
IDLE_COLORS: dict[str, str] = {
    "busy": PALETTE[3],
    "host": PALETTE[4],
    "dependency": PALETTE[2],
    "memory": PALETTE[6],
}
IDLE_LABELS: dict[str, str] = {
    "busy": "busy (kernels, copies)",
    "host": "idle: waiting for host launch",
    "dependency": "idle: kernel dependency / other",
    "memory": "idle: around memcpy / memset",
}

# -- a distributed step per rank (analysis/metrics/ranks.py): the three add up to the step ---
RANK_PARTS: dict[str, tuple[str, str]] = {
    "compute_ms": ("compute (overlapped communication included)", PALETTE[3]),
    "exposed_comm_ms": ("exposed communication (nothing computes)", PALETTE[5]),
    "idle_ms": ("idle (neither)", NEUTRAL),
}
#: collectives (analysis/outputs/ranks.py): marker per op in the bandwidth figure
COLLECTIVE_MARKERS: dict[str, str] = {"all_reduce": "o", "all_gather": "^",
                                      "reduce_scatter": "v"}

# -- run status (pipeline/outcome.py): how a cell that did not run is drawn --------------
OK = "ok"
STATUS_LABELS: dict[str, str] = {
    "ok": "ok",
    "oom": "OOM",
    "error": "error",
    "timeout": "timeout",
    "unsupported": "unsupported",
}
STATUS_HATCH: dict[str, str] = {"oom": "//", "error": "xx", "timeout": "..", "unsupported": "\\\\"}
STATUS_COLOR = "#B22222"
TRACED_COLOR = "#A6BDDB"  # the traced (nsys) value beside the untraced one
MEASURED_COLOR = PALETTE[0]


#: the sublayers of a layer, whatever a model names them, in their order (PALETTE[2], ...)
_PART_PALETTE = (PALETTE[2], PALETTE[3], PALETTE[8], PALETTE[1], PALETTE[4], PALETTE[0])


def part_color(index: int) -> str:
    """The colour of a layer's ``index``-th sublayer (the first two as the GPT's attention and
    FFN always were)."""
    return _PART_PALETTE[index % len(_PART_PALETTE)]


def layer_color(index: int, n_layers: int) -> tuple[float, float, float, float]:
    """A model layer's colour, first to last along one sequential map."""
    return plt.get_cmap("viridis")(index / max(n_layers - 1, 1))


def status_label(status: object) -> str:
    """Short label of a status; ``capture_oom`` (the traced run failed) -> 'capture OOM'."""
    text = "no data" if status is None or status != status else str(status)  # NaN != NaN
    if text.startswith("capture_"):
        return "capture " + STATUS_LABELS.get(text.removeprefix("capture_"), text)
    return STATUS_LABELS.get(text, text)


def mark_gap(ax: Axes, pos: float, status: object, horizontal: bool = False,
             width: float = 0.8) -> None:
    """A hatched, labelled band where a bar would be: the cell did not run (OOM, ...)."""
    key = str(status).removeprefix("capture_")
    style = {"hatch": STATUS_HATCH.get(key, "//"), "fill": False, "edgecolor": STATUS_COLOR,
             "linewidth": 0.0, "alpha": 0.6}  # fmt: skip
    lo, hi = pos - width / 2, pos + width / 2
    if horizontal:
        ax.axhspan(lo, hi, **style)
        ax.text(0.5, pos, status_label(status), transform=ax.get_yaxis_transform(),
                ha="center", va="center", color=STATUS_COLOR, fontsize=8, fontweight="bold",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})  # fmt: skip
    else:
        ax.axvspan(lo, hi, **style)
        ax.text(pos, 0.5, status_label(status), transform=ax.get_xaxis_transform(),
                ha="center", va="center", rotation=90, color=STATUS_COLOR, fontsize=8,
                fontweight="bold", bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})


def status_legend_handle(status: str) -> Patch:
    return Patch(facecolor="white", edgecolor=STATUS_COLOR,
                 hatch=STATUS_HATCH.get(status, "//"), label=status_label(status))


# -- units ---------------------------------------------------------------------------------
def fmt_ms(ms: float) -> str:
    """A duration given in ms, in the unit that reads best (s, ms, µs)."""
    if ms is None or not math.isfinite(ms):
        return "–"
    if abs(ms) >= 1000:
        return f"{ms / 1000:.3g} s"
    if abs(ms) >= 1:
        return f"{ms:.3g} ms"
    return f"{ms * 1000:.3g} µs"


def fmt_ns(ns: float) -> str:
    return fmt_ms(ns / 1e6)


def fmt_tflops(tflops: float) -> str:
    return "–" if tflops is None or not math.isfinite(tflops) else f"{tflops:.3g} TFLOP/s"


GIB = 1024**3


def fmt_gib(nbytes: float) -> str:
    return "–" if nbytes is None or not math.isfinite(nbytes) else f"{nbytes / GIB:.3g} GiB"


def fmt_gain(ratio: float) -> str:
    return "" if ratio is None or not math.isfinite(ratio) else f"×{ratio:.2f}"


def fmt_pct(share: float) -> str:
    return "–" if share is None or not math.isfinite(share) else f"{share * 100:.0f}%"


# -- figures -------------------------------------------------------------------------------
def figure(nrows: int = 1, ncols: int = 1, height: float = 4.0, **kwargs: object
           ) -> tuple[Figure, object]:
    """A report-width figure; ``height`` in inches (clamped to stay on a screen or two)."""
    return plt.subplots(nrows, ncols, figsize=(WIDTH_IN, _on_screen(height)),
                        layout="constrained", squeeze=False, **kwargs)  # fmt: skip


def _on_screen(height: float) -> float:
    """A figure height in inches, kept between 2 and 24 (a screen or two)."""
    return min(max(height, 2.0), 24.0)


def stacked(ncols: list[int], heights: list[float]) -> tuple[Figure, list[object]]:
    """A report-width figure of rows of panels laid out each on its own (subfigures: long
    tick labels in one row do not squeeze the panels of another); ``heights`` in inches,
    clamped together as in :func:`figure`. Per row, its axes as ``figure`` returns them."""
    fig = plt.figure(figsize=(WIDTH_IN, _on_screen(sum(heights))), layout="constrained")
    rows = fig.subfigures(len(ncols), 1, height_ratios=heights, squeeze=False)[:, 0]
    return fig, [row.subplots(1, n, squeeze=False) for row, n in zip(rows, ncols, strict=True)]


class NoData(Exception):  # noqa: N818 - a figure's answer, not a failure
    """A figure has nothing to draw: :func:`empty_figure` draws ``reason`` under ``title``."""

    def __init__(self, title: str, reason: str) -> None:
        super().__init__(reason)
        self.title, self.reason = title, reason


def legend_above(fig: Figure, handles: list, title: str, ncols: int | None = None) -> None:
    """The figure's title and one legend for the whole figure under it, above the panels:
    never over data. (A suptitle and an outside legend would share the top margin and
    overlap; as the legend's title the figure title stacks above the entries.) ``ncols``
    defaults to as many as fit one report-width row."""
    labels = [h.get_label() for h in handles]
    width = max((len(str(lab)) for lab in labels), default=10)
    fit = max(1, int(WIDTH_IN * 72 / (7.5 * 0.55 * width + 36)))  # 7.5 pt text + its marker
    fig.legend(handles, labels, loc="outside upper center", fontsize=7.5, title=title,
               title_fontsize=11, ncols=ncols or max(1, min(len(handles), fit)),
               frameon=False, borderaxespad=0.2, alignment="center")  # fmt: skip


def legend_beside(ax: Axes, **kwargs: object) -> None:
    """The axes' legend to the right of its data, top-aligned: never over data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7.5,
              frameon=False, **kwargs)


def bar_labels(ax: Axes, bars: object, labels: list[str], horizontal: bool = True,
               fontsize: float = 7) -> None:
    """A value label at the end of each bar (also for a zero-length bar: 0 is a value)."""
    ax.bar_label(bars, labels=labels, padding=2, fontsize=fontsize,
                 label_type="edge")  # fmt: skip
    if horizontal:
        ax.margins(x=0.12)
    else:
        ax.margins(y=0.15)


def log_axis(axis: object) -> None:
    """A log axis ticked at 1-2-5 steps with plain numbers (0.5, 1, 2, 5, 10): readable
    whether it spans less than a decade or several, never overlapping minor labels."""
    axis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def bar_rows_height(rows: int, extra: float = 1.4) -> float:
    """Height for a horizontal bar chart of ``rows`` bars."""
    return extra + ROW_IN * max(rows, 1)


def save(fig: Figure, path: Path, description: str | None = None) -> Path:
    """Write a PNG and close the figure (figures are many; pyplot keeps them otherwise);
    ``description`` goes into the PNG's Description text chunk. The PNG is a 256-colour
    palette image (analysis/outputs/png.py): a third of matplotlib's RGBA bytes, which
    published folders and the overview's embedded figures carry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI,
                metadata={"Description": description} if description else None)
    plt.close(fig)
    path.write_bytes(compact(buffer.getvalue()))
    return path


# The Description of a placeholder PNG: the overview leaves such figures out.
NO_DATA = "no data: "


def empty_figure(path: Path, title: str, reason: str) -> Path:
    """A labelled placeholder, so every expected PNG exists even without data."""
    fig, axes = figure(height=2.2)
    ax = axes[0][0]
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, f"{NO_DATA}{reason}", ha="center", va="center", wrap=True,
            fontsize=11, color="#555555")  # fmt: skip
    return save(fig, path, description=f"{NO_DATA}{reason}")


def has_data(path: Path) -> bool:
    """Whether ``path`` is a drawn figure, not a placeholder of :func:`empty_figure`."""
    from PIL import Image

    with Image.open(path) as image:
        return not str(image.info.get("Description", "")).startswith(NO_DATA)


def short_label(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def middle_label(text: str, limit: int = 48) -> str:
    """``text`` shortened in the middle: names that differ only at their end (``…_view_9``,
    ``…_segment_k_on_kernel``) stay apart."""
    if len(text) <= limit:
        return text
    tail = (limit - 1) * 2 // 5
    return text[: limit - 1 - tail] + "…" + text[len(text) - tail:]
