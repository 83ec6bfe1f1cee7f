"""summary.csv keeps what was measured under the measured columns' names: a workload parameter
of the same name (the sleep workload's ``step_ms``, the step it asks for) is
``param_<name>``, never the measurement.

On real records: the CPU runs of tests/fixtures/diff-cpu, whose delayed folder d20 asks its
sleep runs for 12 and 48 ms steps and measured a little more (a sleep wakes up late).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO

from analysis.metrics.timing import summarize
from analysis.outputs.runs import read_timing

D20 = REPO / "tests" / "fixtures" / "diff-cpu" / "d20"
ASKED_MS = {"sleep_10": 12.0, "sleep_40": 48.0}


def test_sleep_step_ms_is_measured_and_the_asked_step_kept(tmp_path: Path) -> None:
    """`python -m analysis aggregate` of the d20 folder, as the pipeline's rule runs it: the
    sleep runs' step_ms is the timing processes' estimate (above the step they asked for),
    param_step_ms the step asked for; a run without records has no step_ms at all."""
    out = tmp_path / "summary.csv"
    subprocess.run([sys.executable, "-m", "analysis", "aggregate", "--results", str(D20),
                    "-o", str(out)], cwd=REPO, check=True, capture_output=True)
    summary = pd.read_csv(out).set_index("run")
    for run, asked in ASKED_MS.items():
        row = summary.loc[run]
        measured = summarize(read_timing(D20 / run).per_process_ms).median_ms
        assert row["step_ms"] == pytest.approx(measured)
        assert row["step_min_ms"] <= row["step_ms"] <= row["step_max_ms"]
        assert row["step_ms"] > asked and row["param_step_ms"] == asked
    # the plan's other sleep runs have no records in this copy: failed, nothing measured
    unmeasured = summary.loc["sleep_20"]
    assert unmeasured["status"] != "ok" and pd.isna(unmeasured["step_ms"])
    assert unmeasured["param_step_ms"] == 24.0
