"""The FP8 training knob (`float8`, workloads/float8.py) on the CPU: its config and config hash,
its refusals (the CPU run is an `unsupported` row that says why), torchao's real conversion of
the GPT and of HuggingFace models with the layers it keeps, an FP8 step's loss, and the FP8
kernel categories (analysis/metrics/categories.py) on kernel names of real captures."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from analysis.metrics.categories import CATEGORIES, categorize_op, uses_tensor_cores
from pipeline import config
from workloads.__main__ import build_parser, hashed_params, record_params
from workloads.float8 import capability_refusal, output_layer, refusal, swap_linears
from workloads.gpt import GPT, config_for
from workloads.provenance import config_hash
from workloads.status import Unsupported

REPO = Path(__file__).resolve().parent.parent
GPT_TINY = {
    "workload": "gpt",
    "size": "tiny",
    "mode": "train",
    "context": 32,
    "batch": 2,
    "vocab": 256,
    "dtype": "bf16",
    "compile": "default",
}
MODEL_TINY = {
    "workload": "model",
    "factory": "workloads.models.cs336_lm:make",
    "mode": "train",
    "kwargs": {
        "d_model": 64,
        "d_ff": 128,
        "num_layers": 2,
        "num_heads": 4,
        "vocab_size": 128,
        "context_length": 32,
    },
    "batch": 2,
}


def plan(runs: dict[str, dict[str, Any]]) -> config.Plan:
    return config.resolve({"results": "results/fp8-test", "runs": runs})


# --- config --------------------------------------------------------------------------------


def test_both_workloads_take_the_recipes() -> None:
    runs = {
        f"{w}_{r}": {**base, "float8": r}
        for w, base in (("gpt", GPT_TINY), ("model", MODEL_TINY))
        for r in ("none", "tensorwise", "rowwise")
    }
    resolved = plan(runs).runs
    assert resolved["gpt_rowwise"]["float8"] == "rowwise"
    assert "--float8 tensorwise" in config.workload_args(resolved["model_tensorwise"])


@pytest.mark.parametrize("value", ["fp8", "e4m3", True])
def test_an_unknown_recipe_is_named_at_its_key(value: Any) -> None:
    with pytest.raises(config.ConfigError, match=r"'runs\.x\.float8'.*"):
        plan({"x": {**GPT_TINY, "float8": value}})


def test_the_options_spell_out_the_recipes_torchao_is_asked_for() -> None:
    import typing

    from workloads import float8
    from workloads.models import registry

    for workload in ("gpt", "model"):
        hints = typing.get_type_hints(registry()[workload].Options)
        assert typing.get_args(hints["float8"]) == float8.RECIPES


def test_the_shipped_fp8_config_plans_its_ladders_sweep_and_comparisons() -> None:
    plan = config.load(REPO / "config" / "fp8.yaml")
    assert {p["float8"] for p in plan.runs.values() if "float8" in p} == {
        "none",
        "tensorwise",
        "rowwise",
    }
    sweep = {n: p for n, p in plan.runs.items() if n.startswith("fp8_sweep_2.7B_")}
    assert sorted({p["batch"] for p in sweep.values()}) == [8, 16, 32]
    assert {"fp8_2.7B_b8", "gpt_fp8_2.7B_1_fp8_tensorwise_vs_prev"} <= set(plan.comparisons)


def test_attention_workloads_do_not_take_it() -> None:
    attention = {"workload": "attention", "impl": "naive", "batch": 2, "seq": 8, "embed": 16}
    with pytest.raises(config.ConfigError, match="unknown parameter 'float8'"):
        plan({"x": {**attention, "float8": "tensorwise"}})


def hashes(params: dict[str, Any]) -> tuple[str, str]:
    args = build_parser().parse_args(shlex.split(config.workload_args(params)))
    recorded = record_params(args, torch.device("cuda"))
    return config_hash(hashed_params(recorded)), config_hash(recorded)


def test_off_keeps_the_config_hash_and_a_recipe_changes_it() -> None:
    """float8: none is every run before the knob (its config hash is unchanged: the shipped
    configs' hashes are checked in test_workload_registry.py); a recipe is a new config."""
    off, explicit_off, fp8 = (
        hashes({**GPT_TINY, **extra})
        for extra in ({}, {"float8": "none"}, {"float8": "tensorwise"})
    )
    assert off == explicit_off
    assert fp8[0] != off[0]
    assert hashes({**GPT_TINY, "float8": "rowwise"})[0] not in (off[0], fp8[0])


# --- refusals ----------------------------------------------------------------------------


def test_a_gpu_without_fp8_tensor_cores_is_named_with_its_capability() -> None:
    reason = capability_refusal("NVIDIA A100-SXM4-80GB", (8, 0))
    assert "NVIDIA A100-SXM4-80GB has compute capability 8.0" in reason
    assert "8.9 or higher" in reason
    for name, capability in (
        ("NVIDIA L4", (8, 9)),
        ("NVIDIA H200", (9, 0)),
        ("NVIDIA B200", (10, 0)),
    ):
        assert capability_refusal(name, capability) is None


def test_refusals_in_order() -> None:
    h200 = ("NVIDIA H200", (9, 0))
    assert refusal("none", "cpu", "off", None) is None
    assert "this run is on the cpu" in refusal("tensorwise", "cpu", "default", None)
    assert "compute capability 7.0" in refusal(
        "rowwise", "cuda", "default", ("Tesla V100-SXM2-16GB", (7, 0))
    )
    assert "needs compile" in refusal("tensorwise", "cuda", "off", h200)
    assert "compile_blocks: once" in refusal("tensorwise", "cuda", "default", h200, "once")
    for compile_mode in ("default", "max-autotune-no-cudagraphs", "reduce-overhead"):
        for blocks in ("each", "regional"):
            assert refusal("rowwise", "cuda", compile_mode, h200, blocks) is None


def run_as_the_pipeline_does(params: dict[str, Any], out: Path) -> tuple[int, dict[str, Any]]:
    """The run's `python -m workloads` command line, as a timing job runs it."""
    args = config.workload_args(plan({"x": params}).runs["x"])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "workloads",
            *shlex.split(args),
            "--out",
            str(out),
            "--warmup",
            "0",
            "--steps",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, json.loads(out.read_text())


@pytest.mark.parametrize("params", [GPT_TINY, MODEL_TINY], ids=["gpt", "model"])
def test_the_cpu_run_is_an_unsupported_row_that_says_why(
    params: dict[str, Any], tmp_path: Path
) -> None:
    code, record = run_as_the_pipeline_does(
        {**params, "float8": "tensorwise"}, tmp_path / "r0.json"
    )
    assert code == 4, record["message"]  # workloads/contract.py: unsupported
    assert record["status"] == "unsupported"
    assert "float8 needs a CUDA GPU with FP8 tensor cores" in record["message"]
    assert "this run is on the cpu" in record["message"]
    assert record["params"]["float8"] == "tensorwise"  # the row carries its recipe


# --- torchao's conversion, for real --------------------------------------------------------


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(config_for("tiny", context_length=32, vocab_size=256, attention="sdpa"))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_gpt_converts_every_block_linear_and_keeps_the_lm_head(recipe: str) -> None:
    from torchao.float8.float8_linear import Float8Linear

    model = tiny_gpt()
    record = swap_linears(model, recipe)
    blocks = [p for p, m in model.named_modules() if isinstance(m, Float8Linear)]
    assert record["recipe"] == recipe and record["torchao"] == "0.18.0"
    assert record["converted"] == len(blocks) == 7 * 2  # q, k, v, out, w1, w2, w3 per layer
    assert record["kept"] == {"output layer": ["lm_head"]}
    assert type(model.lm_head) is nn.Linear
    assert {
        m.config.cast_config_input.scaling_granularity.value
        for m in model.modules()
        if isinstance(m, Float8Linear)
    } == ({"tensorwise"} if recipe == "tensorwise" else {"axiswise"})


def test_layers_whose_dims_the_tensor_cores_cannot_take_stay() -> None:
    model = nn.Sequential(
        nn.Linear(64, 48), nn.Linear(48, 40), nn.Linear(40, 64), nn.Linear(64, 10)
    )
    record = swap_linears(model, "tensorwise")
    assert output_layer(model) == "3"
    assert record["converted"] == 1
    assert record["kept"] == {"dims not divisible by 16": ["1", "2"], "output layer": ["3"]}


def test_a_model_with_nothing_to_convert_is_refused() -> None:
    with pytest.raises(Unsupported, match="no nn.Linear of the model qualifies"):
        swap_linears(nn.Sequential(nn.Conv2d(3, 16, 3), nn.Linear(16, 10)), "tensorwise")


def test_huggingface_gpt2_has_no_linear_to_convert_and_llama_has() -> None:
    """GPT-2's blocks are transformers' Conv1D, which torchao does not convert: only its LM
    head is an nn.Linear. Llama's projections are nn.Linear."""
    pytest.importorskip("transformers")
    from workloads.models.hf_causal_lm import make

    small = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 128, "context_length": 32}
    with pytest.raises(Unsupported, match=r"Conv1D in GPT-2.*|.*output layer.*lm_head"):
        swap_linears(make("gpt2", **small).model, "tensorwise")
    record = swap_linears(make("llama", **small).model, "rowwise")
    assert record["converted"] == 2 * 7 and record["kept"] == {"output layer": ["lm_head"]}


