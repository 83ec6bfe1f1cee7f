"""The CS336 GPT model: attention implementations agree, shapes and parameter counts of every
size, causality, RoPE, and that training on a fixed batch lowers the loss."""

import math

import pytest
import torch

from workloads import flops
from workloads.gpt import GPT, SIZES, RotaryEmbedding, config_for, count_parameters
from workloads.models.builder import build_gpt
from workloads.runner import run_steps
from workloads.steps import Speed, Workload

CPU = torch.device("cpu")


def tiny_pair(context: int = 24) -> tuple[GPT, GPT]:
    """Two tiny GPTs with identical weights, one per attention implementation."""
    torch.manual_seed(0)
    naive = GPT(config_for("tiny", context_length=context, attention="naive"))
    sdpa = GPT(config_for("tiny", context_length=context, attention="sdpa"))
    sdpa.load_state_dict(naive.state_dict())
    return naive, sdpa


def test_naive_and_sdpa_attention_give_same_logits() -> None:
    naive, sdpa = tiny_pair()
    tokens = torch.randint(0, 10_000, (4, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, actual = naive(tokens), sdpa(tokens)
    assert expected.shape == (4, 24, 10_000)
    assert ((actual - expected).norm() / expected.norm()).item() < 1e-5


def test_logits_are_causal() -> None:
    model, _ = tiny_pair()
    tokens = torch.randint(0, 10_000, (1, 24), generator=torch.Generator().manual_seed(4))
    changed = tokens.clone()
    changed[0, 12:] = (changed[0, 12:] + 1) % 10_000  # alter only the future
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :12], after[:, :12])
    assert not torch.allclose(before[:, 12:], after[:, 12:])


def test_rope_scores_depend_only_on_relative_position() -> None:
    rope = RotaryEmbedding(head_dim=8, context_length=16, theta=10_000.0)
    q, k = torch.randn(8), torch.randn(8)
    # Same q/k vectors at every position: <R_m q, R_n k> must depend on m - n only.
    q_rot = rope(q.expand(1, 1, 16, 8))[0, 0]
    k_rot = rope(k.expand(1, 1, 16, 8))[0, 0]
    scores = q_rot @ k_rot.T
    torch.testing.assert_close(scores[5, 2], scores[10, 7])
    torch.testing.assert_close(scores[3, 3], q @ k)


@pytest.mark.parametrize("size", list(SIZES))
def test_forward_shape_and_parameter_count_on_meta(size: str) -> None:
    cfg = config_for(size)  # context 512, vocab 10k as in the benchmarks
    with torch.device("meta"):
        model = GPT(cfg)
        logits = model(torch.zeros(4, cfg.context_length, dtype=torch.long))
    assert logits.shape == (4, 512, 10_000)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(cfg)


def test_parameter_count_formula_matches_hand_computation() -> None:
    # small: 2 * 10k * 768 (embedding + untied lm_head)
    #        + 12 * (4 * 768^2 + 3 * 768 * 3072 + 2 * 768) + 768 (final norm)
    assert count_parameters(config_for("small")) == 128_625_408
    counts = [count_parameters(config_for(size)) for size in SIZES if size != "tiny"]
    assert counts == sorted(counts)
    # "2.7B" is GPT-3's name for this shape with a 2-matrix FFN (12 d^2 per layer); SwiGLU
    # with d_ff = 4d has 3 matrices (16 d^2 per layer), hence ~3.4B here.
    assert count_parameters(config_for("2.7B")) == 3_406_809_600


def test_invalid_configs_are_rejected() -> None:
    with pytest.raises(ValueError, match="divisible"):
        config_for("tiny", n_heads=3)
    with pytest.raises(ValueError, match="unknown size"):
        config_for("huge")
    with pytest.raises(ValueError, match="attention"):
        config_for("tiny", attention="flash")


def tiny_workload(optimizer: str = "adamw_foreach", **overrides: object) -> Workload:
    settings = dict(size="tiny", context=16, batch=2, vocab=1000, mode="train", dtype="fp32")
    speed = Speed(optimizer=optimizer)
    return build_gpt(
        **{**settings, "attention": "sdpa", "device": CPU, "seed": 0, "speed": speed, **overrides}
    )


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_train_steps_lower_the_loss(attention: str) -> None:
    workload = tiny_workload(attention=attention)
    losses = run_steps(workload.step, warmup=0, steps=4, device=CPU).losses
    assert len(losses) == 4
    assert abs(losses[0] - math.log(1000)) < 0.5  # ~uniform prediction at init
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False))  # same batch every step


