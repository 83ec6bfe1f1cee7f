"""The report's figures, one small function each (captions: report/plot_<name>.rst).

    python -m analysis plots --summary results/summary.csv --results results -o results/plots

Each figure answers one question, per step where time is shown, in the units its axis says,
with the colours of analysis/outputs/style.py and its legend beside or above the data.
:func:`write_figures` always writes every file of :data:`FIGURES`: a figure without data
(a CPU-only matrix, a partial run) becomes a labelled "no data: <reason>" figure, and a cell
that did not run (OOM, unsupported, ...) is drawn as a hatched, labelled gap, never dropped.
Inputs: the summary (analysis/outputs/aggregate.py), the ladder tables (ladders.py) and each
run's ``stats/`` folder (analysis/metrics: phases, extras, idle, durations). The attention
sweep, the phases and the kernel figures have modules of their own (figures_*.py).
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.metrics.categories import CATEGORIES
from analysis.metrics.idle import CAUSES
from analysis.outputs import style
from analysis.outputs.figure_data import num, read_table, run_names, stats_tables
from analysis.outputs.figure_data import status as _status
from analysis.outputs.figures_attention import draw_attention_sweep
from analysis.outputs.figures_kernels import (
    TOP_N,
    draw_kernel_durations,
    draw_top_kernels,
    kernel_labels,
    short_kernel,
)
from analysis.outputs.figures_phases import (
    ATTENTION_STEPS,
    SUBLAYER_BASIS,
    draw_phase_gpu_time,
    layer_frame,
    phase_frame,
    sublayer_names,
)
from analysis.outputs.runs import read_json

#: the figures, in drawing order (rules/report.smk lists the same names)
FIGURES: tuple[str, ...] = (
    "ladder_waterfall",
    "attention_sweep",
    "phase_gpu_time",
    "kernel_categories",
    "step_time",
    "top_kernels",
    "idle_time",
    "kernel_durations",
    "gpu_utilization",
)


# -- 1. ladder waterfall --------------------------------------------------------------------
def draw_ladder_waterfall(summary: pd.DataFrame, results: Path) -> Figure:
    title = "Optimization ladders: untraced step time per rung (95% CI; × = gain)"
    tables = {p.stem: read_table(p) for p in sorted((results / "ladders").glob("*.csv"))}
    tables = {k: t for k, t in tables.items() if not t.empty and "rung" in t}
    if not tables:
        raise style.NoData(title, "no ladder tables (results/ladders/*.csv)")
    fig, axes = style.figure(len(tables), 1, height=0.7 + 3.2 * len(tables))
    for ax, (name, table) in zip(axes[:, 0], tables.items(), strict=True):
        _ladder_panel(ax, name, table)
    fig.suptitle(title, fontsize=11)
    return fig


def _ladder_panel(ax: object, name: str, table: pd.DataFrame) -> None:
    """Linear bars: the eye reads a bar's length as its value, so no log scale even when
    the first rung is 10× the last; each bar says its time and its gain."""
    x = np.arange(len(table))
    step = num(table, "step_ms")
    status = _status(table)
    ok = (status == style.OK) & step.notna()
    low = (step - num(table, "step_ci_low_ms")).clip(lower=0).fillna(0)
    high = (num(table, "step_ci_high_ms") - step).clip(lower=0).fillna(0)
    ax.bar(x[ok], step[ok], yerr=[low[ok], high[ok]], capsize=4, color=style.MEASURED_COLOR,
           error_kw={"linewidth": 1})  # fmt: skip
    gain = num(table, "x_vs_prev")
    for i in np.flatnonzero(ok.to_numpy()):
        label = f"{style.fmt_ms(step.iloc[i])}\n{style.fmt_gain(gain.iloc[i])}"
        ax.annotate(label.strip(), (x[i], step.iloc[i] + high.iloc[i]), ha="center",
                    va="bottom", fontsize=7.5, xytext=(0, 2), textcoords="offset points")
    for i in np.flatnonzero(~ok.to_numpy()):
        style.mark_gap(ax, x[i], status.iloc[i])
    ax.set_ylim(0, max(float((step + high)[ok].max()) if ok.any() else 1.0, 1e-9) * 1.25)
    ax.set_xticks(x, table["rung"].astype(str), rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("step time (ms)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7.5)
    ax.set_title(f"{name} (× = gain over the previous rung that ran)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)


# -- 4. kernel categories -------------------------------------------------------------------
def draw_kernel_categories(summary: pd.DataFrame, results: Path) -> Figure:
    title = "Share of GPU time per kernel category"
    shares = {}
    for run, table in stats_tables(results, run_names(summary, results),
                                   "kernel_categories.csv").items():  # fmt: skip
        t = num(table, "Total Time (ns)").set_axis(table.get("Category", table.index))
        if t.sum() > 0:
            shares[run] = t / t.sum()
    if not shares:
        raise style.NoData(title, "no GPU kernels (stats/kernel_categories.csv)")
    frame = pd.DataFrame(shares).T.reindex(columns=list(CATEGORIES)).fillna(0)
    parts = {cat: (cat, style.CATEGORY_COLORS[cat]) for cat in CATEGORIES if frame[cat].sum() > 0}
    return _stacked_shares(frame, parts, "% of GPU time (kernels + memcpy/memset)", title)


def _stacked_shares(frame: pd.DataFrame, parts: dict[str, tuple[str, str]], xlabel: str,
                    title: str) -> Figure:
    """One horizontal bar per run (row of ``frame``), stacked by column as % (0-100);
    ``parts``: column -> (legend label, color), in stacking order."""
    fig, axes = style.figure(height=style.bar_rows_height(len(frame), 1.8))
    ax = axes[0, 0]
    y, left = np.arange(len(frame)), np.zeros(len(frame))
    for column, (label, color) in parts.items():
        ax.barh(y, frame[column] * 100, left=left, color=color, label=label)
        left += frame[column].to_numpy() * 100
    ax.set_yticks(y, [style.short_label(r) for r in frame.index], fontsize=7.5)
    ax.set_ylim(len(frame) - 0.5, -0.5)
    ax.set_xlim(0, 100)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.tick_params(axis="x", labelsize=7.5)
    style.legend_beside(ax)
    fig.suptitle(title, fontsize=11)
    return fig


# -- 5. step time ---------------------------------------------------------------------------
def draw_step_time(summary: pd.DataFrame, results: Path) -> Figure:
    title = "Step time per run: untraced median with 95% CI, and traced (inside nsys)"
    if summary.empty or "run" not in summary:
        raise style.NoData(title, "no summary rows")
    step, traced = num(summary, "step_ms"), num(summary, "step_ms_traced")
    if step.notna().sum() == 0 and traced.notna().sum() == 0 and (
            _status(summary) == style.OK).all():
        raise style.NoData(title, "no step times in the summary")
    fig, axes = style.figure(height=style.bar_rows_height(len(summary), 1.6))
    ax = axes[0, 0]
    y = np.arange(len(summary))
    low = (step - num(summary, "step_ci_low_ms")).clip(lower=0).fillna(0)
    high = (num(summary, "step_ci_high_ms") - step).clip(lower=0).fillna(0)
    status = _status(summary)
    ok = step.notna()
    ax.barh(y[ok] - 0.2, step[ok], height=0.4, xerr=[low[ok], high[ok]], capsize=2,
            color=style.MEASURED_COLOR, label="untraced median (95% CI)",
            error_kw={"linewidth": 0.8})  # fmt: skip
    ax.barh(y + 0.2, traced, height=0.4, color=style.TRACED_COLOR, label="traced median")
    for i in np.flatnonzero((~ok).to_numpy()):
        if status.iloc[i] != style.OK:
            style.mark_gap(ax, y[i], status.iloc[i], horizontal=True)
    for i in np.flatnonzero(ok.to_numpy()):
        ax.annotate(style.fmt_ms(step.iloc[i]), (step.iloc[i] + high.iloc[i], y[i] - 0.2),
                    xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.margins(x=0.08)
    ax.set_yticks(y, [style.short_label(str(r)) for r in summary["run"]], fontsize=7.5)
    ax.set_ylim(len(summary) - 0.5, -0.5)
    ax.set_xlabel("step time (ms, log)", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    style.legend_above(fig, ax.get_legend_handles_labels()[0], title)
    return fig


# -- 7. idle time ---------------------------------------------------------------------------
def idle_frame(results: Path, runs: list[str]) -> pd.DataFrame:
    """run x (busy, host, dependency, memory) as shares of the GPU's span (summed devices)."""
    out = {}
    for run, t in stats_tables(results, runs, "idle_time.csv").items():
        if not {"device", "cause", "idle_ns", "span_ns"} <= set(t.columns):
            continue
        idle = num(t, "idle_ns").groupby(t["cause"]).sum()
        span = float(num(t, "span_ns").groupby(t["device"]).first().sum())
        if span <= 0:
            continue
        row = {c: float(idle.get(c, 0)) / span for c in CAUSES}
        row["busy"] = 1 - sum(row.values())
        out[run] = row
    return pd.DataFrame.from_dict(out, orient="index", columns=["busy", *CAUSES])


