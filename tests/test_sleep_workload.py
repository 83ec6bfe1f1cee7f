"""`python -m workloads sleep`: a step of a known length, recorded like any run, inside the
runner's NVTX ranges (checked under a real nsys)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO
from test_workloads import RESULT_KEYS, assert_nested, profile_nvtx

from pipeline import config as pipeline_config


def run_sleep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    out = tmp_path / "sleep.json"
    cmd = [sys.executable, "-m", "workloads", "sleep", *args, "--device", "cpu",
           "--out", str(out)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)


def test_record_is_an_ordinary_run_record(tmp_path: Path) -> None:
    done = run_sleep(tmp_path, "--step_ms", "15", "--warmup", "1", "--steps", "4", "--seed", "3")
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "sleep.json").read_text())
    assert set(record) == RESULT_KEYS
    assert record["workload"] == "sleep" and record["status"] == "ok"
    assert record["params"]["step_ms"] == 15.0 and record["params"]["seed"] == 3
    assert len(record["step_ms"]) == 4 and len(record["warmup_times_ms"]) == 1
    # time.sleep never returns early: every step is at least the requested time
    assert min(record["step_ms"]) >= 15.0
    assert record["flops_per_step"] == 0 and record["mfu"] is None and record["losses"] == []
    assert "sleep 15 ms step fp32" in done.stdout


def test_compiling_a_sleep_is_a_usage_error(tmp_path: Path) -> None:
    done = run_sleep(tmp_path, "--step-ms", "1", "--compile", "default")
    assert done.returncode == 2
    assert "nothing to compile" in done.stderr


def test_sleep_ranges_under_nsys(nsys: str, tmp_path: Path) -> None:
    steps = 3
    rows = profile_nvtx(nsys, tmp_path, "sleep", "--step-ms", "5", "--warmup", "1",
                        "--steps", str(steps))
    counts = Counter(name for name, _, _ in rows)
    assert counts["profiled_region"] == 1 and counts["warmup"] == 0
    assert counts["profiled_step"] == steps and counts["sleep"] == steps
    assert_nested(rows, "sleep", "profiled_step")
    assert_nested(rows, "profiled_step", "profiled_region")
    sleeps = [end - start for name, start, end in rows if name == "sleep"]
    assert min(sleeps) >= 5e6  # ns


@pytest.mark.parametrize(("run", "message"), [
    ({"workload": "sleep", "step_ms": 10}, None),
    ({"workload": "sleep", "step_ms": -1}, "step_ms"),
    ({"workload": "sleep", "step_ms": 10, "size": "tiny"}, "unknown parameter 'size'"),
])
def test_pipeline_schema_knows_the_sleep_workload(run: dict, message: str | None) -> None:
    cfg = {"results": "results", "runs": {"s": run}}
    if message is None:
        plan = pipeline_config.resolve(cfg)
        assert "sleep --step_ms 10" in plan.workload_args("s")
    else:
        with pytest.raises(pipeline_config.ConfigError, match=message):
            pipeline_config.resolve(cfg)
