"""The `ops` run key (pipeline/config.py): checked values, the op capture's command line,
the plan record, and the disk estimate of its capture."""

from __future__ import annotations

import pytest
import yaml
from conftest import SMOKE_CONFIG

from pipeline import checks
from pipeline.config import ConfigError, resolve


def smoke(**run_keys: object) -> dict:
    cfg = yaml.safe_load(SMOKE_CONFIG.read_text())
    cfg["runs"]["gpt_tiny_train_bf16"].update(run_keys)
    return cfg


@pytest.mark.parametrize("value", [True, "shapes"])
def test_ops_adds_the_op_capture_with_its_flag(value: object) -> None:
    plan = resolve(smoke(ops=value))
    assert list(plan.op_captured) == ["gpt_tiny_train_bf16"]
    flag = "on" if value is True else "shapes"
    args = plan.op_capture_args("gpt_tiny_train_bf16")
    assert args == f"{plan.workload_args('gpt_tiny_train_bf16')} --op_ranges {flag}"
    # the timing processes and the lean capture run without it
    assert "op_ranges" not in plan.workload_args("gpt_tiny_train_bf16")
    assert "ops" not in plan.runs["gpt_tiny_train_bf16"].get("params", {})
    record = plan.record()["runs"]
    assert record["gpt_tiny_train_bf16"]["ops"] == value
    assert record["gpt_tiny_train_fp32"]["ops"] is False


@pytest.mark.parametrize("value, problem", [
    ("on", "is not one of [False, True, 'shapes']"),
    (1, "is not of type bool or str"),
])
def test_ops_values_are_checked(value: object, problem: str) -> None:
    with pytest.raises(ConfigError, match="runs.gpt_tiny_train_bf16.ops") as err:
        resolve(smoke(ops=value))
    assert problem in str(err.value)


def test_ops_needs_the_lean_capture() -> None:
    with pytest.raises(ConfigError, match="needs the lean one"):
        resolve(smoke(ops=True, profile=False))


def test_the_disk_estimate_counts_the_op_capture() -> None:
    params = resolve(smoke()).runs["gpt_tiny_train_bf16"]
    lean = checks.estimate_run_bytes({**params, "ops": False})
    with_ops = checks.estimate_run_bytes({**params, "ops": True})
    with_shapes = checks.estimate_run_bytes({**params, "ops": "shapes"})
    assert lean < with_ops < with_shapes
    assert with_ops - checks.BASE_BYTES == 5 * (lean - checks.BASE_BYTES)