def draw_idle_time(summary: pd.DataFrame, results: Path) -> Figure:
    title = "GPU time in the capture: busy, and idle split by cause"
    frame = idle_frame(results, run_names(summary, results))
    if frame.empty:
        raise style.NoData(title, "no stats/idle_time.csv (rerun `analysis extras`)")
    parts = {part: (style.IDLE_LABELS[part], style.IDLE_COLORS[part]) for part in frame.columns}
    return _stacked_shares(frame, parts, "% of the capture's GPU span (first to last GPU op)",
                           title)


# -- 9. GPU utilization ---------------------------------------------------------------------
def draw_gpu_utilization(summary: pd.DataFrame, results: Path) -> Figure:
    title = "GPU busy % of the capture span, and tensor-core share of kernel time"
    rows = {}
    for run in run_names(summary, results):
        m = read_json(results / run / "stats" / "metrics.json") or {}
        if m.get("gpu_utilization") is not None:
            rows[run] = (m["gpu_utilization"], m.get("tensor_core_share"))
    if not rows:
        raise style.NoData(title, "no GPU activity (stats/metrics.json)")
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=["busy", "tc"]).astype(float)
    fig, axes = style.figure(height=style.bar_rows_height(len(frame), 1.8))
    ax = axes[0, 0]
    y = np.arange(len(frame))
    for column, offset, color, label in (
            ("busy", -0.2, style.IDLE_COLORS["busy"], "GPU busy (% of the capture span)"),
            ("tc", 0.2, style.CATEGORY_COLORS["GEMM"],
             "tensor-core kernels (% of kernel time)")):  # fmt: skip
        share = frame[column]
        # a share of 0 is drawn (a bar of no length, labelled 0%); n/a has no bar
        bars = ax.barh(y + offset, (share * 100).fillna(0), height=0.4, color=color,
                       label=label)  # fmt: skip
        style.bar_labels(ax, bars, [style.fmt_pct(v) if pd.notna(v) else "n/a" for v in share])
    ax.set_yticks(y, [style.short_label(r) for r in frame.index], fontsize=7.5)
    ax.set_ylim(len(frame) - 0.5, -0.5)
    ax.set_xlim(0, 108)
    ax.set_xlabel("% (busy: of the capture's GPU span; tensor cores: of kernel time)",
                  fontsize=8)  # fmt: skip
    ax.tick_params(axis="x", labelsize=7.5)
    ax.grid(axis="x", alpha=0.3)
    style.legend_above(fig, ax.get_legend_handles_labels()[0], title)
    return fig


