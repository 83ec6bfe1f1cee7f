"""The memory figure of one run (``trace/memory.png``, beside ``trace/timeline.png``): the
allocated bytes over one step with the phases banded and the peak marked, and the bytes by
category at the peak (analysis/outputs/memory.py reads the capture)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.patches import Patch

from analysis.outputs import style

CATEGORY_LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "activations (saved for backward)",
    "temporaries": "temporaries",
    "other": "other (alive before the step)",
}
CATEGORIES = tuple(CATEGORY_LABELS)  # the capture's order (workloads/memory_capture.py)
MEMORY_COLORS = style.palette_colors(list(CATEGORIES))


def memory_figure(capture: dict[str, Any], path: Path, name: str) -> Path:
    """The curve and the category bar; a labelled placeholder when there is nothing to draw
    (a failed run, a CPU run: the curve needs CUDA's allocator history)."""
    title = f"Memory: {name}"
    if capture.get("status") != "ok":
        return style.empty_figure(path, title, capture.get("message") or "no memory capture")
    if not capture.get("curve"):
        reason = "; ".join(capture.get("notes", [])) or "no allocator history"
        return style.empty_figure(path, title, reason)
    fig, rows = style.stacked([1, 1], [3.6, 1.5])
    curve_ax, bar_ax = rows[0][0][0], rows[1][0][0]
    draw_curve(curve_ax, capture)
    draw_categories(bar_ax, capture)
    handles = [
        Patch(facecolor=style.PHASE_COLORS[label], alpha=0.25, label=label)
        for phase, label in style.PHASE_RANGES.items()
        if any(p["phase"] == phase for p in capture.get("phases", []))
    ]
    handles += [Patch(facecolor=MEMORY_COLORS[c], label=CATEGORY_LABELS[c]) for c in CATEGORIES]
    peak = capture["peak_allocated_bytes"]
    style.legend_above(
        fig,
        handles,
        f"{title}: peak {style.fmt_gib(peak)} allocated, "
        f"{style.fmt_gib(capture.get('peak_reserved_bytes'))} reserved",
        ncols=5,
    )
    return style.save(fig, path)


def draw_curve(ax: Any, capture: dict[str, Any]) -> None:
    """Allocated GiB against ms from the step's start; phases as bands; the peak marked."""
    times = [p[0] for p in capture["curve"]]
    gib = [p[1] / style.GIB for p in capture["curve"]]
    for row in capture.get("phases", []):
        label = style.PHASE_RANGES.get(row["phase"], "other")
        ax.axvspan(
            row["start_ms"], row["end_ms"], color=style.PHASE_COLORS[label], alpha=0.18, linewidth=0
        )
    ax.step(times, gib, where="post", color=style.PALETTE[0], linewidth=1.2)
    peak_ms = capture.get("peak_time_ms")
    if peak_ms is not None:
        peak = capture["peak_allocated_bytes"] / style.GIB
        ax.plot([peak_ms], [peak], marker="v", color=style.STATUS_COLOR, markersize=8)
        ax.annotate(
            f"peak {peak:.3g} GiB",
            (peak_ms, peak),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=8,
            color=style.STATUS_COLOR,
        )
    ax.set_xlabel("time in the step (ms, host clock)")
    ax.set_ylabel("allocated (GiB)")
    ax.set_ylim(bottom=0, top=max(gib) * 1.12 if gib and max(gib) > 0 else 1)
    ax.grid(axis="y", alpha=0.3)


def draw_categories(ax: Any, capture: dict[str, Any]) -> None:
    """One horizontal bar: the bytes alive at the peak, by category, each labelled."""
    at_peak = capture.get("at_peak") or {}
    total = sum(at_peak.values()) or 1
    left = 0.0
    for category in CATEGORIES:
        value = at_peak.get(category, 0) / style.GIB
        ax.barh([0], [value], left=left, color=MEMORY_COLORS[category], height=0.6)
        if value / (total / style.GIB) > 0.06:
            ax.text(
                left + value / 2,
                0,
                f"{value:.3g}",
                ha="center",
                va="center",
                fontsize=8,
                color="white",
            )
        left += value
    pool = capture.get("cuda_graph_pool_bytes")
    title = "at the peak, by category (GiB)"
    if pool:
        title += f"; CUDA graph pools reserve {style.fmt_gib(pool)}"
    ax.set_title(title, fontsize=9)
    ax.set_yticks([])
    ax.set_xlabel("GiB")
    ax.set_xlim(0, max(left, 1e-9) * 1.02)