def loss_after(model: nn.Module, steps: int) -> float:
    """The loss after ``steps`` AdamW steps on one fixed batch, under bf16 autocast."""
    generator = torch.Generator().manual_seed(0)
    tokens, targets = (torch.randint(0, 256, (2, 32), generator=generator) for _ in range(2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps + 1):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        optimizer.step()
    return loss.item()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_an_fp8_step_trains_as_bf16_does(recipe: str) -> None:
    """torchao's FP8 GEMMs (torch._scaled_mm, which PyTorch also runs on the CPU): after the
    same steps the loss is within 2% of bf16's, the acceptance bound of the GPU runs."""
    bf16 = loss_after(tiny_gpt(), 3)
    model = tiny_gpt()
    swap_linears(model, recipe)
    fp8 = loss_after(model, 3)
    assert abs(fp8 / bf16 - 1) < 0.02, (fp8, bf16)


def test_the_plain_script_times_bf16_and_fp8_with_their_losses(tmp_path: Path) -> None:
    """benchmarks/fp8_plain.py on the CPU: each recipe timed, converted and trained alike."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import fp8_plain

    out = tmp_path / "plain.json"
    result = fp8_plain.main(
        [
            "--size",
            "tiny",
            "--batch",
            "2",
            "--context",
            "32",
            "--vocab",
            "256",
            "--device",
            "cpu",
            "--compile",
            "off",
            "--warmup",
            "1",
            "--steps",
            "1",
            "--recipes",
            "bf16,rowwise",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == result
    bf16, fp8 = result["recipes"]["bf16"], result["recipes"]["rowwise"]
    assert bf16["converted_linears"] == 0 and fp8["converted_linears"] == 7 * 2
    assert len(fp8["losses"]) == 2 and fp8["step_ms"] > 0
    assert abs(fp8["losses"][-1] / bf16["losses"][-1] - 1) < 0.02


def test_the_loss_benchmark_trains_each_recipe_on_the_same_chain(tmp_path: Path) -> None:
    """benchmarks/fp8_loss.py on the CPU: the batches are the Markov chain's (every next token
    one of its predecessor's successors), the same for every recipe (bf16 twice: the same
    losses), the floor is the chain's own -log p, and the ratios are the last window's means."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import fp8_loss

    generator = torch.Generator().manual_seed(3)
    successors, probs = fp8_loss.markov_chain(64, 3, generator)
    seqs, chosen = fp8_loss.sample_batches(successors, probs, 4, 2, 16, generator)
    prev, nxt = seqs[..., :-1].flatten(), seqs[..., 1:].flatten()
    assert (successors[prev] == nxt[:, None]).any(1).all()
    assert probs.sum(1).allclose(torch.ones(64)) and bool((chosen > 0).all())

    out = tmp_path / "loss.json"
    argv = ["--size", "tiny", "--batch", "2", "--context", "32", "--vocab", "256", "--device",
            "cpu", "--compile", "off", "--steps", "30", "--lr", "3e-3", "--out", str(out)]
    result = fp8_loss.main([*argv, "--recipes", "bf16,rowwise"])
    again = fp8_loss.main([*argv, "--recipes", "bf16"])
    assert json.loads(out.read_text()) == again
    bf16, fp8 = result["recipes"]["bf16"], result["recipes"]["rowwise"]
    assert again["recipes"]["bf16"]["losses"] == bf16["losses"]
    assert fp8["converted_linears"] == 7 * 2 and bf16["finite"] and fp8["finite"]
    assert result["loss_floor"] < bf16["losses"][-1] < bf16["losses"][0]
    window = result["window"]
    assert window == 3 and fp8["ratio_to_bf16"] == pytest.approx(
        sum(fp8["losses"][-3:]) / sum(bf16["losses"][-3:]))
    assert abs(fp8["ratio_to_bf16"] - 1) < 0.02