# -- distributed runs (drawn by `analysis distributed`, not in FIGURES) ----------------------
def plot_rank_timeline(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    """Per distributed run and rank, the mean step split into compute, exposed communication
    and idle (analysis/outputs/ranks.py: <run>/distributed/ranks.csv)."""
    title = "Distributed step per rank: compute, exposed communication, idle (mean per step)"
    rows = {}
    for run in run_names(summary, results):
        table = read_table(results / run / "distributed" / "ranks.csv")
        for _, r in table.iterrows():
            rows[f"{run} · rank {int(r['rank'])}"] = {k: float(r[k]) for k in style.RANK_PARTS}
    if not rows:
        return style.empty_figure(path, title, "no distributed run was captured")
    frame = pd.DataFrame.from_dict(rows, orient="index").fillna(0)
    fig, axes = style.figure(height=style.bar_rows_height(len(frame), 1.8))
    ax = axes[0, 0]
    y, left = np.arange(len(frame)), np.zeros(len(frame))
    for column, (label, color) in style.RANK_PARTS.items():
        ax.barh(y, frame[column], left=left, color=color, label=label)
        left += frame[column].to_numpy()
    for i, total in enumerate(left):
        exposed = frame["exposed_comm_ms"].iloc[i]
        ax.annotate(f"{style.fmt_ms(total)} ({style.fmt_pct(exposed / total)} exposed)"
                    if total else "", (total, y[i]), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=7)  # fmt: skip
    ax.set_yticks(y, [style.short_label(r, 56) for r in frame.index], fontsize=8)
    ax.invert_yaxis()
    ax.margins(x=0.18)
    ax.set_xlabel("ms per step")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title)
    return style.save(fig, path)


