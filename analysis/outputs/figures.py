"""The report's figures, one small function each (captions: report/plot_<name>.rst).

    python -m analysis plots --summary results/summary.csv --results results -o results/plots

:func:`write_figures` always writes every file of :data:`FIGURES`: a figure without data
(a CPU-only matrix, a partial run) becomes a labelled "no data: <reason>" figure, and a cell
that did not run (OOM, unsupported, ...) is drawn as a hatched, labelled gap, never dropped.
Inputs: the summary (analysis/outputs/aggregate.py), the ladder tables (ladders.py) and each
run's ``stats/`` folder (analysis/metrics: phases, extras, idle, durations).
"""

from __future__ import annotations

import multiprocessing
import re
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.metrics.categories import CATEGORIES, categorize
from analysis.metrics.idle import CAUSES
from analysis.outputs import style
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
ATTENTION_WORKLOADS = ("attention", "attention_core")
TOP_N = 10
TOP_RUNS = 3
# NVTX ranges inside attention (workloads/attention.py), in execution order
ATTENTION_STEPS = ("computing attention scores", "causal mask construction",
                   "computing softmax", "final matmul")  # fmt: skip
SUBLAYERS = ("attention_sublayer", "ffn_sublayer")
SUBLAYER_BASIS = "basis"  # column of phase_frame's sublayer frame: how the rows were made
LAYER_ROW = r"^layer_(\d+)$"  # phase_gpu_time.csv's layer rows (workloads/gpt.py names them)
_NOT_RUNS = {"plots", "ladders", "logs", "published"}


