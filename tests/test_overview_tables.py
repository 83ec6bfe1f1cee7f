"""Overview tables on real results: the published H100 summaries (made by the pipeline)."""

from __future__ import annotations

import re

import pandas as pd
from conftest import REPO

from analysis.metrics.modules import outermost
from analysis.outputs.overview import machine_line
from analysis.outputs.overview_experiments import attention_tables, runs_of
from analysis.outputs.overview_ops import ladder_ops, module_glance
from analysis.outputs.overview_tables import (
    MODE_PHASES,
    ladder_table,
    modes_table,
    phase_cell,
    read_ladders,
)
from analysis.outputs.runs import read_json

PUBLISHED = REPO / "tests" / "fixtures" / "published" / "h100-default-f2b989d"
STANDARD = REPO / "published" / "h100" / "standard"
MODELS = REPO / "published" / "h200" / "models"


def test_modes_table_pairs_a_ladders_first_and_last_rung() -> None:
    summary = pd.read_csv(PUBLISHED / "summary.csv")
    table = modes_table(summary)
    train = table[table["mode"] == "train"]
    assert list(train["run"]) == ["gpt_train_small_0_fp32_eager", "gpt_train_small_3_cuda_graphs"]
    first = summary.set_index("run").loc["gpt_train_small_0_fp32_eager"]
    assert train.iloc[0]["ms/step [95% CI]"].startswith(f"{first['step_ms']:.2f} [")
    # captured: the phase GPU time the capture measured, as in summary.csv
    assert f"opt {first['phase_gpu_ms_optimizer_step']:.2f}" in train.iloc[0][
        "ms per phase (capture)"]


def test_modes_table_finds_the_same_configuration_in_other_modes() -> None:
    """A forward run with the first rung's keys joins its row; one with other keys does not."""
    summary = pd.read_csv(PUBLISHED / "summary.csv")
    rung0 = summary[summary["run"] == "gpt_train_small_0_fp32_eager"].iloc[0]
    same = rung0.copy()
    same[["run", "mode", "ladder", "ladder_group", "rung_index", "rung"]] = [
        "fwd_same", "forward", None, None, None, None]
    other = same.copy()
    other[["run", "dtype"]] = ["fwd_bf16", "bf16"]
    table = modes_table(pd.concat([summary, pd.DataFrame([same, other])], ignore_index=True))
    rows = table[(table["configuration"] == "fp32_eager")]
    assert list(rows["mode"]) == ["fwd", "train"]
    assert list(rows["run"]) == ["fwd_same", "gpt_train_small_0_fp32_eager"]


def _phases(cell: str) -> list[str]:
    return re.findall(r"([a-z]+) [\d.]+", cell)


def test_phases_a_run_did_not_have_are_absent() -> None:
    """The 2.7B best configuration's forward run recorded 0.00 for backward and optimizer
    (a whole-step graph): a forward run shows its forward only, forward+backward no
    optimizer, train all four."""
    summary = pd.read_csv(STANDARD / "summary.csv").set_index("run", drop=False)
    forward = summary.loc["cs336_2.7B_forward_best"]
    assert forward["phase_gpu_ms_backward_pass"] == 0  # what the capture wrote
    table = modes_table(summary.reset_index(drop=True))
    cells = dict(zip(table["run"], table["ms per phase (capture)"], strict=True))
    assert _phases(cells["cs336_2.7B_forward_best"]) == ["fwd"]
    assert _phases(cells["cs336_2.7B_forward_fp32_eager"]) == ["fwd"]
    assert _phases(cells["cs336_2.7B_forward_backward_best"]) == ["fwd", "loss", "bwd"]
    assert _phases(cells["gpt_train_2.7B_7_step_graph"]) == ["fwd", "loss", "bwd", "opt"]
    assert "0.00" not in cells["cs336_2.7B_forward_best"]
    assert len(MODE_PHASES["train"]) == 4
    # a run that failed has no phases at all
    oom = summary.loc["gpt_small_train_fp32_b256_ctx1024"]
    assert phase_cell(oom) == ""


