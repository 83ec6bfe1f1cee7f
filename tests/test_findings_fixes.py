"""Findings that hold up: never recommend what the run already has, label joint
gains, and the rules on the new tables (operator table, optimizer roofline).

The results folder is a real H100 pipeline run, published earlier and kept as a fixture:
tests/fixtures/published/h100-default-f2b989d (the default ladder: fp32 eager -> bf16 ->
fused AdamW -> cuDNN SDPA + compile reduce-overhead +
adamw_master, with timing records, traced records and per-run stats), re-aggregated here, plus
two real pieces from the same kind of GPU: the operator table of the bf16 rung's workload
(tests/fixtures/ops: GPT small bf16 train, naive attention, adamw_foreach, on an H100) and
the copy bandwidth that H100's calibration measured (2974 GB/s, in
tests/fixtures/results_h100_subset/calibration.json). Every number is fixed: nothing here
depends on this machine's timing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO

from analysis.outputs.findings import (
    COMPILE,
    CUDA_GRAPHS,
    FUSE_CASTS,
    FUSED_OPTIMIZER,
    MASTER_WEIGHTS,
    STEP_IN_ONE_GRAPH,
    Context,
    Finding,
    finding_sentence,
    recommend,
)
from analysis.outputs.runs import empty_cell

PUBLISHED = REPO / "tests" / "fixtures" / "published" / "h100-default-f2b989d"
OPS = REPO / "tests" / "fixtures" / "ops"
H100_CALIBRATION = REPO / "tests" / "fixtures" / "results_h100_subset" / "calibration.json"
FP32, BF16, FUSED, GRAPHS = (f"gpt_train_small_{r}" for r in
                             ("0_fp32_eager", "1_bf16", "2_fused_adamw", "3_cuda_graphs"))


def _analysis(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "analysis", *args], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def _measured_copy_gbps() -> float:
    """The H100's calibrated copy bandwidth, as its calibration printed it."""
    message = json.loads(H100_CALIBRATION.read_text())["message"]
    return float(re.search(r"copy (\d+) GB/s", message).group(1))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("findings") / "results"
    shutil.copytree(PUBLISHED, out, ignore=shutil.ignore_patterns("*.png", "*.html"))
    # the bf16 rung also had the op capture: its operator table and overhead
    _analysis("ops", str(OPS / "eager_ops_2steps.sqlite"), "-o", str(out / BF16 / "stats"),
              "--times", str(OPS / "eager_ops_times.json"),
              "--lean-times", str(OPS / "eager_plain_times.json"))
    plan = json.loads((out / "plan.json").read_text())
    plan["runs"][BF16]["ops"] = True
    (out / "plan.json").write_text(json.dumps(plan, indent=2))
    calibration = {"status": "ok", "device_name": "NVIDIA H100 80GB HBM3",
                   "copy_gbps": _measured_copy_gbps()}
    (out / "calibration.json").write_text(json.dumps(calibration))
    _analysis("aggregate", "--results", str(out), "--plan", str(out / "plan.json"),
              "--calibration", str(out / "calibration.json"), "-o", str(out / "summary.csv"))
    _analysis("findings", "--results", str(out), "-o", str(out / "findings.csv"))
    return out


@pytest.fixture(scope="module")
def findings(results: Path) -> pd.DataFrame:
    return pd.read_csv(results / "findings.csv")


@pytest.fixture(scope="module")
def ctx(results: Path) -> Context:
    return Context(results, pd.read_csv(results / "summary.csv"))


def _finding(findings: pd.DataFrame, rule: str, run: str) -> Finding:
    rows = findings[(findings["rule"] == rule) & (findings["run"] == run)]
    assert len(rows) == 1, (rule, run, findings[["rule", "run"]].to_string())
    return Finding(**{k: (None if empty_cell(v) else v) for k, v in rows.iloc[0].items()})


def test_no_finding_recommends_a_key_the_run_already_has(findings, ctx) -> None:
    for _, f in findings.iterrows():
        params = ctx.params(f["run"])
        for key, value in re.findall(r"\((\w+): ([\w.-]+)\)", str(f["fix"])):
            assert params.get(key) != value, (f["rule"], f["run"], key, value)
            if key == "compile":  # any compile mode is torch.compile
                assert params["compile"] == "off", (f["rule"], f["run"])
    # the case: autocast casts on the rung with compile and adamw_master (the
    # published findings recommended both there)
    assert ctx.params(GRAPHS)["compile"] == "reduce-overhead"
    assert ctx.params(GRAPHS)["optimizer"] == "adamw_master"
    assert ctx.category_share(GRAPHS, "CopyMemset") >= 10
    assert not ((findings["run"] == GRAPHS) & (findings["rule"] == "autocast_casts")).any()
    published = pd.read_csv(PUBLISHED / "findings.csv")
    assert ((published["run"] == GRAPHS) & (published["rule"] == "autocast_casts")).any()


