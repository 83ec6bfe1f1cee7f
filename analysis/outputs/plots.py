"""The report's figures, from the aggregated summary and each run's NVTX summary.

    python -m analysis plots --summary results/summary.csv --results results -o results/plots
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on CI or GPU nodes
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

CATEGORY_PREFIX = "category_time_ns_"
#: the figures, in the order write_plots draws them (rules/report.smk lists the same)
PLOTS = ("step_time", "kernel_categories", "gpu_utilization", "nvtx_phases")
PHASES = ["forward_pass", "loss_computation", "backward_pass", "optimizer_step"]


def _figure(labels) -> tuple:
    """A figure wide enough for the bars and tall enough for the rotated run names."""
    longest = max((len(str(label)) for label in labels), default=10)
    return plt.subplots(figsize=(max(6.0, 0.55 * len(labels) + 3.5), 4.0 + 0.075 * longest),
                        layout="constrained")


def _empty(path: Path, title: str, reason: str) -> None:
    """A placeholder figure that says why there is nothing to draw (e.g. a CPU-only matrix)."""
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, reason, ha="center", va="center", wrap=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _finish(fig, ax, path: Path, ylabel: str, title: str) -> None:
    ax.set_ylabel(ylabel)
    ax.set_xlabel("")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=60)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_step_time(summary: pd.DataFrame, path: Path) -> None:
    fig, ax = _figure(summary["run"])
    low = summary["median_ms"] - summary["min_ms"]
    high = summary["max_ms"] - summary["median_ms"]
    ax.bar(summary["run"], summary["median_ms"], yerr=[low, high], capsize=3, color="#4C72B0")
    if summary["median_ms"].max() > 50 * max(summary["median_ms"].min(), 1e-9):
        ax.set_yscale("log")  # attention and 2.7B steps differ by orders of magnitude
    _finish(fig, ax, path, "median step time (ms)", "Measured step time per run")


def gpu_runs(summary: pd.DataFrame) -> pd.DataFrame:
    """Runs whose capture has GPU kernels."""
    if "kernel_count" not in summary:
        return summary.iloc[0:0]
    return summary[pd.to_numeric(summary["kernel_count"], errors="coerce").fillna(0) > 0]


def plot_kernel_categories(summary: pd.DataFrame, path: Path) -> None:
    title = "GPU kernel time by category"
    runs = gpu_runs(summary)
    columns = [c for c in summary.columns if c.startswith(CATEGORY_PREFIX)]
    if runs.empty or not columns:
        _empty(path, title, "No GPU kernels in these runs (CPU-only captures).")
        return
    times = runs.set_index("run")[columns].apply(pd.to_numeric, errors="coerce").fillna(0)
    times.columns = [c.removeprefix(CATEGORY_PREFIX) for c in columns]
    times = times.loc[:, times.sum() > 0]
    # Shares, not absolute times: runs differ in size by orders of magnitude.
    shares = times.div(times.sum(axis=1), axis=0) * 100
    fig, ax = _figure(shares.index)
    shares.plot.bar(stacked=True, ax=ax, colormap="tab10", width=0.8)
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _finish(fig, ax, path, "% of GPU kernel + memory-op time", title)


def plot_gpu_utilization(summary: pd.DataFrame, path: Path) -> None:
    title = "GPU utilization and tensor-core share"
    runs = gpu_runs(summary)
    if runs.empty:
        _empty(path, title, "No GPU kernels in these runs (CPU-only captures).")
        return
    shares = runs.set_index("run")[["gpu_utilization", "tensor_core_share"]]
    shares = shares.apply(pd.to_numeric, errors="coerce") * 100
    fig, ax = _figure(shares.index)
    shares.plot.bar(ax=ax, width=0.8, color=["#55A868", "#C44E52"])
    ax.set_ylim(0, 105)
    _finish(fig, ax, path, "% ", title)


def phase_times(results: Path, run: str) -> dict[str, float]:
    """Mean time per measured step of each training phase, from the run's NVTX summary."""
    nvtx = pd.read_csv(results / run / "stats" / "nvtx_sum.csv")
    # nsys 2025 prefixes default-domain ranges with ':'.
    nvtx["name"] = nvtx["Range"].astype(str).str.lstrip(":")
    steps = nvtx.loc[nvtx["name"] == "profiled_step", "Instances"].sum()
    totals = nvtx.groupby("name")["Total Time (ns)"].sum()
    return {p: totals.get(p, 0) / max(steps, 1) / 1e6 for p in PHASES}


def plot_nvtx_phases(summary: pd.DataFrame, results: Path, path: Path) -> None:
    title = "Time per step in each phase (NVTX ranges)"
    phases = pd.DataFrame({run: phase_times(results, run) for run in summary["run"]}).T
    phases = phases.loc[phases.sum(axis=1) > 0]
    if phases.empty:
        _empty(path, title, "No phase ranges recorded.")
        return
    fig, ax = _figure(phases.index)
    phases.plot.bar(stacked=True, ax=ax, width=0.8)
    _finish(fig, ax, path, "ms per measured step", title)


def write_plots(summary_csv: Path, results: Path, outdir: Path) -> list[Path]:
    """All figures of the report into ``outdir``; returns their paths."""
    outdir.mkdir(parents=True, exist_ok=True)
    summary = pd.read_csv(summary_csv)
    paths = [outdir / f"{name}.png" for name in PLOTS]
    plot_step_time(summary, paths[0])
    plot_kernel_categories(summary, paths[1])
    plot_gpu_utilization(summary, paths[2])
    plot_nvtx_phases(summary, results, paths[3])
    return paths
