"""Attention workload numerics, the shared runner, the CLI's JSON, provenance, and the NVTX
capture contract checked under a real Nsight Systems."""

import json
import math
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import guarded_capture

from workloads.__main__ import main
from workloads.attention import Attention
from workloads.gpt import SIZES
from workloads.provenance import host_versions, provenance
from workloads.runner import run_steps

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


# --- attention numerics ----------------------------------------------------------------


def reference_attention(module: Attention, x: torch.Tensor) -> torch.Tensor:
    """The notebook's formula in float64, written independently of the module's code."""
    p = {name: t.detach().double() for name, t in module.named_parameters()}
    x = x.double()
    batch, seq, embed = x.shape
    heads = module.n_heads

    def project(name: str) -> torch.Tensor:
        y = x @ p[f"{name}.weight"].T + p[f"{name}.bias"]
        return y.reshape(batch, seq, heads, embed // heads).permute(0, 2, 1, 3)

    q, k, v = project("query"), project("key"), project("value")
    scores = q @ k.transpose(-1, -2) / math.sqrt(embed // heads)
    attended = (torch.softmax(scores, dim=-1) @ v).permute(0, 2, 1, 3).reshape(x.shape)
    return F.layer_norm(
        x + attended, (embed,), p["layer_norm.weight"], p["layer_norm.bias"], eps=1e-5
    )


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).norm() / expected.norm()).item()


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("heads", [1, 4])
def test_attention_matches_float64_reference(impl: str, heads: int) -> None:
    torch.manual_seed(1)
    module = Attention(embed_dim=32, n_heads=heads, impl=impl)
    # Non-trivial LayerNorm affine so its parameters are exercised too.
    with torch.no_grad():
        module.layer_norm.weight.uniform_(0.5, 1.5)
        module.layer_norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(3, 17, 32, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    grad_out = torch.randn(3, 17, 32)

    out = module(x)
    ref = reference_attention(module, x64)
    (grad_x,) = torch.autograd.grad(out, x, grad_out)
    (grad_ref,) = torch.autograd.grad(ref, x64, grad_out.double())

    assert out.shape == x.shape
    assert relative_error(out, ref) < 1e-5
    assert relative_error(grad_x, grad_ref) < 1e-5


def test_attention_rejects_indivisible_heads() -> None:
    with pytest.raises(ValueError, match="divisible"):
        Attention(embed_dim=10, n_heads=3)


# --- runner ----------------------------------------------------------------------------


def test_runner_runs_warmup_then_measured_steps() -> None:
    calls: list[int] = []

    def step() -> torch.Tensor:
        calls.append(len(calls))
        return torch.tensor(float(len(calls)))

    result = run_steps(step, warmup=2, steps=3, device=CPU)
    assert len(calls) == 5
    assert len(result.step_times_ms) == 3 and all(t >= 0 for t in result.step_times_ms)
    assert result.losses == [3.0, 4.0, 5.0]  # only the measured steps' losses
    assert result.peak_memory_bytes is None and result.cuda_event_times_ms == []
    assert set(result.summary()) == {"mean_ms", "median_ms", "std_ms", "min_ms", "max_ms"}


def test_runner_rejects_zero_steps() -> None:
    with pytest.raises(ValueError):
        run_steps(lambda: None, warmup=0, steps=0, device=CPU)


# --- CLI -------------------------------------------------------------------------------

RESULT_KEYS = {
    "workload",
    "params",
    "device_name",
    "torch",
    "cuda",
    "step_times_ms",
    "cuda_event_times_ms",
    "mean_ms",
    "median_ms",
    "std_ms",
    "min_ms",
    "max_ms",
    "tokens_per_s",
    "params_count",
    "peak_memory_bytes",
    "losses",
    "model_flops_per_step",
    "peak_tflops",
    "mfu",
    "provenance",
    "process",  # pid, launcher and what the process started from (docs/timing.md)
    # added with the status contract
    "status",
    "message",
    "memory_limit_applied",
    "timer",
    "step_ms",
    "warmup_times_ms",
    "region_ms",
    "compile_s",
    "flops_per_step",
    "tflops",
    "gpu_state",
    # added with the operator table and the optimizer roofline
    "optimizer_bytes_per_step",
    "peak_memory_gbps",
    # host-bound steps: the wait in each step's synchronize (GPU only), the CPU's speed
    "sync_wait_ms",
    "cpu_probe_ms",
    # the memory view: the step's peak with CUDA graphs' pools, reserved beside allocated
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "cuda_graph_pool_bytes",
    # the capture's check that it ran the timed graphs (aggregate's capture_recompiled)
    "dynamo_graphs",
}
# a model's record (the GPT's step is built as any model's): its layers, its ranges' depth
MODEL_KEYS = {"structure", "module_depth"}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    # one CPU thread, as the pipeline runs a workload (and this process's torch: conftest.py)
    return subprocess.run(
        [sys.executable, "-m", "workloads", *args], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_cli_gpt_train_writes_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "tmp.json"
    args = "gpt --size tiny --context 32 --mode train --steps 2 --warmup 1 --device cpu"
    proc = run_cli(*args.split(), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert set(result) == RESULT_KEYS | MODEL_KEYS
    assert result["workload"] == "gpt"
    assert result["params"] == {
        "size": "tiny",
        "context": 32,
        "batch": 4,
        "vocab": 10000,
        "mode": "train",
        "attention": "sdpa",
        "optimizer": "adamw_foreach",
        "compile_blocks": "each",
        "checkpoint": "none",
        "float8": "none",
        "dtype": "fp32",
        "compile": "off",
        "cuda_graph": "off",
        "sdpa_backend": "auto",
        "memory_limit_mb": None,
        "warmup": 1,
        "steps": 2,
        "device": "cpu",
        "seed": 0,
        "peak_tflops": None,
        "op_ranges": "off",
        "out": str(out),
    }
    assert result["status"] == "ok" and result["message"] == ""
    assert result["timer"] == "wall" and result["step_ms"] == result["step_times_ms"]
    assert result["compile_s"] is None and len(result["warmup_times_ms"]) == 1
    assert result["gpu_state"] == {"available": False, "reason": "device is cpu, not a GPU"}
    assert result["tflops"] == pytest.approx(
        result["flops_per_step"] / result["median_ms"] * 1e3 / 1e12
    )
    assert len(result["step_times_ms"]) == 2 and len(result["losses"]) == 2
    assert result["min_ms"] <= result["median_ms"] <= result["max_ms"]
    assert result["peak_memory_bytes"] is None and result["mfu"] is None
    assert result["params_count"] == 1_362_240
    assert result["torch"] == torch.__version__
    assert result["provenance"]["versions"]["torch"] is not None
    assert "git_commit" in result["provenance"] and "git_dirty" in result["provenance"]
    assert len(result["provenance"]["config_hash"]) == 12
    assert proc.stdout.count("\n") == 1 and "ms/step" in proc.stdout


def test_cli_attention_forward_has_no_losses(tmp_path: Path, capsys) -> None:
    out = tmp_path / "a.json"
    args = "attention --impl sdpa --batch 2 --seq 8 --embed 16 --heads 2 --steps 2 --warmup 0"
    main([*args.split(), "--device", "cpu", "--out", str(out)])
    result = json.loads(out.read_text())
    assert set(result) == RESULT_KEYS
    assert result["workload"] == "attention" and result["losses"] == []
    assert result["params"]["impl"] == "sdpa" and result["params"]["heads"] == 2
    assert "attention sdpa h=2 forward fp32" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["attention", "--mode", "train"], "invalid choice: 'train'"),
        (["attention", "--embed", "10", "--heads", "3"], "not divisible"),
        (["gpt", "--size", "tiny", "--context", "0"], "must be >= 1"),
        (["gpt", "--size", "tiny", "--warmup", "-1"], "must be >= 0"),
    ],
)
def test_cli_rejects_invalid_combinations(args: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--device", "cpu"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# --- provenance ------------------------------------------------------------------------


def test_provenance_reads_container_file(tmp_path: Path) -> None:
    record = {"environment": "container", "image": "profbench.sif", "versions": {"torch": "x"}}
    path = tmp_path / "provenance.json"
    path.write_text(json.dumps(record))
    info = provenance(path)
    assert {k: info[k] for k in record} == record and "git_commit" in info


def test_provenance_falls_back_to_host(tmp_path: Path) -> None:
    info = provenance(tmp_path / "missing.json")
    assert info["environment"] == "host"
    assert info["versions"]["torch"] is not None
    assert info["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))


def test_host_versions_tolerate_missing_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        "workloads.provenance.TRACKED_PACKAGES", ("torch", "surely-not-installed-pkg")
    )
    versions = host_versions()
    assert versions["surely-not-installed-pkg"] is None and versions["torch"] is not None


# --- NVTX capture contract under a real nsys --------------------------------------------


def profile_nvtx(nsys: str, tmp_path: Path, *workload_args: str) -> list[tuple[str, int, int]]:
    """Profile ``python -m workloads ...`` as the pipeline does; (name, start, end) per range."""
    report = tmp_path / "report"
    # The pipeline's capture settings (rules/): capture exactly the profiled_region range.
    nsys_args = (
        "profile --trace=cuda,nvtx,osrt --sample=none --cpuctxsw=none --capture-range=nvtx"
        " --nvtx-capture=profiled_region --capture-range-end=stop --export=sqlite"
    )
    cmd = [nsys, *nsys_args.split(), "-o", str(report), sys.executable, "-m"]
    cmd += ["workloads", *workload_args, "--device", "cpu"]
    # TMPDIR: nsys' session state of this capture alone (tests/conftest.py private_tmpdir)
    env = {**os.environ, "NSYS_NVTX_PROFILER_REGISTER_ONLY": "0", "TMPDIR": str(tmp_path),
           "PROFBENCH_CAPTURE": "1"}  # as rules/profile.smk: a model's module ranges on
    guarded_capture([sys.executable], cmd, tmp_path / "capture.json",
                    report.with_suffix(".sqlite"), cwd=REPO, env=env)
    with closing(sqlite3.connect(report.with_suffix(".sqlite"))) as db:
        rows = db.execute(
            "SELECT coalesce(e.text, s.value), e.start, e.end FROM NVTX_EVENTS e "
            "LEFT JOIN StringIds s ON e.textId = s.id WHERE e.end IS NOT NULL"
        ).fetchall()
    return rows


def assert_nested(rows: list[tuple[str, int, int]], inner: str, outer: str) -> None:
    outers = [(start, end) for name, start, end in rows if name == outer]
    for name, start, end in rows:
        if name == inner:
            assert any(s <= start and end <= e for s, e in outers), f"{inner} outside {outer}"


def test_gpt_train_nvtx_ranges_under_nsys(nsys: str, tmp_path: Path) -> None:
    steps, layers = 3, SIZES["tiny"]["n_layers"]
    args = "gpt --size tiny --context 16 --attention naive --mode train --warmup 2"
    rows = profile_nvtx(nsys, tmp_path, *args.split(), "--steps", str(steps))
    counts = Counter(name for name, _, _ in rows)
    per_step = [
        "profiled_step",
        "forward_pass",
        "loss_computation",
        "backward_pass",
        "optimizer_step",
        "token_embeddings",
        "final_norm",
        "lm_head",
    ]
    # the GPT's layers and their parts are module ranges as any model's, forward and backward
    per_layer = [
        "attention projections",
        "rope encoding",
        "scaled_dot_product_attention",
        "computing attention scores",
        "causal mask construction",
        "computing softmax",
        "final matmul",
        "output projection",
    ]
    assert counts["profiled_region"] == 1
    assert {name: counts[name] for name in per_step} == dict.fromkeys(per_step, steps)
    assert {name: counts[name] for name in per_layer} == dict.fromkeys(per_layer, steps * layers)
    modules = [f"module:layers.{i}{part}" for i in range(layers)
               for part in ("", ".ln1", ".attn", ".ln2", ".ffn")]
    assert {name: counts[name] for name in modules} == dict.fromkeys(modules, 2 * steps)
    assert not any(name.startswith("layer_") or name.endswith("_sublayer") for name in counts)
    assert counts["warmup"] == 0  # warm-up happens before the capture range
    assert_nested(rows, "profiled_step", "profiled_region")
    for phase in ("forward_pass", "loss_computation", "backward_pass", "optimizer_step"):
        assert_nested(rows, phase, "profiled_step")
    assert_nested(rows, "computing softmax", "scaled_dot_product_attention")


def test_attention_nvtx_ranges_under_nsys(nsys: str, tmp_path: Path) -> None:
    steps = 2
    args = "attention --impl naive --batch 2 --seq 8 --embed 16 --heads 2 --warmup 1"
    args += " --mode forward_backward"
    rows = profile_nvtx(nsys, tmp_path, *args.split(), "--steps", str(steps))
    counts = Counter(name for name, _, _ in rows)
    expected = [
        "profiled_step",
        "forward_pass",
        "backward_pass",
        "attention projections",
        "scaled_dot_product_attention",
        "computing attention scores",
        "computing softmax",
        "final matmul",
        "residual_layernorm",
    ]
    assert {name: counts[name] for name in expected} == dict.fromkeys(expected, steps)
    assert counts["warmup"] == 0 and counts["causal mask construction"] == 0


# --- run keys, statuses and exit codes ----------------------------------------------------


def test_every_run_key_accepts_both_spellings() -> None:
    from workloads.__main__ import build_parser

    parser = build_parser()
    dashed = parser.parse_args(
        "attention_core --head-dim 32 --sdpa-backend flash --memory-limit-mb 900 --causal true"
        " --compile max-autotune-no-cudagraphs --dtype fp16 --peak-tflops 5".split()
    )
    pipeline = parser.parse_args(
        "attention_core --head_dim 32 --sdpa_backend flash --memory_limit_mb 900 --causal True"
        " --compile max-autotune-no-cudagraphs --dtype fp16 --peak_tflops 5".split()
    )
    assert vars(dashed) == vars(pipeline)
    assert pipeline.head_dim == 32 and pipeline.causal is True and pipeline.dtype == "fp16"
    gpt = parser.parse_args("gpt --optimizer adamw_fused --compile reduce-overhead".split())
    assert gpt.optimizer == "adamw_fused" and gpt.compile == "reduce-overhead"
    with pytest.raises(SystemExit):
        parser.parse_args("attention_core --causal maybe".split())


def test_unsupported_sdpa_backend_gives_status_4_with_reason(tmp_path: Path) -> None:
    out = tmp_path / "u.json"
    args = "attention_core --batch 1 --heads 2 --seq 16 --head_dim 8 --sdpa_backend cudnn"
    proc = run_cli(*args.split(), "--device", "cpu", "--out", str(out))
    assert proc.returncode == 4, proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "unsupported" and "cudnn" in result["message"]
    assert result["params"]["sdpa_backend"] == "cudnn" and result["median_ms"] is None
    assert result["provenance"]["versions"]["torch"] is not None


def test_memory_limit_forces_a_host_oom_with_status_3(tmp_path: Path) -> None:
    # Naive attention's 8 x 4096 x 4096 fp32 scores need 512 MiB: more than the 1000 MiB
    # address space leaves after importing torch (~650 MiB).
    out = tmp_path / "oom.json"
    args = "attention_core --impl naive --batch 1 --heads 8 --seq 4096 --head_dim 16"
    proc = run_cli(*args.split(), "--memory_limit_mb", "1000", "--device", "cpu", "--out", str(out))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "oom" and result["memory_limit_applied"] is True
    assert "allocate" in result["message"]  # torch's message names the failed size
    assert result["step_ms"] == [] and result["device_name"]


def test_attention_core_flops_match_an_independent_count() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    from workloads import flops
    from workloads.attention import naive_attention

    q, k, v = (torch.randn(2, 3, 40, 8) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        naive_attention(q, k, v)
    assert flops.attention_core_forward_flops(2, 3, 40, 8, causal=False) == (
        counter.get_total_flops()
    )
    causal = flops.attention_core_forward_flops(2, 3, 40, 8, causal=True)
    assert causal * 2 == counter.get_total_flops()
    assert flops.attention_core_step_flops(causal, "forward_backward") == int(causal * 3.5)


def test_attention_core_cli_reports_tflops(tmp_path: Path, capsys) -> None:
    out = tmp_path / "c.json"
    args = "attention_core --batch 2 --heads 2 --seq 32 --head_dim 8 --causal false"
    args += " --mode forward_backward --steps 3 --warmup 1 --device cpu"
    assert main([*args.split(), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["flops_per_step"] == int(4 * 2 * 2 * 32 * 32 * 8 * 3.5)
    assert result["tflops"] > 0 and result["params_count"] == 0
    assert "attention_core sdpa h=2 s=32 d=8 forward_backward" in capsys.readouterr().out


def test_calibrate_on_cpu_is_cached_per_device(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PROFBENCH_CACHE", str(tmp_path / "cache"))
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    common = ["calibrate", "--device", "cpu", "--dtypes", "fp32,bf16"]
    assert main([*common, "--out", str(first)]) == 0
    assert main([*common, "--out", str(second)]) == 0
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a["cached"] is False and b["cached"] is True
    assert set(a["matmul_tflops"]) == {"fp32", "bf16"} and a["copy_gbps"] > 0
    assert all(t > 0 for t in a["matmul_tflops"].values())
    assert a["datasheet_tflops"] == {"fp32": None, "bf16": None}  # no datasheet for a CPU
    assert (tmp_path / "cache" / "calibration" / f"{a['key']}.json").is_file()
    assert "torch" in a["key"] and a["provenance"]["git_commit"] == b["provenance"]["git_commit"]
    refreshed = tmp_path / "c.json"
    assert main([*common, "--refresh", "--out", str(refreshed)]) == 0
    assert json.loads(refreshed.read_text())["cached"] is False


def test_compiled_master_weight_train_step_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "compiled.json"
    # the shapes of test_compile_blocks.py's master-weight runs: Inductor's cache (one for the
    # test run, tests/conftest.py) compiles their common graphs once for both
    args = "gpt --size tiny --context 32 --vocab 512 --batch 2 --mode train --steps 2 --warmup 2"
    args += " --dtype bf16 --compile default --optimizer adamw_master --device cpu"
    proc = run_cli(*args.split(), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "ok" and result["compile_s"] > 0
    assert result["losses"][1] < result["losses"][0]
    assert "compile=default" in proc.stdout


def test_nvtx_ranges_cause_no_graph_breaks() -> None:
    from workloads.gpt import GPT, config_for

    model = GPT(config_for("tiny", context_length=8, attention="naive"))
    explanation = torch._dynamo.explain(model)(torch.randint(0, 100, (1, 8)))
    assert explanation.graph_count == 1 and explanation.graph_break_count == 0


def test_tf32_sets_the_matmul_precision() -> None:
    from workloads.device import configure_precision

    try:
        configure_precision("tf32")
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        configure_precision("fp32")
    assert not torch.backends.cuda.matmul.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"


# --- GPU state ----------------------------------------------------------------------------


def test_gpu_state_is_absent_on_cpu() -> None:
    from workloads.gpustate import GpuStateRecorder

    recorder = GpuStateRecorder(CPU)
    recorder.snapshot("before")
    assert recorder.result() == {"available": False, "reason": "device is cpu, not a GPU"}


def test_throttle_reasons_decode_with_real_nvml_constants() -> None:
    import pynvml

    from workloads.gpustate import decode_reasons, flags

    mask = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown | pynvml.nvmlClocksThrottleReasonGpuIdle
    assert decode_reasons(mask, pynvml) == ["gpu_idle", "hw_thermal_slowdown"]
    assert decode_reasons(0, pynvml) == []
    hot = {"throttle_reasons": decode_reasons(mask, pynvml), "other_processes": []}
    idle = {"throttle_reasons": ["gpu_idle"], "other_processes": []}
    capped = {"throttle_reasons": ["sw_power_cap"], "other_processes": []}
    shared = {"throttle_reasons": [], "other_processes": [{"pid": 1, "used_memory_bytes": 9}]}
    assert flags(idle, hot) == ["throttled"]
    assert flags(idle, idle) == []
    assert flags(capped, idle) == ["power_capped"]
    assert flags(shared, idle) == ["shared_gpu"]


# --- provenance: git state from the environment, config hash ---------------------------------


def test_provenance_takes_git_state_from_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PROFBENCH_GIT_COMMIT", "abc123")
    monkeypatch.setenv("PROFBENCH_GIT_DIRTY", "true")
    monkeypatch.chdir(tmp_path)  # no .git here, like the GPU machine's copy
    info = provenance(tmp_path / "missing.json", params={"b": 1, "a": 2})
    assert info["git_commit"] == "abc123" and info["git_dirty"] is True
    assert info["hostname"] and info["date"].endswith("+00:00")
    from workloads.provenance import config_hash

    assert info["config_hash"] == config_hash({"a": 2, "b": 1}) != config_hash({"a": 2, "b": 2})
    monkeypatch.setenv("PROFBENCH_GIT_DIRTY", "0")
    assert provenance(tmp_path / "missing.json")["git_dirty"] is False