def test_attention_rows_sort_by_their_numbers() -> None:
    """b1, b4, b16 and s1024, s4096, s16384 in numeric order, never as text; one table per
    set of implementations compared, no column without a value."""
    summary = pd.read_csv(STANDARD / "summary.csv")
    plan = read_json(STANDARD / "plan.json")
    tables = attention_tables(runs_of(summary, plan))
    by_columns = {tuple(t.grid.header[1:]): t for t in tables}
    fa = by_columns[("fwd flash", "fwd cudnn", "fwd+bwd flash", "fwd+bwd cudnn")]
    batches = [int(re.match(r"b(\d+)", r[0]).group(1)) for r in fa.grid.rows]
    assert batches == sorted(batches) and batches[0] == 1 and batches[-1] == 16
    cs336 = by_columns[("fwd naive", "fwd sdpa", "fwd+bwd naive", "fwd+bwd sdpa")]
    shapes = [tuple(int(v) for v in re.findall(r"\d+", r[0])) for r in cs336.grid.rows]
    assert shapes == sorted(shapes) and len(shapes) == 9
    assert "b8 h1" in cs336.title and "causal" in cs336.title
    backends = by_columns[("naive", "math", "efficient", "flash", "cudnn")]
    assert len(backends.grid.rows) == 1
    # every cell is the run's TFLOP/s; the fastest per row and mode in bold
    tflops = summary.set_index("run")["tflops"]
    row = backends.grid.rows[0]
    assert row[5] == f"**{tflops['attn_sdpa_cudnn_b8_h16_s4096_d128_forward']:.4g}**"
    assert row[1] == f"{tflops['attn_naive_b8_h16_s4096_d128_forward']:.4g}"
    for table in tables:
        assert all(any(r[i] != "—" for r in table.grid.rows)
                   for i in range(len(table.grid.header)))


def test_ladder_table_puts_every_rung_of_every_model_side_by_side() -> None:
    summary = pd.read_csv(STANDARD / "summary.csv")
    ladders = read_ladders(STANDARD, summary)
    assert list(ladders) == ["gpt_train_small", "gpt_train_2.7B"]  # the config's order
    grid = ladder_table(ladders)
    assert grid.header[1:3] == ["small ms/step [95% CI]", "small ×"]
    rungs = [r[0] for r in grid.rows]
    assert rungs == list(ladders["gpt_train_small"]["rung"])  # 2.7B's are a subset
    graphs = grid.rows[rungs.index("cuda_graphs")]
    assert graphs[3] == "—"  # not a 2.7B rung
    small = ladders["gpt_train_small"]
    best = small.loc[small["step_ms"].idxmin()]
    assert grid.rows[rungs.index(best["rung"])][1].startswith(f"**{best['step_ms']:.2f} [")


def test_one_top_ops_table_per_ladder_eager_beside_the_best_rung() -> None:
    summary = pd.read_csv(STANDARD / "summary.csv")
    tables = ladder_ops(STANDARD, read_ladders(STANDARD, summary), summary)
    assert [t.title for t in tables] == ["Top ops: gpt_train_small", "Top ops: gpt_train_2.7B"]
    small = tables[0].grid
    # the eager rung with an op capture (ATen ops) beside the fastest rung (compiled kernels)
    assert small.header[0] == "bf16: ATen op" and small.header[4].startswith("step_graph:")
    ops = pd.read_csv(STANDARD / "gpt_train_small_2_bf16" / "stats" / "ops.csv")
    top = ops.sort_values("GPU Self (ns)", ascending=False)["Op"].head(5).tolist()
    assert [r[0] for r in small.rows] == top
    assert "ATen ops" in small.caption and "Triton kernel" in small.caption


def test_cpu_header_names_the_cpu_and_no_gpu_fields() -> None:
    """The same runs as measured on a CPU (no CUDA version, driver or GPU recorded)."""
    summary = pd.read_csv(STANDARD / "summary.csv")
    plan = read_json(STANDARD / "plan.json")
    gpu = machine_line(summary, plan)
    assert gpu.startswith("GPU: NVIDIA H100 80GB HBM3 · driver 580.159.04 · CUDA 13.0")
    cpu = summary.assign(device_name="Intel(R) Xeon(R) Processor", cuda=None, gpu_name=None,
                         provenance_driver=None)
    line = machine_line(cpu, plan)
    assert line.startswith("CPU: Intel(R) Xeon(R) Processor · torch ")
    assert "GPU" not in line and "driver" not in line and "CUDA" not in line and "?" not in line


def test_outermost_modules_skip_a_container_that_is_never_called() -> None:
    table = pd.read_csv(MODELS / "gpt2_train_all_5_step_graph" / "stats" / "module_table.csv",
                        keep_default_na=False)
    assert outermost(table["Module"]) == ["lm_head", "transformer"]
    # without the root module and the layers' list (a ModuleList has no range of its own),
    # the layers are outermost, their children are not
    inner = [m for m in table["Module"] if m not in ("transformer", "transformer.h")]
    roots = outermost(inner)
    assert "transformer.h.0" in roots and "transformer.h.11" in roots
    assert "transformer.h.0.attn" not in roots and "transformer.wte" in roots
    assert all(not any(m.startswith(r + ".") for r in roots) for m in roots)
    glance = module_glance(table)
    assert list(glance["module"][:2]) == ["lm_head", "transformer"]