def test_compiled_fp8_layers_compose_with_master_weights() -> None:
    """What a compiled FP8 rung on top of master weights runs: each block compiled on its own
    (compile_blocks: regional), the flat master-weight AdamW on the FP8 layers' bf16 weight
    copies; it trains as bf16 does."""
    from workloads.models.builder import compile_regional
    from workloads.optim import build_optimizer

    model = tiny_gpt()
    swap_linears(model, "tensorwise")
    optimizer = build_optimizer(
        "adamw_master",
        model,
        lr=1e-3,
        low_precision=torch.bfloat16,
        compile_mode="default",
        capturable=False,
    )
    compile_regional(list(model.layers), "default")
    generator = torch.Generator().manual_seed(0)
    tokens, targets = (torch.randint(0, 256, (2, 32), generator=generator) for _ in range(2))
    for _ in range(3):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), targets.flatten())
        loss.backward()
        optimizer.step()
    assert abs(loss.item() / loss_after(tiny_gpt(), 2) - 1) < 0.02


# --- FP8 kernel categories ------------------------------------------------------------------

# Kernel names of real captures of torchao float8 training: Inductor's Triton kernels around
# the GEMMs and cuBLAS's FP8 GEMMs (torch.profiler, an sm89 GPU, torch.compile), cuBLAS's and
# cuBLASLt's FP8 GEMMs on Hopper (sm90: `aten::_scaled_mm` dispatching nvjet `qq`/`qr` kernels).
FP8_GEMMS = (
    "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_cgasize1x2x1_stage4_"
    "gmmastage2_warpgroupsize1x1x1_tensor64x128x32",
    "sm89_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize64x128x64_stage4_warpsize2x2x1_"
    "tensor16x8x32_execute_kernel__5x_cublas",
    "sm89_xmma_gemm_e4m3e5m2bf16_e4m3e5m2f32_f32_tn_n_tilesize256x64x64_stage4_warpsize4x1x1_"
    "tensor16x8x32_execute_kernel__5x_cublas",
    "nvjet_sm90_qqtst_128x128_128x6_1x2_h_bz_ovscale_TNT",
    # an H200 capture of the tensorwise 2.7B GPT (config/fp8.yaml): e4m3 x e5m2 in backward
    "nvjet_sm90_qrtst_128x160_128x5_2x1_v_bz_coopA_algo2_TNT",
    "nvjet_sm90_qrtst_144x128_128x6_1x2_h_bz_coopA_algo2_TNN",
    "nvjet_sm90_qqtst_320x128_128x3_1x2_h_bz_coopB_TNT",
)
FP8_CASTS = (
    "triton_red_fused_abs_max_0",  # the amax of a dynamic scale
    "triton_red_fused__to_copy_abs_max_view_0",
    "triton_per_fused__to_copy_abs_clamp_max_mul_reciprocal_view_1",  # amax, scale, cast
    "triton_red_fused__to_copy_abs_clamp_max_mul_reciprocal_3",
    "triton_poi_fused__scaled_mm__to_copy_clamp_mul_reciprocal_t_view_4",  # cast for the GEMM
    "triton_poi_fused__to_copy_clamp_clone_mul_reciprocal_t_view_9",
    # fused with the activation (relu^2) before it, forward and backward
    "triton_red_fused__to_copy_abs_max_pow_relu_view_6",
    "triton_poi_fused__scaled_mm__to_copy_clamp_mul_pow_relu_t_view_8",
    "triton_red_fused__to_copy_abs_max_mul_pow_relu_threshold_backward_view_5",
)
# The same captures' other kernels, and GEMMs of the H100 captures of tests/fixtures
NOT_FP8 = {
    "triton_poi_fused__to_copy_8": "CopyMemset",  # a plain cast
    "triton_red_fused_mul_sum_4": "Reduction",
    "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_NNT": "GEMM",  # bf16 cuBLASLt
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_"
    "segment_k_off_kernel__5x_cublas": "GEMM",  # TF32
}


