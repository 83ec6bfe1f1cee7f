"""The FP8 findings on real records: config/fp8.yaml on one H200 (torch 2.11, torchao 0.18.0,
commit 269fe6c5), its summary.csv, plan.json, timing records and the captured runs'
kernel_categories.csv in tests/fixtures/h200/fp8. Each number a title quotes is computed here
again from summary.csv and the timing records, without the findings' code."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO

from analysis.metrics.timing import speedup
from analysis.outputs.finding_base import Finding
from analysis.outputs.findings import find_all

FIXTURE = REPO / "tests" / "fixtures" / "h200" / "fp8"
BF16, TENSORWISE, ROWWISE = (f"gpt_fp8_2.7B_{r}" for r in
                             ("0_bf16_compiled", "1_fp8_tensorwise", "2_fp8_rowwise"))


def run_findings(results: Path) -> dict[tuple[str, str], Finding]:
    return {(f.rule, f.run): f for f in find_all(results, pd.read_csv(results / "summary.csv"))}


@pytest.fixture(scope="module")
def findings() -> dict[tuple[str, str], Finding]:
    return run_findings(FIXTURE)


def summary() -> dict[str, dict[str, str]]:
    with open(FIXTURE / "summary.csv") as f:
        return {row["run"]: row for row in csv.DictReader(f)}


def per_step(row: dict[str, str], column: str) -> float:
    return float(row[column]) / float(row["steps"])


def per_process_steps(run: str) -> list[list[float]]:
    return [json.loads(p.read_text())["step_ms"]
            for p in sorted((FIXTURE / run / "timing").glob("r*.json"))]


def test_tensorwise_at_batch_4_names_the_host_with_its_own_numbers(findings) -> None:
    """The 2.7B's tensorwise step does less GPU work than bf16's and is still slower: the
    title says the host holds it, with the GPU's wait per untraced step (the untraced step
    less the captured GPU work per step) and the kernels launched per step, each run's."""
    rows = summary()
    fp8, bf16 = rows[TENSORWISE], rows[BF16]
    gpu8, gpu16 = (per_step(r, "kernel_time_ns") / 1e6 for r in (fp8, bf16))
    assert gpu8 < gpu16  # FP8 saves GPU time here: the GPU alone cannot explain the loss
    wait8, wait16 = (float(r["step_ms"]) - g for r, g in ((fp8, gpu8), (bf16, gpu16)))
    title = findings[("fp8_does_not_pay", TENSORWISE)].title
    assert "the host holds the step" in title
    assert f"waits at least {wait8:.3g} ms of each untraced step (bf16: {wait16:.3g} ms)" in title
    kernels8, kernels16 = (per_step(r, "kernel_count") for r in (fp8, bf16))
    assert f"{kernels8:.0f} kernels per step (bf16: {kernels16:.0f})" in title
    assert f"GPU work {gpu8:.4g} ms/step against bf16's {gpu16:.4g}" in title
    # cuBLASLt's e4m3 x e5m2 GEMMs count as FP8: almost no GEMM time is left in bf16
    fp8_gemm, bf16_gemm = (per_step(fp8, f"category_time_ns_{c}") / 1e6
                           for c in ("FP8GEMM", "GEMM"))
    assert bf16_gemm < 0.02 * fp8_gemm
    assert f"its FP8 GEMMs take {fp8_gemm:.3g} ms/step" in title


def test_rowwise_at_batch_4_names_its_casts_on_the_gpu(findings) -> None:
    """Rowwise's GPU work grows by more than the GPU's wait: the cause is on the GPU, the
    cast/scale kernels, and the title does not blame the host."""
    rows = summary()
    fp8, bf16 = rows[ROWWISE], rows[BF16]
    title = findings[("fp8_does_not_pay", ROWWISE)].title
    gpu8, gpu16 = (per_step(r, "kernel_time_ns") / 1e6 for r in (fp8, bf16))
    casts = per_step(fp8, "category_time_ns_FP8Cast") / 1e6
    assert gpu8 - gpu16 > 0 and "host" not in title
    assert f"against {casts:.3g} ms/step of cast/scale kernels" in title


@pytest.mark.parametrize(("fp8", "bf16"), [
    ("gpt_fp8_graph_2.7B_1_fp8_tensorwise", "gpt_fp8_graph_2.7B_0_bf16_step_graph"),
    ("fp8_sweep_2.7B_b8_tensorwise", "fp8_sweep_2.7B_b8_none"),
])
def test_where_fp8_pays_the_gpu_is_the_cause_not_the_host(findings, fp8: str, bf16: str
                                                          ) -> None:
    """FP8 saves GPU work and the GPU waits a little longer for the host (the whole-step
    graph at batch 4: 0.1 ms more; batch 8: 7 ms more against 26 ms saved): the step is
    faster for the GPU's work, and the title gives the GEMMs and casts, not the host."""
    rows = summary()
    gpu8, gpu16 = (per_step(rows[r], "kernel_time_ns") / 1e6 for r in (fp8, bf16))
    wait8, wait16 = (float(rows[r]["step_ms"]) - g for r, g in ((fp8, gpu8), (bf16, gpu16)))
    assert 0 < wait8 - wait16 < gpu16 - gpu8  # the host's wait grew, by less than FP8 saved
    title = findings[("fp8_pays", bf16)].title
    assert "host" not in title
    assert f"GPU work {gpu8:.4g} ms/step against bf16's {gpu16:.4g}" in title


