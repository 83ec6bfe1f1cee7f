"""The timeline figure of one measured step (analysis/outputs/timeline.py) on real H100 and
H200 captures: its text stays on the canvas, one band per training phase in step order,
layers in order, and idle GPU time left white exactly where the export has no GPU op."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from analysis.metrics.extras import RunInputs
from analysis.metrics.phases import PHASES
from analysis.outputs.timeline import PIXELS, step_of, timeline, timeline_figure
from analysis.outputs.traceevents import read_ranks

FIXTURES = Path(__file__).parent / "fixtures"
H100 = FIXTURES / "h100"
RO = H100 / "compiled_small_fused_reduce-overhead"
CASES = {
    "eager": ([H100 / "gpt_small_train_bf16_ctx512.sqlite"], None, None),
    "cuda_graphs": ([RO.with_suffix(".sqlite")], RO.with_suffix(".json"),
                    RO.parent / (RO.name + "_torch_trace")),
    "ddp_rank": ([FIXTURES / "h200x2" / "gpt_small_ddp2_rank1.sqlite"], None, None),
}
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
              "CUPTI_ACTIVITY_KIND_MEMSET")


def _ranks(case: str):
    exports, record, torch_trace = CASES[case]
    return read_ranks(exports, run=RunInputs.load(record, torch_trace))


@pytest.mark.parametrize("case", sorted(CASES))
def test_text_stays_on_the_canvas(case: str) -> None:
    """Everything drawn (labels, legend, title; matplotlib's tight box of the drawn
    artists) lies inside the figure."""
    fig = timeline_figure(_ranks(case), f"gpt_small_{case}")
    fig.canvas.draw()
    drawn = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
    width, height = fig.get_size_inches()
    assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01
    assert drawn.x1 <= width + 0.01 and drawn.y1 <= height + 0.01
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert any("stream" in t for t in labels) and any("host" in t for t in labels)


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_band_per_phase_in_step_order(case: str) -> None:
    tl = timeline(_ranks(case))
    phase_row = next(r for r in tl.groups[0] if r.label.endswith("phase"))
    keys = [k for k, _, _ in sorted(phase_row.bands, key=lambda b: b[1])]
    assert len(keys) == len(set(keys)), "a phase drawn twice"
    assert [PHASES[k] for k in keys] == [p for p in PHASES if PHASES.index(p) in keys]
    assert {"forward_pass", "backward_pass", "optimizer_step"} <= {PHASES[k] for k in keys}


def test_layers_are_banded_and_labelled_in_order() -> None:
    """GPT small's 12 layers: forward first to last, labelled L0..L11."""
    tl = timeline(_ranks("eager"))
    layer_row = next(r for r in tl.groups[0] if r.label.endswith("layer"))
    assert [text for _, text in sorted(layer_row.layer_labels)] == [f"L{i}" for i in range(12)]


def test_a_resnets_blocks_are_banded_in_forward_order_by_stage_and_block() -> None:
    """ResNet-18 on the H100 (tests/fixtures/h100/models/resnet_eager): its blocks
    ``layer1.0`` ... ``layer4.1`` are numbered in forward order, stage by stage (not by the
    block number alone, which four stages share), and labelled ``1.0`` ... ``4.1``."""
    case = H100 / "models" / "resnet_eager"
    ranks = read_ranks([case / "profile.sqlite"], run=RunInputs.load(case / "times.json", None))
    tl = timeline(ranks)
    phase_row = next(r for r in tl.groups[0] if r.label.endswith("phase"))
    forward_end = next(b for k, _, b in phase_row.bands if PHASES[k] == "forward_pass")
    layer_row = next(r for r in tl.groups[0] if r.label.endswith("layer"))
    forward = [k for k, a, _ in sorted(layer_row.bands, key=lambda b: b[1]) if a < forward_end]
    assert forward == sorted(forward) and set(forward) == set(range(8))
    labels = [text for _, text in sorted(layer_row.layer_labels)]
    assert labels[:8] == [f"{stage}.{block}" for stage in range(1, 5) for block in range(2)]


def _busy_columns(export: Path, lo: int, hi: int, edges: np.ndarray) -> np.ndarray:
    """Pixel columns any GPU op of the export overlaps (plain SQL and integer arithmetic)."""
    busy = np.zeros(PIXELS, bool)
    with sqlite3.connect(f"file:{export}?mode=ro", uri=True) as con:
        tables = {t for (t,) in con.execute("SELECT name FROM sqlite_master")}
        for table in tables.intersection(GPU_TABLES):
            for start, end in con.execute(f"SELECT start, end FROM {table} WHERE end > ?"
                                          " AND start < ? AND end > start", (lo, hi)):
                first = max(int(np.searchsorted(edges, start, "right")) - 1, 0)
                last = min(int(np.searchsorted(edges, end, "left")) - 1, PIXELS - 1)
                busy[first:last + 1] = True
    return busy


@pytest.mark.parametrize("case", ["eager", "ddp_rank"])
def test_idle_gpu_time_is_white(case: str) -> None:
    """A stream row's pixel is white exactly where no GPU op ran (one stream per capture
    here, or the union of the streams)."""
    ranks = _ranks(case)
    tl = timeline(ranks)
    lo, hi, _ = step_of(ranks[0])
    streams = [r for r in tl.groups[0] if "stream" in r.label]
    drawn = np.zeros(PIXELS, bool)
    for row in streams:
        drawn |= (row.rgb < 1).any(axis=1)
    expected = _busy_columns(CASES[case][0][0], lo, hi, tl.edges)
    assert 0.02 < 1 - expected.mean(), "the step has idle time to show"
    assert (drawn == expected).all()



def test_a_ranks_bands_stay_inside_its_own_step() -> None:
    """Both ranks of a real two-GPU DDP capture (H200 pair) on one clock: the figure spans
    both ranks' step, and each rank's phase and layer bands end within that rank's own step
    (the next step's first ops of the rank that finished first must not stretch its forward
    and layer bands over the window)."""
    folder = FIXTURES / "h200x2" / "gpt_small_ddp2_2gpu"
    ranks = read_ranks(sorted(folder.glob("profile.rank*.sqlite")),
                       run=RunInputs.load(folder / "times.json", None))
    tl = timeline(ranks)
    assert tl is not None and tl.step is not None and len(tl.groups) == 2
    for r, rows in zip(ranks, tl.groups, strict=True):
        start = int(r.window.steps[tl.step, 0]) + r.offset_ns
        end = int(r.window.steps[tl.step, 1]) + r.offset_ns
        bands = [b for row in rows if row.label.endswith(("phase", "layer")) for b in row.bands]
        assert bands
        assert all(a >= start and b <= end for _, a, b in bands), r.rank
        phase = next(row for row in rows if row.label.endswith("phase"))
        keys = [k for k, _, _ in phase.bands]
        assert len(keys) == len(set(keys)), "a phase drawn twice"
    # the window holds GPU work of a rank outside its own step (what the bands must skip)
    outside = 0
    for r in ranks:
        start = int(r.window.steps[tl.step, 0]) + r.offset_ns
        end = int(r.window.steps[tl.step, 1]) + r.offset_ns
        gs = r.gpu.start + r.offset_ns
        outside += int(((gs >= end) & (gs < tl.edges[-1])).sum() + ((gs < start) & (
            gs >= tl.edges[0])).sum())
    assert outside > 0
