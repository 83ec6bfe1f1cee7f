"""``analysis diff``, the figure (ratios.png): per matched run, old / new step time with its
95% CI, sorted, coloured by verdict; report width, run names in full, plain ratio ticks."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from analysis.outputs import style
from analysis.outputs.diff_noise import FASTER, INCONCLUSIVE, SLOWER, VERDICTS, WITHIN_NOISE

TITLE = "Step time, old vs new, per run"
X_LABEL = "old / new step time, with its 95% CI (> 1: new is faster)"
VERDICT_COLORS = {FASTER: style.PALETTE[3], SLOWER: style.PALETTE[4],
                  WITHIN_NOISE: style.PALETTE[9], INCONCLUSIVE: style.PALETTE[8]}
# Tick steps per decade, coarsest first: the first that puts enough ticks in the range wins.
TICK_STEPS = ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8),
              (1, 1.1, 1.2, 1.3, 1.5, 1.7, 2, 2.5, 3, 4, 5, 6, 7, 8, 9))
MIN_TICKS = 4
NAME_POINTS = 7.5  # run name size, smaller when rows are many (the figure's height is capped)


def ratio_ticks(low: float, high: float) -> list[float]:
    """Round ratios between ``low`` and ``high`` (log axis): from the coarsest steps that
    give at least :data:`MIN_TICKS` of them."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    ticks: list[float] = []
    for steps in TICK_STEPS:
        ticks = sorted({round(s * 10**d, 6) for d in decades for s in steps
                        if low <= s * 10**d <= high})
        if len(ticks) >= MIN_TICKS:
            break
    return ticks


def plain_ratio(value: float, _pos: object = None) -> str:
    """A ratio as a plain number: 0.4, 1, 2.5 (never 4×10⁻¹)."""
    return f"{value:g}"


def ratios_figure(runs: pd.DataFrame) -> Figure | None:
    """The figure for ``runs`` (runs.csv), or None when no run has a ratio."""
    ok = runs[runs["speedup"].notna()].sort_values("speedup")
    if ok.empty:
        return None
    rows = len(ok)
    fig, axes = style.figure(height=style.bar_rows_height(rows, extra=1.6))
    ax = axes[0][0]
    row_points = fig.get_figheight() * 72 / (rows + 5)
    names = min(NAME_POINTS, max(4.0, row_points * 0.8))
    for i, r in enumerate(ok.itertuples()):
        color = VERDICT_COLORS.get(r.verdict, style.NEUTRAL)
        ax.errorbar([r.speedup], [i], xerr=[[r.speedup - r.speedup_ci_low],
                                             [r.speedup_ci_high - r.speedup]],
                    fmt="o", color=color, markersize=4, capsize=2.5, linewidth=1.2)
        if r.verdict in (FASTER, SLOWER):  # a verdict's number: the step time's change
            ax.annotate(f"{r.change_pct:+.0f}%", (r.speedup_ci_high, i), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=names, color=color)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(rows), list(ok["run"]), fontsize=names)
    ax.set_ylim(-0.7, rows - 0.3)
    _ratio_axis(ax, float(ok["speedup_ci_low"].min()), float(ok["speedup_ci_high"].max()))
    ax.grid(axis="x", color="#E5E5E5", linewidth=0.6)
    ax.set_axisbelow(True)
    present = [v for v in VERDICTS if v in set(ok["verdict"])]
    handles = [Line2D([], [], marker="o", linestyle="", color=VERDICT_COLORS[v],
                      label=f"{v} ({int((ok['verdict'] == v).sum())})") for v in present]
    fig.legend(handles=handles, loc="outside upper center", ncols=max(len(handles), 1),
               title=TITLE, title_fontsize=11, fontsize=8, frameon=False)
    return fig


def _ratio_axis(ax: object, low: float, high: float) -> None:
    """A log ratio axis over [low, high] (and 1) with plain labels at round ratios."""
    low, high = min(low, 1.0) / 1.08, max(high, 1.0) * 1.08
    ax.set_xscale("log")
    ax.set_xlim(low, high)
    ax.xaxis.set_major_locator(FixedLocator(ratio_ticks(low, high)))
    ax.xaxis.set_major_formatter(FuncFormatter(plain_ratio))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(X_LABEL, fontsize=9)


def plot_ratios(runs: pd.DataFrame, path: Path) -> Path:
    """ratios.png: a labelled placeholder when no run was measured on both sides."""
    fig = ratios_figure(runs)
    if fig is None:
        return style.empty_figure(path, TITLE, "no run measured on both sides")
    return style.save(fig, path, description=TITLE)