def test_fp8_categories_come_last_so_earlier_colours_stay() -> None:
    from analysis.outputs import style

    assert CATEGORIES[-2:] == ("FP8GEMM", "FP8Cast") and CATEGORIES[9] == "Other"
    assert len(set(style.CATEGORY_COLORS.values())) == len(CATEGORIES)


@pytest.mark.parametrize("name", FP8_GEMMS)
def test_fp8_gemms_are_their_own_category_on_tensor_cores(name: str) -> None:
    for phase in ("forward_pass", "backward_pass", "optimizer_step"):
        assert categorize_op(name, phase) == "FP8GEMM"
    assert uses_tensor_cores(name)


@pytest.mark.parametrize("name", FP8_CASTS)
def test_fp8_scale_and_cast_kernels_are_their_own_category(name: str) -> None:
    assert categorize_op(name, "forward_pass") == "FP8Cast"
    assert categorize_op(name, "optimizer_step") == "Optimizer"  # the phase rule still holds


@pytest.mark.parametrize("name", sorted(NOT_FP8))
def test_other_kernels_keep_their_category(name: str) -> None:
    assert categorize_op(name, "forward_pass") == NOT_FP8[name]


def test_by_the_kernel_maps_aten_ops() -> None:
    """With the kernel map's ATen ops (a compiled capture), the ops decide, not the name."""
    cast = ["aten.abs", "aten.amax", "aten.clamp", "aten.reciprocal", "prims.convert_element_type"]
    assert categorize_op("triton_per_fused_0", "forward_pass", cast) == "FP8Cast"
    assert (
        categorize_op("triton_tem_fused__scaled_mm_0", "forward_pass", ["aten._scaled_mm"])
        == "FP8GEMM"
    )
    assert categorize_op("triton_tem_fused_mm_0", "forward_pass", ["aten.mm"]) == "GEMM"
