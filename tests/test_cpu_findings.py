"""Findings on a CPU run say where its time goes: the rules that read GPU time per kernel
category read the CPU time of the matching NVTX range when the capture has no GPU time, and
findings about the measurement (profiler overhead, unstable timing) come after every finding
about the workload.

The CPU run is the smoke pipeline's (tests/smoke.yaml: real Snakemake, real nsys); the
ordering is also checked on a published H100 folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO
from markdown_tables import section, table_under

from analysis.metrics.categories import OPTIMIZER_PHASE
from analysis.metrics.phases import STEP_RANGE
from analysis.outputs.finding_base import MEASUREMENT, WORKLOAD, finding_sentence
from analysis.outputs.findings import FUSED_OPTIMIZER, OPTIMIZER_SHARE, find_all

H100_DEFAULT = REPO / "tests" / "fixtures" / "published" / "h100-default-f2b989d"


def smoke_results(workdir: Path) -> Path:
    return workdir / "results" / "smoke"


def cpu_share(results: Path, run: str, name: str) -> tuple[float, float]:
    """A range's CPU ms per step and the step's, read straight from the phase table."""
    table = pd.read_csv(results / run / "stats" / "phase_gpu_time.csv").set_index("Range")
    return float(table.loc[name, "CPU ms/step"]), float(table.loc[STEP_RANGE, "CPU ms/step"])


def test_cpu_train_runs_get_the_optimizer_finding_from_cpu_phase_time(
        smoke_workdir: Path) -> None:
    results = smoke_results(smoke_workdir)
    summary = pd.read_csv(results / "summary.csv")
    findings = pd.read_csv(results / "findings.csv")
    optimizer = findings[findings["rule"] == "unfused_optimizer"].set_index("run")
    trains = summary[(summary["status"] == "ok") & (summary["mode"] == "train")
                     & (summary["profiled"].astype(str).str.lower() == "true")]
    assert len(trains) >= 4
    for row in trains.itertuples():
        assert pd.isna(row.kernel_time_ns) or row.kernel_time_ns == 0  # no GPU time on a CPU
        ms, step = cpu_share(results, row.run, OPTIMIZER_PHASE)
        fused = FUSED_OPTIMIZER.applied({"optimizer": row.optimizer})
        expected = ms / step * 100 >= OPTIMIZER_SHARE and not fused
        assert (row.run in optimizer.index) == expected, (row.run, ms, step, row.optimizer)
        if expected:
            f = optimizer.loc[row.run]
            assert f["source"] == f"{row.run}/stats/phase_gpu_time.csv"
            assert (f["key"], f["value_column"]) == (OPTIMIZER_PHASE, "CPU ms/step")
            assert f["value"] == pytest.approx(ms)
            assert f["threshold"] == pytest.approx(OPTIMIZER_SHARE / 100 * step)
            assert "CPU time" in f["title"] and f["about"] == WORKLOAD
    # a foreach AdamW train step on a CPU spends far more than 15% in the optimizer: the
    # ladder's first rung has the finding, and the fused rung measures the fix
    first = summary.loc[summary["rung_index"] == 0, "run"].iloc[0]
    assert first in optimizer.index
    assert optimizer.loc[first, "gain_run"] in set(summary.loc[summary["optimizer"].isin(
        ["adamw_fused", "adamw_master"]), "run"])


def test_workload_findings_come_before_measurement_findings_on_a_cpu(
        smoke_workdir: Path) -> None:
    findings = pd.read_csv(smoke_results(smoke_workdir) / "findings.csv")
    about = list(findings["about"])
    assert WORKLOAD in about and MEASUREMENT in about
    assert about == sorted(about, key=lambda a: a == MEASUREMENT)
    assert set(findings.loc[findings["about"] == MEASUREMENT, "rule"]) <= {
        "high_profiler_overhead", "high_op_overhead", "unstable_timing"}


def test_workload_findings_come_before_measurement_findings_on_a_gpu() -> None:
    summary = pd.read_csv(H100_DEFAULT / "summary.csv")
    found = find_all(H100_DEFAULT, summary)
    about = [f.about for f in found]
    # the info finding about a kernel's occupancy precedes the profiler's overhead
    rules = [f.rule for f in found]
    assert rules.index("low_occupancy") < rules.index("high_profiler_overhead")
    assert about == sorted(about, key=lambda a: a == MEASUREMENT)
    assert {f.rule for f in found if f.about == MEASUREMENT} == {
        "high_profiler_overhead", "unstable_timing"}
    assert all(finding_sentence(f) for f in found)


def ranked_by_cpu(caption: str, header: list[str], rows: list[list[str]]) -> None:
    """A top-ops table of a CPU run: ranked by CPU self time, said so, first row non-zero."""
    assert "CPU self time" in caption and "GPU" not in " ".join(header), (caption, header)
    times = [float(r[header.index("CPU self ms/step")]) for r in rows]
    assert times and times[0] > 0 and times == sorted(times, reverse=True), rows


def test_a_cpu_run_reads_as_a_cpu_run(smoke_workdir: Path) -> None:
    """No GPU wording in the findings of a run without a GPU (here every run); its top-ops
    table in SUMMARY.md ranks by CPU self time and says so."""
    results = smoke_results(smoke_workdir)
    findings = pd.read_csv(results / "findings.csv", keep_default_na=False)
    assert len(findings)
    for f in findings.itertuples():
        assert not re.search(r"\bGPU\b", f"{f.title} {f.fix}"), (f.rule, f.title, f.fix)
    text = (results / "SUMMARY.md").read_text()
    assert not re.search(r"\bGPU\b", section(text, "## Top findings"))
    ranked_by_cpu(*table_under(text, "### Top ops: gpt_tiny_train_bf16"))