@pytest.mark.parametrize("batch", [8, 16, 32])
def test_the_sweep_states_where_fp8_pays_with_its_measured_ci(findings, batch: int) -> None:
    bf16, fp8 = (f"fp8_sweep_2.7B_b{batch}_{r}" for r in ("none", "tensorwise"))
    found = findings[("fp8_pays", bf16)]
    expected = speedup(per_process_steps(bf16), per_process_steps(fp8))
    assert found.gain_run == fp8 and expected.significant and expected.ratio > 1
    assert found.gain == pytest.approx(expected.ratio)
    assert (found.gain_ci_low, found.gain_ci_high) == pytest.approx(
        (expected.ci_low, expected.ci_high))


def test_without_both_captures_the_title_says_so(findings, tmp_path: Path) -> None:
    """The same records without the bf16 rung's capture: no cause is made up."""
    copy = tmp_path / "fp8"
    shutil.copytree(FIXTURE, copy)
    with open(copy / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        if row["run"] == BF16:
            for column in row:
                if column.startswith(("category_time_ns_", "kernel_")):
                    row[column] = ""
    with open(copy / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    without = run_findings(copy)[("fp8_does_not_pay", TENSORWISE)]
    assert "no capture of both runs to say why" in without.title
    assert without.gain == pytest.approx(findings[("fp8_does_not_pay", TENSORWISE)].gain)


def test_the_rungs_beside_the_plain_script_read_the_same_records() -> None:
    """benchmarks/fp8_vs_plain.py on the run's records and the plain script's JSON of the same
    call (tests/fixtures/h200/fp8_plain.json): each ratio is the summary's untraced step over
    the plain step, each loss ratio the last loss of the timing record over bf16's, and the
    plain script's own FP8-over-bf16 loss beside it."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import fp8_vs_plain

    plain = json.loads((FIXTURE.parent / "fp8_plain.json").read_text())
    rows = {r["recipe"]: r for r in fp8_vs_plain.compare(FIXTURE, plain)}
    steps = summary()

    def last(run: str) -> float:
        return json.loads((FIXTURE / run / "timing" / "r0.json").read_text())["losses"][-1]

    for recipe, run in (("bf16", BF16), ("tensorwise", TENSORWISE), ("rowwise", ROWWISE)):
        row, theirs = rows[recipe], plain["recipes"][recipe]
        ratio = float(steps[run]["step_ms"]) / theirs["step_ms"]
        assert row["ratio"] == pytest.approx(ratio)
        assert row["within_5pct"] == (abs(ratio - 1) <= 0.05)
        assert row["loss_vs_bf16"] == pytest.approx(last(run) / last(BF16))
        assert row["plain_loss_vs_bf16"] == pytest.approx(
            theirs["losses"][-1] / plain["recipes"]["bf16"]["losses"][-1])
    # in this call every rung is within 5% of the plain script, each FP8 loss within 2%
    assert all(rows[r]["within_5pct"] and rows[r]["loss_within_2pct"] for r in rows)


def test_every_fp8_run_has_its_loss_against_its_bf16_twin() -> None:
    """benchmarks/fp8_vs_plain.py's second table on the run's records: each finished FP8 run
    (ten, over the four ladders and the sweep; GPT-2's is unsupported) with its last loss over
    its twin's, the twin named here by the config's run names, not found by parameters."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import fp8_vs_plain

    twins = {
        "gpt_fp8_2.7B_1_fp8_tensorwise": BF16, "gpt_fp8_2.7B_2_fp8_rowwise": BF16,
        "gpt_fp8_small_1_fp8_tensorwise": "gpt_fp8_small_0_bf16_compiled",
        "gpt_fp8_small_2_fp8_rowwise": "gpt_fp8_small_0_bf16_compiled",
        "gpt_fp8_graph_small_1_fp8_tensorwise": "gpt_fp8_graph_small_0_bf16_step_graph",
        "gpt_fp8_graph_2.7B_1_fp8_tensorwise": "gpt_fp8_graph_2.7B_0_bf16_step_graph",
        "llama_fp8_all_1_fp8_tensorwise": "llama_fp8_all_0_bf16_compiled",
        **{f"fp8_sweep_2.7B_b{b}_tensorwise": f"fp8_sweep_2.7B_b{b}_none" for b in (8, 16, 32)},
    }

    def last(run: str) -> float:
        return json.loads((FIXTURE / run / "timing" / "r0.json").read_text())["losses"][-1]

    rows = {r["run"]: r for r in fp8_vs_plain.twin_losses(FIXTURE)}
    assert set(rows) == set(twins)
    for run, twin in twins.items():
        assert rows[run]["bf16_run"] == twin
        assert rows[run]["loss_vs_bf16"] == pytest.approx(last(run) / last(twin))
        assert rows[run]["loss_within_2pct"] == (abs(last(run) / last(twin) - 1) <= 0.02)
