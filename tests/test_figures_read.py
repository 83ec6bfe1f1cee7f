"""Every figure reads at report width, drawn from real results: the published H100 standard
matrix, the published model ladders and a CPU smoke run (tests/fixtures/results_cpu_smoke).

Checked on the drawn matplotlib figures (before they become PNGs): no text outside the
canvas, no two titles / axis labels / legends on top of each other, no legend over data,
no overlapping tick labels; and per figure what it promises (the attention sweep's panels
and lines, linear ladder bars, a 0% tensor-core share drawn, kernels per step with unique
labels, CPU time per phase on a CPU).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.axis import Tick
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from analysis.outputs import style
from analysis.outputs.figure_data import STEP_RANGE, captured_steps, read_table
from analysis.outputs.figures import DRAWERS, FIGURES
from analysis.outputs.figures_attention import LINE_KEYS, panel_title, sweep_points
from analysis.outputs.figures_kernels import top_kernel_tables
from tests.analysis_fixtures import FIXTURES
from tests.conftest import REPO

STANDARD = REPO / "published" / "h100" / "standard"
MODELS = REPO / "published" / "h200" / "models"
CPU_SMOKE = FIXTURES / "results_cpu_smoke"
FOLDERS = {"standard": STANDARD, "models": MODELS, "cpu": CPU_SMOKE}
#: figures each folder has data for (the rest are placeholders that say why)
DRAWN = {
    "standard": set(FIGURES),
    "models": set(FIGURES) - {"attention_sweep"},
    "cpu": {"ladder_waterfall", "attention_sweep", "phase_gpu_time", "step_time"},
}
SLACK = 1.0  # px: rounding of extents


def _summary(folder: Path) -> pd.DataFrame:
    return read_table(folder / "summary.csv")


def _draw(name: str, folder: Path, summary: pd.DataFrame | None = None) -> Figure:
    fig = DRAWERS[name](_summary(folder) if summary is None else summary, folder)
    fig.set_dpi(style.DPI)  # as style.save writes it: pixels as in the PNG
    fig.canvas.draw()
    return fig


@pytest.fixture(scope="module")
def drawn() -> dict[tuple[str, str], Figure | str]:
    """(folder, figure) -> the drawn figure, or the reason it has no data."""
    plt.rcParams["figure.max_open_warning"] = 0  # all of them are kept for the tests
    out: dict[tuple[str, str], Figure | str] = {}
    for (key, folder), name in itertools.product(FOLDERS.items(), FIGURES):
        try:
            out[key, name] = _draw(name, folder)
        except style.NoData as empty:
            out[key, name] = empty.reason
    yield out
    plt.close("all")


# -- what every figure must satisfy -----------------------------------------------------------
def _all_axes(fig: Figure) -> list[Axes]:
    return [a for ax in fig.get_axes() for a in (ax, *ax.child_axes) if a.get_visible()]


def _tick_labels(ax: Axes) -> list[list[Text]]:
    """Per axis of ``ax``, the tick labels it draws (inside the view, non-empty)."""
    out = []
    for axis in ax._axis_map.values():  # x, y (a secondary axes has one that is visible)
        if not axis.get_visible():
            continue
        lo, hi = sorted(axis.get_view_interval())
        span = (hi - lo) * 1e-9
        labels = [t.label1 if t.label1.get_visible() else t.label2
                  for t in (*axis.get_major_ticks(), *axis.get_minor_ticks())
                  if lo - span <= t.get_loc() <= hi + span]  # fmt: skip
        out.append([t for t in labels if t.get_visible() and t.get_text()])
    return out


def _inside(box: Bbox, canvas: Bbox) -> bool:
    return (box.x0 >= canvas.x0 - SLACK and box.y0 >= canvas.y0 - SLACK
            and box.x1 <= canvas.x1 + SLACK and box.y1 <= canvas.y1 + SLACK)  # fmt: skip


def _overlap(a: Bbox, b: Bbox) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > SLACK
            and min(a.y1, b.y1) - max(a.y0, b.y0) > SLACK)  # fmt: skip


def _labels(fig: Figure) -> list[tuple[str, Bbox]]:
    """Titles, axis labels and legends: the texts that must never overlap one another."""
    renderer = fig.canvas.get_renderer()
    texts = [t for ax in _all_axes(fig)
             for t in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label,
                       ax.yaxis.label)]  # fmt: skip
    texts += [fig._suptitle] if fig._suptitle else []
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts
             if t.get_visible() and t.get_text()]  # fmt: skip
    legends = fig.legends + [ax.get_legend() for ax in _all_axes(fig) if ax.get_legend()]
    return boxes + [("legend", legend.get_window_extent(renderer)) for legend in legends]


def _drawn_texts(artist: object) -> list[Text]:
    """The non-empty texts under ``artist`` that are drawn (no hidden ancestor), tick labels
    aside (an axis draws only the ticks inside its view: :func:`_tick_labels`)."""
    if not artist.get_visible() or isinstance(artist, Tick):
        return []
    found = [artist] if isinstance(artist, Text) and artist.get_text() else []
    return found + [t for child in artist.get_children() for t in _drawn_texts(child)]


def readability_problems(fig: Figure) -> list[str]:
    """What makes ``fig`` hard to read at report width: text cut off by the canvas,
    colliding labels, a legend over data, overlapping tick labels."""
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    problems = []
    tight = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)
    if not _inside(tight, canvas):
        problems.append(f"tight bbox {tight.bounds} outside the canvas {canvas.bounds}")
    for text in _drawn_texts(fig):
        if text.get_window_extent(renderer).width and not _inside(
                text.get_window_extent(renderer), canvas):  # fmt: skip
            problems.append(f"text {text.get_text()!r} cut off by the canvas")
    for ax in _all_axes(fig):
        for labels in _tick_labels(ax):
            boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels]
            problems += [f"tick label {b[0]!r} outside the canvas" for b in boxes
                         if not _inside(b[1], canvas)]  # fmt: skip
            problems += [f"tick labels {a[0]!r} and {b[0]!r} overlap"
                         for a, b in itertools.combinations(boxes, 2) if _overlap(a[1], b[1])]
    labels = _labels(fig)
    problems += [f"{a[0]!r} and {b[0]!r} overlap"
                 for a, b in itertools.combinations(labels, 2) if _overlap(a[1], b[1])]
    data = [ax.get_window_extent(renderer) for ax in fig.get_axes() if ax.get_visible()]
    problems += [f"a legend lies over the data of {box.bounds}" for name, legend in labels
                 if name == "legend" for box in data if _overlap(legend, box)]  # fmt: skip
    return problems


@pytest.mark.parametrize("folder", list(FOLDERS))
def test_every_figure_reads(drawn: dict, folder: str) -> None:
    for name in FIGURES:
        fig = drawn[folder, name]
        if name not in DRAWN[folder]:
            assert isinstance(fig, str), f"{folder}/{name} drew without data"
            continue
        assert isinstance(fig, Figure), f"{folder}/{name}: no data ({fig})"
        assert readability_problems(fig) == [], f"{folder}/{name}"
        width, height = fig.get_size_inches() * style.DPI
        assert width == style.WIDTH_IN * style.DPI and height <= 24 * style.DPI


def test_the_checks_see_cut_off_and_colliding_text() -> None:
    """The checks above catch what they are for: a label past the canvas edge, two panels'
    x labels running into each other, a legend over the data."""
    fig, axes = plt.subplots(1, 2, figsize=(4, 3), layout="constrained")
    first, second = "a long x label that runs into the next panel's", "the next panel's label"
    axes[0].set_xlabel(first)
    axes[1].set_xlabel(second)
    axes[1].plot([0, 1], [0, 1], label="a line")
    axes[1].legend(loc="center")
    fig.text(0.98, 0.5, "cut off at the right edge")
    fig.canvas.draw()
    problems = " | ".join(readability_problems(fig))
    plt.close(fig)
    assert "cut off by the canvas" in problems
    assert f"{first!r} and {second!r} overlap" in problems
    assert "legend lies over the data" in problems


# -- attention sweep --------------------------------------------------------------------------
def test_sweep_has_a_panel_per_head_dim_causal_direction(drawn: dict) -> None:
    summary = _summary(STANDARD)
    points = sweep_points(summary)
    attention = summary[summary["workload"].isin(["attention", "attention_core"])]
    assert len(points) == len(attention)
    fig = drawn["standard", "attention_sweep"]
    titles = [ax.get_title().replace("\n", " · ") for ax in fig.get_axes() if ax.get_visible()]
    assert sorted(titles) == sorted(panel_title(p) for p in points["panel"].unique())
    # the published sweep: head dims 16, 64, 128 (and the attention layer's 256), causal and
    # not, forward and forward + backward
    assert {p[0] for p in points["panel"]} >= {16, 64, 128}
    assert {p[2] for p in points["panel"]} == {"forward", "forward_backward"}


def test_no_sweep_line_mixes_two_values_of_another_key(drawn: dict) -> None:
    points = sweep_points(_summary(STANDARD))
    for line, group in points.groupby("line"):
        assert group["seq"].is_unique, line
        assert group["panel"].nunique() == 1, line
        for key in [k for k in LINE_KEYS if k in group and k != "batch"]:
            assert group[key].astype(str).nunique(dropna=False) == 1, (line, key)
        batch = pd.to_numeric(group["batch"])
        assert batch.nunique() == 1 or (batch * group["seq"]).nunique() == 1, line
    # the FlashAttention sweeps (batch × seq = 16k tokens) are lines, not lone points
    tokens = points[points["label"].str.contains("16k tokens")]
    assert not tokens.empty and (tokens.groupby("line")["seq"].nunique() == 3).all()
    fig = drawn["standard", "attention_sweep"]
    lines = [line for ax in fig.get_axes() for line in ax.get_lines() if line.get_gid()]
    assert sorted(line.get_gid() for line in lines) == sorted(points["line"].unique())
    for line in lines:
        rows = points[points["line"] == line.get_gid()].sort_values("seq")
        assert list(line.get_xdata()) == list(rows["seq"])
        assert list(line.get_ydata()) == pytest.approx(list(rows["tflops"]))


def test_sweep_marks_runs_that_did_not_run() -> None:
    summary = _summary(STANDARD)
    oom = summary["run"].str.startswith("fa_cudnn_b1_h16_s16384_d128_causalTrue")
    summary.loc[oom, ["status", "tflops"]] = ["oom", np.nan]
    fig = _draw("attention_sweep", STANDARD, summary)
    marked = {ax.get_title().replace("\n", " · ") for ax in fig.get_axes()
              for t in ax.texts if t.get_text() == "OOM"}  # fmt: skip
    points = sweep_points(summary)
    assert marked == {panel_title(p) for p in points.loc[oom[points.index], "panel"]}
    assert len(marked) == 2  # forward and forward + backward
    for ax in fig.get_axes():
        for line in ax.get_lines():
            if line.get_gid() and "sdpa:cudnn" in line.get_gid() and ax.get_title() in {
                    t.replace(" · ", "\n", 1) for t in marked}:  # fmt: skip
                assert 16384 not in list(line.get_xdata())
    assert readability_problems(fig) == []
    plt.close(fig)


# -- ladder waterfall -------------------------------------------------------------------------
def test_waterfall_bars_are_linear_and_labelled(drawn: dict) -> None:
    for folder in ("standard", "models"):
        fig = drawn[folder, "ladder_waterfall"]
        ladders = sorted((FOLDERS[folder] / "ladders").glob("*.csv"))
        assert len(fig.get_axes()) == len(ladders)
        for ax, path in zip(fig.get_axes(), ladders, strict=True):
            assert ax.get_yscale() == "linear"
            table = pd.read_csv(path)
            ran = table[table["status"] == "ok"]
            heights = sorted(p.get_height() for p in ax.patches if p.get_height() > 0)
            assert heights == pytest.approx(sorted(ran["step_ms"]))
            labels = [t.get_text().split("\n")[0] for t in ax.texts]
            assert labels == [style.fmt_ms(v) for v in ran["step_ms"]]


# -- GPU utilization --------------------------------------------------------------------------
def test_zero_tensor_core_share_is_drawn_and_labelled(drawn: dict) -> None:
    fig = drawn["standard", "gpu_utilization"]
    ax = fig.get_axes()[0]
    runs = [t.get_text() for t in ax.get_yticklabels()]
    tc = {run: json.loads((STANDARD / run / "stats" / "metrics.json").read_text())
          ["tensor_core_share"] for run in runs}  # fmt: skip
    assert 0.0 in tc.values()  # fp32 runs: no tensor-core kernels
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == 2 * len(runs)  # every bar, busy and tensor cores, says its value
    tensor = [c for c in ax.containers if "tensor" in c.get_label()][0]
    for run, bar, label in zip(runs, tensor.patches, tensor.datavalues, strict=True):
        assert bar.get_width() == pytest.approx(tc[run] * 100)
        assert label == pytest.approx(tc[run] * 100)
    assert texts.count("0%") >= sum(v == 0 for v in tc.values())


# -- top kernels ------------------------------------------------------------------------------
def test_top_kernels_are_per_step_with_unique_names(drawn: dict) -> None:
    for folder in ("standard", "models"):
        results = FOLDERS[folder]
        tops = top_kernel_tables(_summary(results), results)
        fig = drawn[folder, "top_kernels"]
        for ax, (run, (top, steps)) in zip(fig.get_axes(), tops.items(), strict=True):
            phases = read_table(results / run / "stats" / "phase_gpu_time.csv")
            step_row = phases[phases["Range"] == STEP_RANGE]
            assert steps == captured_steps(phases) == int(step_row["Instances"].iloc[0])
            kernels = read_table(results / run / "stats" / "cuda_gpu_kern_sum.csv")
            expected = kernels.nlargest(len(top), "Total Time (ns)")["Total Time (ns)"]
            widths = [p.get_width() for p in ax.patches]
            assert widths == pytest.approx(list(expected / steps / 1e6))
            labels = [t.get_text() for t in ax.get_yticklabels()]
            assert len(set(labels)) == len(labels), labels
            assert "per step" in ax.get_xlabel() and run in ax.get_title()
    # the published 2.7B fp32 run has three cutlass::Kernel2, told apart by their template
    fig = drawn["standard", "top_kernels"]
    names = [t.get_text() for ax in fig.get_axes() for t in ax.get_yticklabels()]
    cutlass = {n for n in names if n.startswith("cutlass::Kernel2<")}
    assert len(cutlass) >= 3


# -- phases -----------------------------------------------------------------------------------
def test_phase_figure_shows_cpu_time_on_a_cpu(drawn: dict) -> None:
    fig = drawn["cpu", "phase_gpu_time"]
    assert "CPU time" in fig.legends[0].get_title().get_text()
    ax = fig.get_axes()[0]
    assert ax.get_xlabel() == "% of the step's CPU time"
    runs = [t.get_text() for t in ax.get_yticklabels()]
    right = ax.child_axes[0]
    totals = [t.get_text() for t in right.get_yticklabels()]
    assert len(runs) == len(totals) >= 5
    for run, total in zip(runs, totals, strict=True):
        table = read_table(CPU_SMOKE / run / "stats" / "phase_gpu_time.csv")
        step = table.loc[table["Range"] == STEP_RANGE, "CPU ms/step"].iloc[0]
        assert total == style.fmt_ms(step)  # the bar adds up to the step


def test_phase_figure_totals_are_gpu_ms_per_step(drawn: dict) -> None:
    fig = drawn["standard", "phase_gpu_time"]
    ax = fig.get_axes()[0]
    assert ax.get_xlabel() == "% of the step's GPU time"
    runs = [t.get_text() for t in ax.get_yticklabels()]
    totals = [t.get_text() for t in ax.child_axes[0].get_yticklabels()]
    for run, total in zip(runs, totals, strict=True):
        table = read_table(STANDARD / run / "stats" / "phase_gpu_time.csv")
        step = table.loc[table["Range"] == STEP_RANGE, "GPU ms/step"].iloc[0]
        assert total == style.fmt_ms(step)
    height = fig.get_size_inches()[1] * style.DPI
    assert height <= 1400  # 25 runs: one row each, a screen high


@pytest.mark.parametrize("name", ["phase_gpu_time", "attention_sweep", "top_kernels"])
def test_figures_use_the_one_palette(drawn: dict, name: str) -> None:
    from matplotlib.colors import to_hex

    allowed = {*style.PALETTE, style.NEUTRAL, style.STATUS_COLOR}
    fig = drawn["standard", name]
    colours = {to_hex(p.get_facecolor()) for ax in fig.get_axes() for p in ax.patches}
    colours |= {to_hex(line.get_color()) for ax in fig.get_axes() for line in ax.get_lines()
                if line.get_gid()}  # fmt: skip
    assert colours and {c.upper() for c in colours} <= {c.upper() for c in allowed}


def test_cpu_fixture_is_a_cpu_run() -> None:
    """The CPU smoke fixture is what the smoke pipeline writes on a machine without a GPU."""
    summary = _summary(CPU_SMOKE)
    assert set(summary["device_name"].dropna().astype(str)) and not any(
        "NVIDIA" in d for d in summary["device_name"].dropna().astype(str))
    assert captured_steps(read_table(CPU_SMOKE / "gpt_tiny_train_fp32" / "stats" /
                                     "phase_gpu_time.csv")) is not None  # fmt: skip
    for run in ("gpt_tiny_train_fp32", "ladder_tiny_0_fp32_eager"):
        table = read_table(CPU_SMOKE / run / "stats" / "phase_gpu_time.csv")
        assert (table["GPU ms/step"].fillna(0) == 0).all()
        assert table["CPU ms/step"].notna().any()
