"""The memory view on the CPU, for real: the memory capture of a GPT step (its own process,
as the pipeline runs it), its operator table against torch.profiler's own per-op figures,
its saved-for-backward count against an independent one, the config key, and the smoke
pipeline's memory outputs (tests/smoke.yaml: gpt_tiny_train_bf16 has `memory: true`)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import REPO, SMOKE_CONFIG
from torch.profiler import ProfilerActivity, profile

from pipeline.config import ConfigError, resolve
from workloads import memory_capture
from workloads.__main__ import build_parser, build_workload

CPU = torch.device("cpu")
TINY = "gpt --size tiny --mode train --context 32 --batch 2 --device cpu"


def tiny_workload():
    args = build_parser().parse_args(shlex.split(TINY))
    workload = build_workload(args, CPU)
    for _ in range(2):  # the optimizer's states exist after its first step
        workload.step()
    return workload


def test_capture_process_writes_the_cpu_view(tmp_path: Path) -> None:
    out, memory = tmp_path / "times.json", tmp_path / "memory.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "workloads",
            *shlex.split(TINY),
            "--warmup",
            "1",
            "--steps",
            "1",
            "--out",
            str(out),
            "--memory_out",
            str(memory),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    record, view = json.loads(out.read_text()), json.loads(memory.read_text())
    assert record["status"] == "ok" and record["memory_capture"]["status"] == "ok"
    assert "memory_out" in record["params"]  # the capture's own record says what it is
    assert view["status"] == "ok" and view["device"] == "cpu"
    assert any("need CUDA" in note for note in view["notes"])
    # fp32 GPT tiny: 4 bytes per parameter, as many for gradients, AdamW's two states
    n = view["analytic"]["parameter_count"]
    assert view["analytic"]["parameters"] == 4 * n == view["analytic"]["gradients"]
    assert view["analytic"]["optimizer_state"] >= 2 * 4 * n
    assert view["saved_bytes"] > 0 and view["saved_by_module"]["layers.0.attn.q_proj"] > 0
    assert view["modules_peak"]["modules"]["layers.0"]["Peak-Forward"]["Total"] > 0
    mm = next(r for r in view["ops"] if r["op"] == "aten::mm")
    assert mm["self_allocation_count"] > 0 and mm["self_allocation_bytes"] > 0


def test_operator_table_matches_the_profiler_per_op() -> None:
    workload = tiny_workload()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        workload.step()
    ours = {r["op"]: r for r in memory_capture.op_table(prof.profiler.kineto_results.events(), CPU)}
    theirs = {e.key: e for e in prof.key_averages() if e.key.startswith("aten::")}
    assert set(ours) == set(theirs)
    for op, row in ours.items():
        assert row["calls"] == theirs[op].count, op
        assert row["self_size_increase_bytes"] == theirs[op].self_cpu_memory_usage, op
        assert row["total_size_increase_bytes"] == theirs[op].cpu_memory_usage, op
        assert row["self_allocation_bytes"] >= row["self_size_increase_bytes"], op


def test_saved_for_backward_matches_an_independent_count() -> None:
    workload = tiny_workload()
    owners = memory_capture.find_owners(workload.step)
    assert len(owners["modules"]) == 1 and len(owners["optimizers"]) == 1
    params = {p.untyped_storage().data_ptr() for p in owners["modules"][0].parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        workload.step()
    view = memory_capture.saved_view(workload.step, owners)
    assert view["saved_bytes"] == sum(seen.values()) > 0
    assert sum(view["saved_by_module"].values()) == view["saved_bytes"]


def smoke_config(**run: object) -> dict:
    import yaml

    cfg = yaml.safe_load(SMOKE_CONFIG.read_text())
    cfg["runs"]["gpt_tiny_train_bf16"].update(run)
    return cfg


def test_memory_key_turns_the_capture_on_and_off() -> None:
    plan = resolve(smoke_config())
    assert list(plan.memory_captured) == ["gpt_tiny_train_bf16"]
    assert resolve(smoke_config(memory="auto")).memory_captured == {}  # no GPU config
    assert (
        "gpt_tiny_train_bf16" in resolve(smoke_config(memory="auto", device="cuda")).memory_captured
    )
    gpu = resolve({**smoke_config(memory="auto"), "gpu": "required"})
    assert "gpt_tiny_train_bf16" in gpu.memory_captured
    assert "attention_core_math" not in gpu.memory_captured  # no capture, no memory capture
    off = resolve({**smoke_config(memory=False), "gpu": "required"})
    assert "gpt_tiny_train_bf16" not in off.memory_captured
    cpu = resolve({**smoke_config(memory="auto", device="cpu"), "gpu": "required"})
    assert "gpt_tiny_train_bf16" not in cpu.memory_captured
    with pytest.raises(ConfigError, match="gpt_tiny_train_bf16.memory"):
        resolve(smoke_config(memory="yes"))


def test_the_analysis_knows_the_captures_categories_without_torch() -> None:
    from analysis.outputs import figures_memory, memory

    assert memory.CATEGORIES == figures_memory.CATEGORIES == memory_capture.CATEGORIES
    done = subprocess.run(
        [sys.executable, "-c", "import analysis.cli, sys; print('torch' in sys.modules)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "False"


def test_a_failed_run_gets_an_empty_memory_view(tmp_path: Path) -> None:
    from analysis.outputs.memory import write

    (tmp_path / "memory.json").write_text("")
    result = write(tmp_path / "memory.json", tmp_path / "stats", tmp_path / "memory.png", "x")
    assert result["status"] == "failed"
    ops = (tmp_path / "stats" / "memory_ops.csv").read_text().splitlines()
    assert ops == [",".join(pd.read_csv(tmp_path / "stats" / "memory_ops.csv").columns)]
    assert (tmp_path / "memory.png").stat().st_size > 0


@pytest.mark.slow
def test_smoke_run_has_the_memory_view(smoke_workdir: Path) -> None:
    import yaml

    out = smoke_workdir / yaml.safe_load(SMOKE_CONFIG.read_text())["results"]
    run = out / "gpt_tiny_train_bf16"
    metrics = json.loads((run / "stats" / "memory_metrics.json").read_text())
    assert metrics["status"] == "ok" and metrics["device"] == "cpu"
    ops = pd.read_csv(run / "stats" / "memory_ops.csv")
    assert (ops["self_allocation_count"] > 0).any() and "aten::mm" in set(ops["op"])
    modules = pd.read_csv(run / "stats" / "memory_modules.csv")
    assert (
        modules.loc[modules["module"] == "layers.0.attn.q_proj", "saved_for_backward_bytes"].iloc[0]
        > 0
    )
    assert (run / "trace" / "memory.png").read_bytes()[:4] == b"\x89PNG"
    # its own process, its time in the job log; no other run has one
    assert (out / "logs" / "benchmark" / "profile_memory" / "gpt_tiny_train_bf16.jsonl").is_file()
    assert not (out / "gpt_tiny_train_fp32" / "memory.json").exists()
    summary = pd.read_csv(out / "summary.csv").set_index("run")
    assert summary.loc["gpt_tiny_train_bf16", "memory_status"] == "ok"
    assert "peak_memory_gib" in summary.columns


def test_phases_span_their_own_host_times_also_without_allocations() -> None:
    """A phase that allocates nothing (fused AdamW) keeps its length on the host clock, and the
    capture's bookkeeping between two phases (a snapshot) is in neither."""
    start = 1.7e15  # µs since the epoch, as the allocator stamps its history
    curve = [(start + 1000, 100), (start + 9000, 900), (start + 20000, 200)]
    marks = [
        {"phase": "forward_pass", "time_us": start + 10000, "resumed_us": start + 14000,
         "trace_index": 2, "allocated_bytes": 900},
        {"phase": "backward_pass", "time_us": start + 25000, "resumed_us": start + 26000,
         "trace_index": 3, "allocated_bytes": 200},
        {"phase": "optimizer_step", "time_us": start + 31000, "resumed_us": start + 32000,
         "trace_index": 3, "allocated_bytes": 200},
    ]
    rows = memory_capture.phase_rows(marks, curve, start, 0, [900, 900, 200], host_clock=True)
    assert [(r["start_ms"], r["end_ms"]) for r in rows] == [(0, 10), (14, 25), (26, 31)]
    # a history on another clock: the ranges end where the history was split
    old = memory_capture.phase_rows(marks, curve, start, 0, [900, 900, 200])
    assert [(r["start_ms"], r["end_ms"]) for r in old] == [(0, 9), (9, 20), (20, 20)]