def test_forward_backward_does_not_update_weights() -> None:
    losses = run_steps(tiny_workload(mode="forward_backward").step, warmup=0, steps=2, device=CPU)
    assert losses.losses[0] == losses.losses[1]


def test_bf16_autocast_step_runs_with_fp32_master_weights() -> None:
    workload = tiny_workload(dtype="bf16")
    losses = run_steps(workload.step, warmup=0, steps=2, device=CPU).losses
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert losses[1] < losses[0]


def test_forward_mode_returns_no_loss() -> None:
    workload = tiny_workload(mode="forward", attention="naive")
    assert run_steps(workload.step, warmup=1, steps=2, device=CPU).losses == []


def test_model_flops_follow_6n_rule() -> None:
    cfg = config_for("small")
    forward = flops.gpt_forward_flops(cfg, batch=4, seq=512)
    matmul_params = count_parameters(cfg) - cfg.vocab_size * cfg.d_model - (2 * 12 + 1) * 768
    attention = 12 * 4 * 4 * 512 * 512 * 768
    assert forward == 2 * matmul_params * 4 * 512 + attention
    assert flops.step_flops(forward, "train") == 3 * forward
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert flops.peak_tflops("AMD EPYC", "bf16") is None


# --- optimizers ---------------------------------------------------------------------------


def master_vs_torch(dtype: str, low: torch.dtype | None) -> tuple[list[float], list[float]]:
    """Losses of 4 steps with torch's AdamW and with MasterAdamW, same init and batch."""
    from workloads.device import autocast
    from workloads.optim import build_optimizer

    torch.manual_seed(0)
    reference = GPT(config_for("tiny", context_length=16, vocab_size=200))
    master = GPT(config_for("tiny", context_length=16, vocab_size=200))
    master.load_state_dict(reference.state_dict())
    optimizers = [
        torch.optim.AdamW(reference.parameters(), lr=1e-3),
        build_optimizer("adamw_master", master, lr=1e-3, low_precision=low),
    ]
    tokens = torch.randint(0, 200, (2, 16), generator=torch.Generator().manual_seed(5))
    targets = torch.randint(0, 200, (2, 16), generator=torch.Generator().manual_seed(6))
    losses: list[list[float]] = [[], []]
    for _ in range(4):
        for model, optimizer, out in zip((reference, master), optimizers, losses, strict=True):
            optimizer.zero_grad()
            with autocast(CPU, dtype):
                logits = model(tokens)
            flat = logits.flatten(0, 1).float()
            loss = torch.nn.functional.cross_entropy(flat, targets.flatten())
            loss.backward()
            optimizer.step()
            out.append(loss.item())
    return losses[0], losses[1]


def test_master_adamw_matches_torch_adamw_in_fp32() -> None:
    reference, master = master_vs_torch("fp32", None)
    assert reference[0] == master[0]
    # Same update rule; only rounding order differs (fp32 ulps).
    assert master == pytest.approx(reference, rel=1e-6)


def test_master_adamw_under_bf16_keeps_bf16_linear_weights() -> None:
    from workloads.optim import build_optimizer

    reference, master = master_vs_torch("bf16", torch.bfloat16)
    assert reference[0] == master[0]  # same bf16 casts of the same weights at step 1
    assert master == pytest.approx(reference, rel=1e-4)  # bf16 rounding flips, no drift
    model = GPT(config_for("tiny", context_length=8))
    optimizer = build_optimizer("adamw_master", model, lr=1e-3, low_precision=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert model.token_embeddings.weight.dtype == torch.float32  # not a matmul weight
    assert model.ln_final.weight.dtype == torch.float32
    assert optimizer.master.numel() == count_parameters(model.cfg)


@pytest.mark.parametrize("optimizer", ["adamw_fused", "adamw_master"])
def test_every_optimizer_lowers_the_loss(optimizer: str) -> None:
    losses = run_steps(
        tiny_workload(optimizer=optimizer).step, warmup=0, steps=3, device=CPU
    ).losses
    assert losses[0] > losses[1] > losses[2]


def test_fp16_train_step_uses_a_grad_scaler() -> None:
    losses = run_steps(tiny_workload(dtype="fp16").step, warmup=0, steps=3, device=CPU).losses
    assert all(math.isfinite(loss) for loss in losses) and losses[2] < losses[0]


def test_master_adamw_rejects_fp16() -> None:
    from workloads.status import Unsupported

    with pytest.raises(Unsupported, match="fp16"):
        tiny_workload(dtype="fp16", optimizer="adamw_master")
