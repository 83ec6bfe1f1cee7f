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
}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workloads", *args], cwd=REPO, capture_output=True, text=True
    )


def test_cli_gpt_train_writes_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "tmp.json"
    args = "gpt --size tiny --context 32 --mode train --steps 2 --warmup 1 --device cpu"
    proc = run_cli(*args.split(), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert set(result) == RESULT_KEYS
    assert result["workload"] == "gpt"
    assert result["params"] == {
        "size": "tiny",
        "context": 32,
        "batch": 4,
        "vocab": 10000,
        "mode": "train",
        "attention": "sdpa",
        "dtype": "fp32",
        "warmup": 1,
        "steps": 2,
        "device": "cpu",
        "seed": 0,
        "peak_tflops": None,
        "out": str(out),
    }
    assert len(result["step_times_ms"]) == 2 and len(result["losses"]) == 2
    assert result["min_ms"] <= result["median_ms"] <= result["max_ms"]
    assert result["peak_memory_bytes"] is None and result["mfu"] is None
    assert result["params_count"] == 1_362_240
    assert result["torch"] == torch.__version__
    assert result["provenance"]["versions"]["torch"] is not None
    assert "git_commit" in result["provenance"]
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
    assert provenance(path) == {**record, "git_commit": provenance(path)["git_commit"]}


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
    env = {**os.environ, "NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
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
    ] + [f"layer_{i}" for i in range(layers)]
    per_layer = [
        "attention_sublayer",
        "ffn_sublayer",
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
