"""Input the README promises to check does not slip through (issue 34, item 6): a typo in
`defaults`, a config without runs, a `select` that would shrink the summary, and a GPU config
started on a machine without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import SMOKE_CONFIG, snakemake, stopped
from timing_records import write_timing

from analysis.outputs.aggregate import summary_table
from pipeline import checks, config


def smoke(**changes) -> dict:
    cfg = yaml.safe_load(SMOKE_CONFIG.read_text())
    cfg.update(changes)
    return cfg


def write_config(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


# --- 1. defaults: a key no workload takes is refused --------------------------------------------


def test_unknown_default_key_is_refused() -> None:
    cfg = smoke()
    cfg["defaults"]["warmpu"] = 2
    with pytest.raises(config.ConfigError) as err:
        config.resolve(cfg)
    assert err.value.where == "defaults.warmpu"
    assert "no workload takes it" in err.value.problem
    assert "did you mean 'warmup'" in err.value.problem


def test_default_keys_of_some_workload_or_the_pipeline_stay_allowed() -> None:
    """`context` is gpt's only: the attention runs do not get it; `ops` is the pipeline's."""
    cfg = smoke()
    cfg["defaults"].update(context=48, ops=False)
    plan = config.resolve(cfg)
    assert plan.runs["gpt_tiny_forward_fp32"]["context"] == 32  # the sweep's own wins
    assert plan.runs["ladder_tiny_0_fp32_eager"]["context"] == 32
    assert "context" not in plan.runs["attention_naive"]
    assert list(plan.op_captured) == ["gpt_tiny_train_bf16"]  # its own `ops: shapes` wins


def test_unknown_default_key_stops_snakemake(tmp_path: Path) -> None:
    cfg = smoke()
    cfg["defaults"]["warmpu"] = 2
    done = snakemake(tmp_path, "-n", "--cores", "1", "--configfile",
                     str(write_config(tmp_path, cfg)), check=False)
    assert done.returncode != 0
    assert "Invalid config at 'defaults.warmpu'" in done.stdout + done.stderr


# --- 2. runs, sweeps, ladders: each optional, one needed ----------------------------------------


def test_config_without_runs_sweeps_or_ladders_is_told_so() -> None:
    cfg = smoke()
    for key in ("runs", "sweeps", "ladders"):
        del cfg[key]
    with pytest.raises(config.ConfigError) as err:
        config.resolve(cfg)
    assert "a config needs at least one of runs, sweeps, ladders" in str(err.value)
    # a misspelt section is named as such, not as a missing one
    with pytest.raises(config.ConfigError) as err:
        config.resolve({**cfg, "rnus": {}})
    assert err.value.where == "<top level>" and "'rnus'" in err.value.problem


def test_a_config_of_sweeps_only_resolves() -> None:
    cfg = smoke()
    del cfg["runs"], cfg["ladders"], cfg["comparisons"]
    plan = config.resolve(cfg)
    assert sorted(plan.runs) == ["attention_naive", "attention_sdpa", "gpt_tiny_forward_fp32",
                                 "gpt_tiny_train_fp32"]
    assert not plan.ladders


def test_config_without_runs_stops_snakemake(tmp_path: Path) -> None:
    cfg = smoke()
    for key in ("runs", "sweeps", "ladders", "comparisons"):
        cfg.pop(key, None)
    done = snakemake(tmp_path, "-n", "--cores", "1", "--configfile",
                     str(write_config(tmp_path, cfg)), check=False)
    assert done.returncode != 0
    assert "a config needs at least one of runs, sweeps, ladders" in done.stdout + done.stderr


# --- 3. select never shrinks the summary ---------------------------------------------------------


def test_summary_keeps_finished_runs_that_select_left_out(tmp_path: Path) -> None:
    """An earlier invocation finished the gpt_tiny sweep; this one selects two attention runs:
    summary.csv still has the finished gpt_tiny runs (selected false), and no row for a run
    that never ran."""
    full = config.resolve(smoke())
    finished = ["attention_naive", "gpt_tiny_forward_fp32", "gpt_tiny_train_fp32"]
    for run in finished:
        write_timing(tmp_path / run, full.workload_args(run), [[2.0, 2.1, 2.2]])
    plan = config.resolve(smoke(select=["attention_naive", "attention_sdpa"])).record()
    assert set(plan["runs"]) == {"attention_naive", "attention_sdpa"}
    assert "gpt_tiny_train_fp32" in plan["unselected"]
    table = summary_table(tmp_path, plan).set_index("run")
    assert sorted(table.index) == ["attention_naive", "attention_sdpa",
                                   "gpt_tiny_forward_fp32", "gpt_tiny_train_fp32"]
    assert table["selected"].to_dict() == {
        "attention_naive": True, "attention_sdpa": True,
        "gpt_tiny_forward_fp32": False, "gpt_tiny_train_fp32": False}
    assert table.loc["gpt_tiny_train_fp32", "status"] == "ok"
    assert table.loc["gpt_tiny_train_fp32", "step_ms"] == pytest.approx(2.1)
    assert table.loc["gpt_tiny_train_fp32", "mode"] == "train"


# --- 4. a GPU config on a machine without a GPU stops before the first job -----------------------

# CUDA_VISIBLE_DEVICES=-1 hides a GPU as CUDA does, so these also hold on a GPU machine.
NO_GPU = {"CUDA_VISIBLE_DEVICES": "-1"}
MAKE_RUN_MESSAGE = ("but no NVIDIA GPU is visible (nvidia-smi -L lists none, no /dev/nvidia0): "
                    "on a machine without a GPU run `make smoke`")


def test_default_config_without_gpu_stops_before_the_first_job(tmp_path: Path) -> None:
    """Plain `snakemake --cores 2` with config.yaml (gpu: required, device auto): the message
    `make run` gives, not the GPU matrix profiled on the CPU. Its dry run still plans
    (tests/test_config.py: test_default_config_is_valid_and_complete)."""
    message = stopped(tmp_path, env=NO_GPU)
    assert "start-up check failed: this is a GPU config (gpu: required" in message
    assert MAKE_RUN_MESSAGE in message, message[-3000:]


def test_gpu_key_makes_device_auto_need_a_gpu(tmp_path: Path) -> None:
    """The smoke matrix (device auto, gpu optional) needs no GPU; the same runs in a config
    that says gpu: required stop before the first job."""
    plan = config.load(SMOKE_CONFIG)
    assert plan.config["gpu"] == "optional"
    assert checks.runs_needing_cuda(plan.runs, cuda_image=False) == []
    assert len(checks.runs_needing_cuda(plan.runs, False, gpu_required=True)) == len(plan.runs)
    message = stopped(tmp_path, "--configfile", str(SMOKE_CONFIG), "--config",
                      "gpu=required", env=NO_GPU)
    assert "this is a GPU config (gpu: required" in message and MAKE_RUN_MESSAGE in message
    done = snakemake(tmp_path / "dry", "-n", "--cores", "2", "--configfile", str(SMOKE_CONFIG),
                     env_extra=NO_GPU)
    assert "rule time_run:" in done.stdout