def scaling_series(table: pd.DataFrame, summary: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per scaling series (a one-GPU baseline and a parallel mode; the knob runs and the
    no-communication twins left out): GPUs, speedup over the baseline's throughput and its
    95% CI (from the steps' CIs), the baseline first at 1 GPU."""
    by_run = summary.set_index("run")
    series: dict[str, list[dict[str, float]]] = {}
    plain = table[(table["comm"].fillna("on") == "on") & (num(table, "straggle_ms").fillna(0) == 0)
                  & table["baseline_run"].notna() & (num(table, "tokens_per_s") > 0)]
    for _, row in plain.iterrows():
        base = str(row["baseline_run"])
        if base not in by_run.index:
            continue
        name = f"{base.replace('_1gpu', '')} {row['parallel']}{_variant(row)}"
        points = series.setdefault(name, [_point(by_run.loc[base], 1, by_run.loc[base])])
        points.append(_point(by_run.loc[row["run"]], int(row["gpus"]), by_run.loc[base]))
    return {name: pd.DataFrame(points).sort_values("gpus") for name, points in series.items()
            if len(points) > 1}


def _variant(row: pd.Series) -> str:
    """What sets a run apart from the others of its mode (a knob off its default)."""
    parts = []
    if not pd.isna(row.get("bucket_cap_mb")) and float(row["bucket_cap_mb"]) != 25.0:
        parts.append(f"bucket {row['bucket_cap_mb']:g} MB")
    if str(row.get("reshard_after_forward")).lower() == "false":
        parts.append("keep params")
    return f" ({', '.join(parts)})" if parts else ""


def _point(run: pd.Series, gpus: int, base: pd.Series) -> dict[str, float]:
    """Speedup = throughput / the baseline's = gpus x baseline step / step (the same batch
    per GPU); its CI from the step's CI bounds."""
    def speedup(step: object) -> float:
        return gpus * float(base["step_ms"]) / float(step) if step and not pd.isna(step) \
            else float("nan")

    return {"gpus": gpus, "speedup": speedup(run["step_ms"]),
            "low": speedup(run.get("step_ci_high_ms")), "high": speedup(run.get("step_ci_low_ms"))}


def plot_scaling(table: pd.DataFrame, summary: pd.DataFrame, path: Path) -> Path:
    """Speedup over one GPU against GPUs, per model and parallel mode, with the ideal line and
    each point's scaling efficiency (distributed.csv; untraced steps, 95% CIs)."""
    title = "Scaling: throughput over one GPU (same batch per GPU), untraced, 95% CI"
    series = scaling_series(table, summary)
    if not series:
        return style.empty_figure(path, title, "no distributed run with its one-GPU baseline")
    fig, axes = style.figure(height=4.5)
    ax = axes[0, 0]
    top = max(int(frame["gpus"].max()) for frame in series.values())
    ax.plot([1, top], [1, top], color=style.NEUTRAL, linestyle="--", label="ideal (linear)")
    colors = style.palette_colors(list(series))
    for name, frame in series.items():
        yerr = np.vstack([frame["speedup"] - frame["low"], frame["high"] - frame["speedup"]])
        ax.errorbar(frame["gpus"], frame["speedup"], yerr=np.nan_to_num(yerr), marker="o",
                    color=colors[name], capsize=3, label=name)
        for _, p in frame[frame["gpus"] > 1].iterrows():
            ax.annotate(style.fmt_pct(p["speedup"] / p["gpus"]), (p["gpus"], p["speedup"]),
                        xytext=(4, -10), textcoords="offset points", fontsize=7,
                        color=colors[name])
    ticks = sorted({int(g) for frame in series.values() for g in frame["gpus"]})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("GPUs (labels: scaling efficiency)")
    ax.set_ylabel("speedup over 1 GPU")
    ax.grid(alpha=0.3)
    style.legend_beside(ax)
    ax.set_title(title)
    return style.save(fig, path)


def plot_comm_bandwidth(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    """Bus bandwidth per collective and message size (<run>/distributed/collectives.csv)
    against the all-reduce sweep on the same ranks (calibration_allreduce_<N>ranks.json)."""
    title = "Collectives: bus bandwidth vs message size, against the calibrated all-reduce"
    fig, axes = style.figure(height=4.5)
    ax = axes[0, 0]
    drawn = False
    for cal_path in sorted(results.glob("calibration_allreduce_*ranks.json")):
        cal = read_json(cal_path) or {}
        sizes = sorted(cal.get("sizes") or [], key=lambda s: s["bytes"])
        if sizes:
            ax.plot([s["bytes"] for s in sizes], [s["busbw_gbps"] for s in sizes],
                    color="#555555", linestyle="--", marker=".",
                    label=f"calibrated all_reduce, {cal.get('ranks')} ranks "
                          f"({cal.get('backend')})")  # fmt: skip
            drawn = True
    colors = style.PALETTE
    for i, run in enumerate(run_names(summary, results)):
        table = read_table(results / run / "distributed" / "collectives.csv")
        if table.empty or "busbw_gbps" not in table:
            continue
        table = table[num(table, "busbw_gbps") > 0]
        for op, part in table.groupby("op"):
            ax.scatter(num(part, "bytes"), num(part, "busbw_gbps"), color=colors[i % len(colors)],
                       marker=style.COLLECTIVE_MARKERS.get(str(op), "s"), s=36,
                       label=f"{style.short_label(run, 36)}: {op}")  # fmt: skip
            drawn = True
    if not drawn:
        style.plt.close(fig)
        return style.empty_figure(path, title, "no collectives with a size, no calibration")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes; nccl-tests' size: the whole buffer)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title)
    return style.save(fig, path)


#: name -> the function that draws it (raises style.NoData when it has nothing to draw)
DRAWERS: dict[str, Callable[[pd.DataFrame, Path], Figure]] = {
    "ladder_waterfall": draw_ladder_waterfall,
    "attention_sweep": lambda summary, results: draw_attention_sweep(summary),
    "phase_gpu_time": draw_phase_gpu_time,
    "kernel_categories": draw_kernel_categories,
    "step_time": draw_step_time,
    "top_kernels": draw_top_kernels,
    "idle_time": draw_idle_time,
    "kernel_durations": draw_kernel_durations,
    "gpu_utilization": draw_gpu_utilization,
}


def plot(name: str, summary: pd.DataFrame, results: Path, path: Path) -> Path:
    """Figure ``name`` as a PNG at ``path``; a labelled placeholder when it has no data."""
    try:
        fig = DRAWERS[name](summary, results)
    except style.NoData as empty:
        return style.empty_figure(path, empty.title, empty.reason)
    return style.save(fig, path)


def plot_phase_gpu_time(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    return plot("phase_gpu_time", summary, results, path)


def write_figures(summary_csv: Path, results: Path, outdir: Path, jobs: int = 1) -> list[Path]:
    """Every figure of FIGURES into ``outdir`` (always all of them); returns their paths.
    ``jobs`` > 1: drawn by that many forked processes at once (each figure is independent)."""
    outdir.mkdir(parents=True, exist_ok=True)
    summary = read_table(Path(summary_csv))
    results = Path(results)
    paths = [outdir / f"{name}.png" for name in FIGURES]
    tasks = [(summary, results, name, path) for name, path in zip(FIGURES, paths, strict=True)]
    if jobs > 1:
        context = multiprocessing.get_context("fork")  # the figures' imports are already done
        with ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=context) as pool:
            list(pool.map(_draw, *zip(*tasks, strict=True)))
    else:
        for task in tasks:
            _draw(*task)
    return paths


def _draw(summary: pd.DataFrame, results: Path, name: str, path: Path) -> None:
    """One figure; one that cannot be drawn becomes a figure saying why (never stops the
    report)."""
    try:
        plot(name, summary, results, path)
    except Exception as exc:  # noqa: BLE001 - a figure must not stop the report
        style.plt.close("all")
        print(f"warning: figure {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        style.empty_figure(path, name, f"could not draw ({type(exc).__name__}: {exc})")


__all__ = ["ATTENTION_STEPS", "DRAWERS", "FIGURES", "SUBLAYER_BASIS", "TOP_N",
           "idle_frame", "kernel_labels", "layer_frame", "phase_frame", "plot", "sublayer_names",
           "plot_comm_bandwidth", "plot_phase_gpu_time", "plot_rank_timeline", "plot_scaling",
           "scaling_series", "short_kernel", "write_figures"]