def test_fixes_the_run_has_are_left_out_of_the_recommendation(ctx) -> None:
    def finding(run: str) -> Finding:
        return Finding(rule="test", run=run, title="t", value=0.0, threshold=0.0,
                       source="summary.csv", key_column="run", key=run, value_column="x",
                       fix="")

    # fused AdamW has one of the two optimizer fixes: only the other is said
    f = recommend(ctx, finding(FUSED), [MASTER_WEIGHTS, FUSED_OPTIMIZER])
    assert f is not None and f.fix == MASTER_WEIGHTS.text
    # compile (reduce-overhead) and adamw_master: nothing left to recommend, no finding
    assert recommend(ctx, finding(GRAPHS), [FUSE_CASTS, MASTER_WEIGHTS]) is None
    # CUDA graphs and compile are there; a whole-step graph is not
    f = recommend(ctx, finding(GRAPHS), [CUDA_GRAPHS, STEP_IN_ONE_GRAPH, COMPILE])
    assert f is not None and f.fix == STEP_IN_ONE_GRAPH.text
    # eager bf16 has none of them: all three, and the measured gain of the graphs rung
    f = recommend(ctx, finding(BF16), [CUDA_GRAPHS, STEP_IN_ONE_GRAPH, COMPILE])
    assert f.fix.count(" or ") == 2 and f.gain_run == GRAPHS


def test_gain_from_a_rung_that_changes_more_is_a_joint_gain(findings) -> None:
    every = "attention=sdpa; compile=reduce-overhead; optimizer=adamw_master; sdpa_backend=cudnn"
    casts = _finding(findings, "autocast_casts", BF16)
    assert casts.gain_run == GRAPHS and casts.gain_changes == every
    # the rung applies both cast fixes (compile, adamw_master) and also changes attention:
    # beyond one fix (compile, the first) are the optimizer and attention
    assert casts.joint_keys == "attention=sdpa; optimizer=adamw_master; sdpa_backend=cudnn"
    sentence = finding_sentence(casts)
    assert "**joint gain** of every difference: " + every.replace("; ", ", ") in sentence
    # this ladder has no rung that makes one of those changes alone
    assert casts.single_gains is None and "alone" not in sentence
    attention = _finding(findings, "naive_attention", BF16)
    assert attention.gain_run == GRAPHS and attention.gain_changes == every
    assert attention.joint_keys == "compile=reduce-overhead; optimizer=adamw_master"
    launch = _finding(findings, "launch_bound", BF16)
    assert launch.joint_keys == "attention=sdpa; optimizer=adamw_master; sdpa_backend=cudnn"
    # within a severity, a gain measured for the fix alone ranks before a larger joint one
    high = findings[findings["severity"] == "high"]
    assert list(zip(high["rule"], high["run"], strict=True)) == [
        ("fp32_gemm_no_tensor_cores", FP32), ("launch_bound", BF16), ("launch_bound", FUSED)]


def test_gain_of_a_one_key_variant_is_not_joint(findings) -> None:
    gemm = _finding(findings, "fp32_gemm_no_tensor_cores", FP32)
    assert gemm.gain_run == BF16 and gemm.joint_keys is None
    assert gemm.gain_changes == "dtype=bf16"
    assert "joint" not in finding_sentence(gemm)
    assert "which differs only in dtype=bf16" in finding_sentence(gemm)
    # two later rungs apply a fused optimizer; the one that changes nothing else is chosen
    optimizer = _finding(findings, "unfused_optimizer", BF16)
    assert optimizer.gain_run == FUSED and optimizer.joint_keys is None


def test_one_op_dominating(findings, results) -> None:
    f = _finding(findings, "dominant_op", BF16)
    ops = pd.read_csv(results / BF16 / "stats" / "ops.csv").set_index("Op")
    assert f.key == "aten::copy_" and f.value == pytest.approx(
        ops.loc["aten::copy_", "GPU Share of Step"])
    assert f.value >= f.threshold == 0.2
    # casts under autocast in an eager foreach run: both cast fixes, none applied yet
    assert f.fix == f"{FUSE_CASTS.text} or {MASTER_WEIGHTS.text}"
    assert f.gain_run == GRAPHS and f.joint_keys == (
        "attention=sdpa; optimizer=adamw_master; sdpa_backend=cudnn")
    # its op capture cost +21%, under the 25% that calls for a warning
    assert not ((findings["rule"] == "high_op_overhead") & (findings["run"] == BF16)).any()


def test_optimizer_at_the_memory_roofline(findings, results) -> None:
    summary = pd.read_csv(results / "summary.csv").set_index("run")
    fused = summary.loc[FUSED]
    # AdamW moves 7 x 4 bytes per parameter: 28 x 128.6 M in 1.37 ms of optimizer_step
    assert fused["optimizer_bytes_per_step"] == 28 * fused["params_count"]
    assert fused["optimizer_gbps"] == pytest.approx(
        fused["optimizer_bytes_per_step"] / fused["phase_gpu_ms_optimizer_step"] / 1e6)
    assert fused["memory_gbps_source"] == "calibrated copy"
    f = _finding(findings, "optimizer_at_roofline", FUSED)
    assert f.value == pytest.approx(fused["optimizer_roofline"]) and f.value >= 0.8
    assert "fusing more will not help" in f.fix and "bf16 optimizer state" in f.fix
    # the foreach optimizer of the bf16 rung is far from it: no such finding there
    assert summary.loc[BF16, "optimizer_roofline"] < 0.5
    assert not ((findings["rule"] == "optimizer_at_roofline") & (findings["run"] == BF16)).any()


def test_every_finding_cites_its_cell(findings, results) -> None:
    assert {"dominant_op", "optimizer_at_roofline", "autocast_casts"} <= set(findings["rule"])
    for _, f in findings.iterrows():
        table = pd.read_csv(results / f["source"])
        row = table.loc[table[f["key_column"]].astype(str) == str(f["key"])]
        assert len(row) == 1, (f["rule"], f["key"])
        assert float(row.iloc[0][f["value_column"]]) == pytest.approx(f["value"]), f["rule"]