# -- reading (every reader returns something empty instead of raising) --------------------
def read_table(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (OSError, ValueError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def run_names(summary: pd.DataFrame, results: Path) -> list[str]:
    """Runs of the summary, in its order, then run folders the summary does not list."""
    names = [str(r) for r in summary["run"]] if "run" in summary else []
    if results.is_dir():
        extra = sorted(p.name for p in results.iterdir()
                       if p.is_dir() and p.name not in _NOT_RUNS and p.name not in names
                       and ((p / "stats").is_dir() or (p / "timing").is_dir()))  # fmt: skip
        names += extra
    return names


def stats_tables(results: Path, runs: list[str], name: str) -> dict[str, pd.DataFrame]:
    """run -> its non-empty ``stats/<name>`` table."""
    tables = {run: read_table(results / run / "stats" / name) for run in runs}
    return {run: t for run, t in tables.items() if not t.empty}


def num(frame: pd.DataFrame, column: str) -> pd.Series:
    """A numeric column (NaN where missing or not a number)."""
    if column not in frame:
        return pd.Series(np.nan, index=frame.index)
    return pd.to_numeric(frame[column], errors="coerce")


def _status(frame: pd.DataFrame) -> pd.Series:
    return frame["status"].fillna("no data").astype(str) if "status" in frame else \
        pd.Series(style.OK, index=frame.index)


# -- 1. ladder waterfall --------------------------------------------------------------------
def plot_ladder_waterfall(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    title = "Optimization ladders: step time per rung"
    tables = {p.stem: read_table(p) for p in sorted((results / "ladders").glob("*.csv"))}
    tables = {k: t for k, t in tables.items() if not t.empty and "rung" in t}
    if not tables:
        return style.empty_figure(path, title, "no ladder tables (results/ladders/*.csv)")
    fig, axes = style.figure(len(tables), 1, height=0.6 + 3.4 * len(tables))
    for ax, (name, table) in zip(axes[:, 0], tables.items(), strict=True):
        _ladder_panel(ax, name, table)
    fig.suptitle(title)
    return style.save(fig, path)


def _ladder_panel(ax: object, name: str, table: pd.DataFrame) -> None:
    x = np.arange(len(table))
    step = num(table, "step_ms")
    status = _status(table)
    ok = (status == style.OK) & step.notna()
    low = (step - num(table, "step_ci_low_ms")).clip(lower=0).fillna(0)
    high = (num(table, "step_ci_high_ms") - step).clip(lower=0).fillna(0)
    ax.bar(x[ok], step[ok], yerr=[low[ok], high[ok]], capsize=4, color=style.MEASURED_COLOR)
    good = step[ok]
    if len(good) and good.max() > 10 * good.min():
        ax.set_yscale("log")  # the first rung can be 10-100x slower than the last
    gain = num(table, "x_vs_prev")
    for i in np.flatnonzero(ok.to_numpy()):
        label = f"{style.fmt_ms(step.iloc[i])}\n{style.fmt_gain(gain.iloc[i])}"
        ax.annotate(label.strip(), (x[i], step.iloc[i] + high.iloc[i]), ha="center",
                    va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
    for i in np.flatnonzero(~ok.to_numpy()):
        style.mark_gap(ax, x[i], status.iloc[i])
    ax.margins(y=0.25)
    ax.set_xticks(x, table["rung"].astype(str), rotation=20, ha="right")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"{name} (× = gain over the previous rung that ran)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)


# -- 2. attention sweep ---------------------------------------------------------------------
def _backend(row: pd.Series) -> str:
    impl = str(row.get("impl", "") or "")
    backend = str(row.get("sdpa_backend", "") or "")
    if impl == "sdpa" and backend and backend != "nan":
        return f"sdpa:{backend}"
    return impl or "?"


def plot_attention_sweep(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    title = "Attention: achieved TFLOP/s and peak memory per backend"
    if "workload" not in summary:
        return style.empty_figure(path, title, "no summary")
    runs = summary[summary["workload"].isin(ATTENTION_WORKLOADS)].copy()
    if runs.empty:
        return style.empty_figure(path, title, "no attention runs in the summary")
    # (pandas 3 keeps missing values missing through astype(str): fill them first)
    mode = runs["mode"].fillna("").astype(str) if "mode" in runs else ""
    runs["series"] = (runs.apply(_backend, axis=1) + " · " + mode).str.rstrip(" ·")
    runs["seq_n"] = num(runs, "seq")
    workloads = [w for w in ATTENTION_WORKLOADS if w in set(runs["workload"])]
    fig, axes = style.figure(len(workloads), 2, height=0.6 + 3.6 * len(workloads))
    for row, workload in enumerate(workloads):
        part = runs[runs["workload"] == workload]
        for col, (column, label, scale) in enumerate(
            [("tflops", "TFLOP/s", 1.0), ("peak_memory_bytes", "peak memory (GiB)", style.GIB)]
        ):
            ax = axes[row, col]
            if part["seq_n"].nunique() > 1:
                _sweep_lines(ax, part, column, scale)
            else:
                _sweep_bars(ax, part, column, scale)
            ax.set_ylabel(label)
            ax.set_title(f"{workload}: {label}", fontsize=10)
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    return style.save(fig, path)


def _sweep_bars(ax: object, part: pd.DataFrame, column: str, scale: float) -> None:
    part = part.sort_values("series")
    x = np.arange(len(part))
    value = num(part, column) / scale
    ok = (_status(part) == style.OK) & value.notna()
    colors = [style.MEASURED_COLOR if s.startswith("sdpa") else "#8C8C8C" for s in part["series"]]
    ax.bar(x[ok], value[ok], color=np.array(colors)[ok.to_numpy()])
    for i in np.flatnonzero(~ok.to_numpy()):
        style.mark_gap(ax, x[i], _status(part).iloc[i])
    ax.set_xticks(x, part["series"], rotation=25, ha="right", fontsize=8)


def _sweep_lines(ax: object, part: pd.DataFrame, column: str, scale: float) -> None:
    for series, group in part.sort_values("seq_n").groupby("series"):
        value = num(group, column) / scale
        ok = (_status(group) == style.OK) & value.notna()
        ax.plot(group["seq_n"][ok], value[ok], marker="o", label=series)
        for seq, status in zip(group["seq_n"][~ok], _status(group)[~ok], strict=True):
            # failed cell: a red x on the axis floor with its status
            ax.plot([seq], [0], marker="x", color=style.STATUS_COLOR, clip_on=False,
                    transform=ax.get_xaxis_transform())
            ax.annotate(style.status_label(status), (seq, 0), xycoords=ax.get_xaxis_transform(),
                        xytext=(0, 4), textcoords="offset points", ha="center", fontsize=7,
                        color=style.STATUS_COLOR)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("sequence length")
    ax.legend(fontsize=7)


# -- 3. phase GPU time ----------------------------------------------------------------------
def phase_frame(results: Path, runs: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(run x phase GPU ms/step, run x sublayer/attention-step share of step)."""
    return _phase_frames(stats_tables(results, runs, "phase_gpu_time.csv"))


def layer_frame(results: Path, runs: list[str]) -> pd.DataFrame:
    """run x layer index: GPU ms/step of each ``layer_<i>`` row, and the rows' basis."""
    return _layer_frame(stats_tables(results, runs, "phase_gpu_time.csv"))


def _phase_frames(tables: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    phases, parts = {}, {}
    for run, table in tables.items():
        if "Range" not in table:
            continue
        ms = num(table, "GPU ms/step").set_axis(table["Range"].astype(str))
        share = num(table, "Share of Step").set_axis(table["Range"].astype(str))
        row = {phase: float(ms.get(r, 0) or 0) for r, phase in style.PHASE_RANGES.items()}
        if sum(row.values()) > 0:
            phases[run] = row
        sub = {r: float(share.get(r)) for r in (*SUBLAYERS, *ATTENTION_STEPS)
               if r in share.index and pd.notna(share.get(r))}  # fmt: skip
        if sub:
            parts[run] = {**sub, SUBLAYER_BASIS: _sublayer_basis(table)}
    return (pd.DataFrame.from_dict(phases, orient="index", columns=list(style.PHASES)),
            pd.DataFrame.from_dict(parts, orient="index"))  # fmt: skip


def _layer_frame(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    layers = {}
    for run, table in tables.items():
        if "Kind" not in table:
            continue
        rows = table[table["Kind"].astype(str) == "layer"]
        index = rows["Range"].astype(str).str.extract(LAYER_ROW, expand=False)
        ms = num(rows, "GPU ms/step")
        row = {int(i): float(v) for i, v in zip(index, ms, strict=True)
               if pd.notna(i) and pd.notna(v)}
        if row:
            layers[run] = {**row, SUBLAYER_BASIS: _sublayer_basis(table)}
    frame = pd.DataFrame.from_dict(layers, orient="index")
    numbered = sorted(c for c in frame.columns if c != SUBLAYER_BASIS)
    return frame[[*numbered, SUBLAYER_BASIS]] if layers else frame


def _sublayer_basis(table: pd.DataFrame) -> str:
    """How a run's sublayer rows were attributed: NVTX ranges see forward launches only;
    compiled code is placed by provenance, forward and backward."""
    rows = table[table["Range"].astype(str).isin(SUBLAYERS)]
    basis = " ".join(rows.get("Basis", pd.Series(dtype=str)).fillna("").astype(str))
    phases = " ".join(rows.get("Phases", pd.Series(dtype=str)).fillna("").astype(str))
    where = "fwd+bwd" if "backward" in phases else "fwd"
    return f"{where}, provenance" if "provenance" in basis else where


def plot_phase_gpu_time(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    title = "GPU time per training phase (by launch inside each NVTX phase range)"
    tables = stats_tables(results, run_names(summary, results), "phase_gpu_time.csv")
    phases, parts = _phase_frames(tables)
    if phases.empty:
        return style.empty_figure(path, title, "no phase_gpu_time.csv with phase ranges")
    layers = _layer_frame(tables)
    n_rows = len(phases) + (2 * len(parts) if not parts.empty else 0)
    ncols = 3 if not parts.empty else 2
    heights = [style.bar_rows_height(n_rows / 1.5 + 2)]
    if not layers.empty:  # a row of its own below: one row of dots per run
        heights.append(style.bar_rows_height(len(layers), extra=1.2))
    fig, rows = style.stacked([ncols] + ([1] if not layers.empty else []), heights)
    axes = rows[0]
    y = np.arange(len(phases))
    share = phases.div(phases.sum(axis=1), axis=0)
    left = np.zeros(len(phases))
    ax = axes[0, 0]
    for phase in style.PHASES:
        ax.barh(y, share[phase] * 100, left=left, color=style.PHASE_COLORS[phase], label=phase)
        left += share[phase].to_numpy() * 100
    ax.set_yticks(y, [style.short_label(r, 34) for r in phases.index], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of the step's GPU time")
    ax.set_title("share of step", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower left", fontsize=7, ncols=5)
    # absolute: one dot per phase on a log axis, so 1 ms and 1 s steps both read
    ax = axes[0, 1]
    for phase in style.PHASES:
        ms = phases[phase].where(phases[phase] > 0)
        ax.scatter(ms, y, color=style.PHASE_COLORS[phase], s=22, zorder=3)
    ax.set_xscale("log")
    ax.set_yticks(y, [""] * len(y))
    ax.set_ylim(axes[0, 0].get_ylim())
    ax.set_xlabel("GPU ms per step (log)")
    ax.set_title("absolute", fontsize=10)
    ax.grid(alpha=0.3)
    if not parts.empty:
        _sublayer_panel(axes[0, 2], parts)
    if not layers.empty:
        _layer_panel(rows[1][0, 0], layers)
    fig.suptitle(title)
    return style.save(fig, path)


def _layer_panel(ax: object, layers: pd.DataFrame) -> None:
    """Each layer's GPU ms per step, one row of dots per run, coloured first to last layer:
    the same block n times should line up; an outlier layer stands apart."""
    numbered = [c for c in layers.columns if c != SUBLAYER_BASIS]
    labels = []
    for y, (run, row) in enumerate(layers.iterrows()):
        ms = row[numbered].astype(float).dropna()
        ax.scatter(ms.to_numpy(), np.full(len(ms), y), s=10, zorder=3,
                   c=[style.layer_color(i, len(ms)) for i in ms.index])
        labels.append(f"{style.short_label(str(run), 40)} · {len(ms)} layers "
                      f"({row[SUBLAYER_BASIS]})")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xscale("log")
    ax.set_xlabel("GPU ms per step, per layer (log; colour: first → last layer)")
    ax.set_title("layers", fontsize=10)
    ax.grid(alpha=0.3)


def _sublayer_panel(ax: object, parts: pd.DataFrame) -> None:
    """Attention vs FFN sublayer, and the steps inside attention, as % of the step."""
    labels, y = [], 0
    colors = dict(zip((*SUBLAYERS, *ATTENTION_STEPS),
                      ("#DD8452", "#4C72B0", "#8172B3", "#B0B0B0", "#DA8BC3", "#55A868"),
                      strict=True))  # fmt: skip
    seen: set[str] = set()
    for run, row in parts.iterrows():
        for group, tag in ((SUBLAYERS, "sublayers"), (ATTENTION_STEPS, "attention")):
            present = [r for r in group if r in row and pd.notna(row[r])]
            if not present:
                continue
            left = 0.0
            for r in present:
                ax.barh(y, row[r] * 100, left=left, color=colors[r],
                        label=None if r in seen else r)  # fmt: skip
                seen.add(r)
                left += row[r] * 100
            labels.append(f"{style.short_label(str(run), 22)} · {tag} "
                          f"({row.get(SUBLAYER_BASIS, 'fwd')})")
            y += 1
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("% of the step's GPU time")
    # the labels say what each bar covers: NVTX ranges see forward launches only, the
    # provenance of compiled code places forward and backward kernels
    ax.set_title("sublayers", fontsize=10)
    ax.figure.legend(*ax.get_legend_handles_labels(), loc="outside lower right", fontsize=7,
                     ncols=3)


# -- 4. kernel categories -------------------------------------------------------------------
def plot_kernel_categories(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    title = "Share of GPU time per kernel category"
    shares = {}
    for run, table in stats_tables(results, run_names(summary, results),
                                   "kernel_categories.csv").items():  # fmt: skip
        t = num(table, "Total Time (ns)").set_axis(table.get("Category", table.index))
        if t.sum() > 0:
            shares[run] = t / t.sum()
    if not shares:
        return style.empty_figure(path, title, "no GPU kernels (stats/kernel_categories.csv)")
    frame = pd.DataFrame(shares).T.reindex(columns=list(CATEGORIES)).fillna(0)
    parts = {cat: (cat, style.CATEGORY_COLORS[cat]) for cat in CATEGORIES if frame[cat].sum() > 0}
    return _stacked_shares(frame, parts, "% of GPU time (kernels + memcpy/memset)", title, path)


def _stacked_shares(frame: pd.DataFrame, parts: dict[str, tuple[str, str]], xlabel: str,
                    title: str, path: Path) -> Path:
    """One horizontal bar per run (row of ``frame``), stacked by column as % (0-100);
    ``parts``: column -> (legend label, color), in stacking order."""
    fig, axes = style.figure(height=style.bar_rows_height(len(frame), 1.8))
    ax = axes[0, 0]
    y, left = np.arange(len(frame)), np.zeros(len(frame))
    for column, (label, color) in parts.items():
        ax.barh(y, frame[column] * 100, left=left, color=color, label=label)
        left += frame[column].to_numpy() * 100
    ax.set_yticks(y, [style.short_label(r) for r in frame.index], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title)
    return style.save(fig, path)


# -- 5. step time ---------------------------------------------------------------------------
def plot_step_time(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    title = "Step time per run: untraced median with 95% CI, and traced (inside nsys)"
    if summary.empty or "run" not in summary:
        return style.empty_figure(path, title, "no summary rows")
    step, traced = num(summary, "step_ms"), num(summary, "step_ms_traced")
    if step.notna().sum() == 0 and traced.notna().sum() == 0 and (
            _status(summary) == style.OK).all():
        return style.empty_figure(path, title, "no step times in the summary")
    fig, axes = style.figure(height=style.bar_rows_height(len(summary), 1.6))
    ax = axes[0, 0]
    y = np.arange(len(summary))
    low = (step - num(summary, "step_ci_low_ms")).clip(lower=0).fillna(0)
    high = (num(summary, "step_ci_high_ms") - step).clip(lower=0).fillna(0)
    status = _status(summary)
    ok = step.notna()
    ax.barh(y[ok] - 0.2, step[ok], height=0.4, xerr=[low[ok], high[ok]], capsize=2,
            color=style.MEASURED_COLOR, label="untraced median (95% CI)")  # fmt: skip
    ax.barh(y + 0.2, traced, height=0.4, color=style.TRACED_COLOR, label="traced median")
    for i in np.flatnonzero((~ok).to_numpy()):
        if status.iloc[i] != style.OK:
            style.mark_gap(ax, y[i], status.iloc[i], horizontal=True)
    for i in np.flatnonzero(ok.to_numpy()):
        ax.annotate(style.fmt_ms(step.iloc[i]), (step.iloc[i] + high.iloc[i], y[i] - 0.2),
                    xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_yticks(y, [style.short_label(str(r)) for r in summary["run"]], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("step time (ms, log)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title)
    return style.save(fig, path)


# -- 6. top kernels -------------------------------------------------------------------------
def _kernel_categories(results: Path, run: str) -> dict[str, str]:
    """Kernel name -> the category most of its time got (stats/tensor_core.csv)."""
    table = read_table(results / run / "stats" / "tensor_core.csv")
    if table.empty or not {"Name", "Category"} <= set(table.columns):
        return {}
    return dict(zip(table["Name"].astype(str), table["Category"].astype(str), strict=True))


_TEMPLATE = re.compile(r"<[^<>]*>")


def short_kernel(name: str, limit: int = 60) -> str:
    """A readable kernel name: no return type, template arguments or parameter list."""
    text = str(name)
    for _ in range(6):  # nested templates: innermost first
        new = _TEMPLATE.sub("", text)
        if new == text:
            break
        text = new
    text = re.sub(r"\(.*\)$", "", text.removeprefix("void ")).strip()
    text = re.sub(r"^(at::native::|<unnamed>::|\(anonymous namespace\)::)+", "", text).lstrip(":")
    return style.short_label(text or str(name), limit)


def plot_top_kernels(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    title = f"Top {TOP_N} kernels by total GPU time (heaviest runs)"
    tables = stats_tables(results, run_names(summary, results), "cuda_gpu_kern_sum.csv")
    tables = {r: t for r, t in tables.items() if {"Name", "Total Time (ns)"} <= set(t.columns)}
    if not tables:
        return style.empty_figure(path, title, "no kernels (stats/cuda_gpu_kern_sum.csv)")
    heaviest = sorted(tables, key=lambda r: -num(tables[r], "Total Time (ns)").sum())[:TOP_RUNS]
    rows = [min(TOP_N, len(tables[r])) for r in heaviest]
    fig, axes = style.figure(len(heaviest), 1, height=0.8 + sum(0.25 * n + 0.8 for n in rows),
                             gridspec_kw={"height_ratios": rows})  # fmt: skip
    seen: set[str] = set()
    for ax, run in zip(axes[:, 0], heaviest, strict=True):
        t = tables[run].assign(t=num(tables[run], "Total Time (ns)")).nlargest(TOP_N, "t")
        known = _kernel_categories(results, run)  # per launch: phase and fused ops count
        cats = [known.get(n) or categorize(n) for n in t["Name"].astype(str)]
        seen.update(cats)
        y = np.arange(len(t))
        ax.barh(y, t["t"] / 1e6, color=[style.CATEGORY_COLORS[c] for c in cats])
        ax.set_yticks(y, [short_kernel(n) for n in t["Name"]], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{run}: {style.fmt_ns(num(tables[run], 'Total Time (ns)').sum())} "
                     "of kernels in the capture", fontsize=9)  # fmt: skip
        ax.set_xlabel("total time in the capture (ms)")
        ax.grid(axis="x", alpha=0.3)
    handles = [style.Patch(color=style.CATEGORY_COLORS[c], label=c) for c in CATEGORIES
               if c in seen]  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", fontsize=7, ncols=len(handles))
    fig.suptitle(title)
    return style.save(fig, path)


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


def plot_idle_time(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    title = "GPU time in the capture: busy, and idle split by cause"
    frame = idle_frame(results, run_names(summary, results))
    if frame.empty:
        return style.empty_figure(path, title, "no stats/idle_time.csv (rerun `analysis extras`)")
    parts = {part: (style.IDLE_LABELS[part], style.IDLE_COLORS[part]) for part in frame.columns}
    return _stacked_shares(frame, parts, "% of the capture's GPU span (first to last GPU op)",
                           title, path)


# -- 8. kernel durations --------------------------------------------------------------------
def plot_kernel_durations(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    title = "Kernel durations (log bins); kernels under 10 µs are launch-bound territory"
    tables = stats_tables(results, run_names(summary, results), "kernel_durations.csv")
    tables = {r: t for r, t in tables.items() if num(t, "kernels").sum() > 0}
    if not tables:
        return style.empty_figure(path, title, "no stats/kernel_durations.csv with kernels")
    fig, axes = style.figure(1, 2, height=max(4.0, style.bar_rows_height(len(tables), 1.6)),
                             gridspec_kw={"width_ratios": [3, 2]})  # fmt: skip
    ax = axes[0, 0]
    under = {}
    for run, t in tables.items():
        lo, count = num(t, "bin_low_ns"), num(t, "kernels")
        share = count / count.sum()
        # draw each bin at its lower edge; the open first bin [0, 100 ns) at 50 ns
        ax.step(lo.where(lo > 0, 50) / 1e3, share * 100, where="post",
                label=style.short_label(run, 30))
        under[run] = float(count[lo < 10_000].sum() / count.sum())
    ax.axvline(10, color=style.STATUS_COLOR, linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("kernel duration (µs, log bins)")
    ax.set_ylabel("% of the run's kernels")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    ax = axes[0, 1]
    y = np.arange(len(under))
    ax.barh(y, [v * 100 for v in under.values()], color=style.MEASURED_COLOR)
    ax.set_yticks(y, [style.short_label(r, 30) for r in under], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of kernels under 10 µs")
    fig.suptitle(title)
    return style.save(fig, path)


# -- 9. GPU utilization ---------------------------------------------------------------------
def plot_gpu_utilization(summary: pd.DataFrame, results: Path, path: Path) -> Path:
    title = "GPU busy % of the capture span, and tensor-core share of kernel time"
    rows = {}
    for run in run_names(summary, results):
        m = read_json(results / run / "stats" / "metrics.json") or {}
        if m.get("gpu_utilization") is not None:
            rows[run] = (m["gpu_utilization"], m.get("tensor_core_share"))
    if not rows:
        return style.empty_figure(path, title, "no GPU activity (stats/metrics.json)")
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=["busy", "tc"]).astype(float)
    fig, axes = style.figure(height=style.bar_rows_height(len(frame), 1.6))
    ax = axes[0, 0]
    y = np.arange(len(frame))
    ax.barh(y - 0.2, frame["busy"] * 100, height=0.4, color=style.IDLE_COLORS["busy"],
            label="GPU busy")  # fmt: skip
    ax.barh(y + 0.2, frame["tc"] * 100, height=0.4, color=style.CATEGORY_COLORS["GEMM"],
            label="tensor-core kernels (share of kernel time)")  # fmt: skip
    for i, v in enumerate(frame["busy"]):
        ax.annotate(style.fmt_pct(v), (v * 100, y[i] - 0.2), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=7)  # fmt: skip
    ax.set_yticks(y, [style.short_label(r) for r in frame.index], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 108)
    ax.set_xlabel("%")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title)
    return style.save(fig, path)


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
    colors = [f"C{i}" for i in range(10)]
    for i, run in enumerate(run_names(summary, results)):
        table = read_table(results / run / "distributed" / "collectives.csv")
        if table.empty or "busbw_gbps" not in table:
            continue
        table = table[num(table, "busbw_gbps") > 0]
        for op, part in table.groupby("op"):
            ax.scatter(num(part, "bytes"), num(part, "busbw_gbps"), color=colors[i % 10],
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


PLOTTERS: dict[str, Callable[[pd.DataFrame, Path, Path], Path]] = {
    "ladder_waterfall": plot_ladder_waterfall,
    "attention_sweep": plot_attention_sweep,
    "phase_gpu_time": plot_phase_gpu_time,
    "kernel_categories": plot_kernel_categories,
    "step_time": plot_step_time,
    "top_kernels": plot_top_kernels,
    "idle_time": plot_idle_time,
    "kernel_durations": plot_kernel_durations,
    "gpu_utilization": plot_gpu_utilization,
}


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
        PLOTTERS[name](summary, results, path)
    except Exception as exc:  # noqa: BLE001 - a figure must not stop the report
        style.plt.close("all")
        print(f"warning: figure {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        style.empty_figure(path, name, f"could not draw ({type(exc).__name__}: {exc})")


__all__ = ["FIGURES", "plot_comm_bandwidth", "plot_rank_timeline", "write_figures"]
