"""The op capture through the real pipeline (CPU smoke matrix: `gpt_tiny_train_bf16` has
`ops: shapes`): a second capture of the run with PyTorch's op ranges, its operator table, and
the overhead of the ranges in the summary. On a CPU the op ranges come from the dispatch-mode
fallback (workloads/op_ranges.py) and there are no kernels: GPU columns are zero or empty."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import SMOKE_CONFIG

SMOKE = yaml.safe_load(SMOKE_CONFIG.read_text())
RUN = "gpt_tiny_train_bf16"
STEPS = SMOKE["defaults"]["steps"]


def results(workdir: Path) -> Path:
    return workdir / SMOKE["results"]


def test_op_capture_gives_an_operator_table(smoke_workdir: Path) -> None:
    stats = results(smoke_workdir) / RUN / "stats"
    ops = pd.read_csv(stats / "ops.csv")
    assert {"aten::mm", "aten::mul", "aten::_foreach_lerp_", "aten::_to_copy"} <= set(ops["Op"])
    # CPU time of every op that ran; each op runs the same number of times in every step
    assert (ops["CPU Self (ns)"] > 0).all()
    assert (ops["CPU Total (ns)"] >= ops["CPU Self (ns)"]).all()
    assert (ops["Calls"] % STEPS == 0).all()
    assert (ops["Calls/Step"] == ops["Calls"] / STEPS).all()
    # no GPU here: no kernels, no GPU time, no share of a step GPU time that does not exist
    assert (ops["GPU Self (ns)"] == 0).all() and (ops["Kernels"] == 0).all()
    assert ops["GPU Share of Step"].isna().all()
    shapes = pd.read_csv(stats / "ops_by_shape.csv")
    mm = shapes[shapes["Op"] == "aten::mm"]
    assert len(mm) >= 2 and mm["Input Shapes"].str.startswith("[[").all()
    assert mm["Calls"].sum() == ops.set_index("Op").loc["aten::mm", "Calls"]


def test_only_the_op_capture_has_op_ranges(smoke_workdir: Path) -> None:
    run = results(smoke_workdir) / RUN
    assert json.loads((run / "ops_times.json").read_text())["params"]["op_ranges"] == "shapes"
    for lean in [run / "times.json", *sorted((run / "timing").glob("r*.json"))]:
        assert json.loads(lean.read_text())["params"]["op_ranges"] == "off", lean
    nvtx = pd.read_csv(run / "stats" / "nvtx_sum.csv")
    assert not nvtx["Range"].astype(str).str.contains("aten::").any()
    assert (run / "ops.sqlite").stat().st_size > 0


def test_plan_and_summary_carry_ops_and_its_overhead(smoke_workdir: Path) -> None:
    out = results(smoke_workdir)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["runs"][RUN]["ops"] == "shapes"
    assert plan["runs"]["gpt_tiny_train_fp32"]["ops"] is False
    summary = pd.read_csv(out / "summary.csv").set_index("run")
    row = summary.loc[RUN]
    metrics = json.loads((out / RUN / "stats" / "ops_metrics.json").read_text())
    assert row["ops"] == "shapes" and row["ops_status"] == "ok"
    assert row["ops_overhead"] == pytest.approx(metrics["ops_overhead"])
    assert metrics["ops_overhead"] == pytest.approx(
        metrics["ops_step_ms_traced"] / metrics["ops_lean_step_ms_traced"] - 1)
    assert metrics["ops_lean_step_ms_traced"] == pytest.approx(row["step_ms_traced"])
    assert pd.isna(summary.loc["gpt_tiny_train_fp32", "ops_overhead"])


def test_overview_shows_the_top_ops_with_their_overhead(smoke_workdir: Path) -> None:
    out = results(smoke_workdir)
    md = (out / "SUMMARY.md").read_text()
    section = md[md.index(f"## Top ops: {RUN}"):]
    overhead = pd.read_csv(out / "summary.csv").set_index("run").loc[RUN, "ops_overhead"]
    assert f"the op ranges changed the traced step by {overhead:+.0%}" in section
    assert "| aten::" in section.split("## ")[1]
