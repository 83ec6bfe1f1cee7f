"""The phase figure's modules panel (analysis/outputs/figures_phases.py): a model workload's
top modules from its module table, forward and backward, drawn from the published H200 model
ladders (and the earlier H100 ones, whose flagged tables it leaves out); checked against the
run's own CSVs read independently. The figure's readability is tests/test_figures_read.py's."""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgba

from analysis.outputs import style
from analysis.outputs.figure_data import read_table
from analysis.outputs.figures import DRAWERS
from analysis.outputs.figures_phases import TOP_MODULES, module_frame, top_modules
from analysis.outputs.runs import module_table_suspect
from tests.conftest import REPO

MODELS = REPO / "published" / "h200" / "models"
EARLIER = REPO / "tests" / "fixtures" / "published" / "h100-models-d5baf48"
STANDARD = REPO / "published" / "h100" / "standard"
PANEL_TITLE = f"top {TOP_MODULES} modules (module table)\nforward | backward"


def _rows(run: str, name: str) -> list[dict[str, str]]:
    with (MODELS / run / "stats" / name).open() as f:
        return list(csv.DictReader(f))


def _step_gpu_ms(run: str) -> float:
    return next(float(r["GPU ms/step"]) for r in _rows(run, "phase_gpu_time.csv")
                if r["Range"] == "profiled_step")


@pytest.mark.parametrize("run", ["cs336_lm_train_all_0_fp32_eager", "gpt2_train_all_4_compile",
                                 "resnet50_train_all_7_step_graph"])
def test_the_layers_group_is_every_layer_summed_as_a_share_of_the_step(run: str) -> None:
    rows = _rows(run, "module_table.csv")
    layers = [r for r in rows if r["Layer"] and r["Layer"] == r["Module"]]
    step = _step_gpu_ms(run)
    groups = module_frame(MODELS, [run])[run]
    name, fwd, bwd = groups[0]  # the layers hold most of every published step
    assert name == f"{len(layers)} layers"
    assert fwd == pytest.approx(sum(float(r["Forward GPU ms/step"]) for r in layers) / step)
    assert bwd == pytest.approx(sum(float(r["Backward GPU ms/step"]) for r in layers) / step)
    assert 1 <= len(groups) <= TOP_MODULES
    totals = [f + b for _, f, b in groups]
    assert totals == sorted(totals, reverse=True) and totals[-1] >= 0.005


def test_modules_holding_layers_are_left_out_and_outside_ones_kept() -> None:
    table = read_table(MODELS / "gpt2_train_all_0_fp32_eager" / "stats" / "module_table.csv")
    names = [name for name, _, _ in top_modules(table, "GPU", n=10)]
    # HF's `transformer` and `transformer.h` hold the 12 blocks: their time is the layers'
    assert names[0] == "12 layers" and "lm_head" in names
    assert "transformer" not in names and "transformer.h" not in names
    assert {"transformer.wte", "transformer.wpe", "transformer.ln_f"} <= set(names)
    lm_head = next(r for r in _rows("gpt2_train_all_0_fp32_eager", "module_table.csv")
                   if r["Module"] == "lm_head")
    assert dict((n, (f, b)) for n, f, b in top_modules(table, "GPU", n=10))["lm_head"] == (
        pytest.approx(float(lm_head["Forward GPU ms/step"])),
        pytest.approx(float(lm_head["Backward GPU ms/step"])))


def _bars(ax: object) -> list[tuple[float, float, str]]:
    """(left, width, colour) of each bar the panel drew."""
    return [(p.get_x(), p.get_width(), p.get_facecolor()) for p in ax.patches]


@pytest.mark.parametrize(("folder", "flagged"), [(MODELS, 0), (EARLIER, 9)],
                         ids=["h200", "h100-earlier-hooks"])
def test_the_panel_draws_each_run_forward_then_backward_and_only_for_model_runs(
        folder: Path, flagged: int) -> None:
    summary = read_table(folder / "summary.csv")
    fig = DRAWERS["phase_gpu_time"](summary, folder)
    panels = [ax for ax in fig.get_axes() if ax.get_title() == PANEL_TITLE]
    assert len(panels) == 1
    frame = module_frame(folder, list(summary["run"]))
    # every published model run has its table drawn, but those that fail the self-check
    # (the earlier module-range hooks' tables; checked on the table alone)
    suspect = {run for run in summary["run"] if module_table_suspect(folder, run)}
    assert len(suspect) == flagged and set(frame) == set(summary["run"]) - suspect
    bars = _bars(panels[0])
    assert len(bars) == 2 * sum(len(g) for g in frame.values())  # forward and backward each
    forward = to_rgba(style.PHASE_COLORS["forward"])
    drawn_forward = sorted(round(w, 6) for left, w, c in bars if c == forward and left == 0)
    assert drawn_forward == sorted(round(f * 100, 6) for g in frame.values() for _, f, _ in g)
    plt.close(fig)


def test_the_gpt_run_has_no_module_panel() -> None:
    standard = DRAWERS["phase_gpu_time"](read_table(STANDARD / "summary.csv"), STANDARD)
    assert PANEL_TITLE not in [ax.get_title() for ax in standard.get_axes()]  # the GPT's
    plt.close(standard)
