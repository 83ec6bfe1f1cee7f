"""Builds one workload (model + fixed inputs + a step function) from CLI-level settings.

A step is one forward, forward+backward or training iteration; :mod:`workloads.runner`
times it. Inputs are generated once from a seeded CPU generator (same data on every device)
and reused by every step, so a `train` run always fits the same batch.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workloads import flops
from workloads.attention import Attention
from workloads.device import autocast
from workloads.gpt import GPT, config_for
from workloads.nvtx_ranges import rng
from workloads.runner import Step

ATTENTION_MODES = ("forward", "forward_backward")
GPT_MODES = ("forward", "forward_backward", "train")


@dataclass
class Workload:
    step: Step
    tokens_per_step: int
    params_count: int
    forward_flops: int


def build_attention(
    *,
    impl: str,
    batch: int,
    seq: int,
    embed: int,
    heads: int,
    dtype: str,
    mode: str,
    device: torch.device,
    seed: int,
) -> Workload:
    """The notebook attention module on a fixed random (batch, seq, embed) input."""
    _check_mode(mode, ATTENTION_MODES, "attention")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Attention(embed, heads, impl)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, embed, generator=generator).to(device)
    # No loss in this workload: backward starts from a fixed random output gradient.
    grad_output = torch.randn(batch, seq, embed, generator=generator).to(device)

    def forward() -> torch.Tensor:
        with autocast(device, dtype):
            return model(x)

    return Workload(
        step=_make_step(model, forward, mode, grad_output=grad_output),
        tokens_per_step=batch * seq,
        params_count=_count(model),
        forward_flops=flops.attention_forward_flops(batch, seq, embed),
    )


def build_gpt(
    *,
    size: str,
    context: int,
    batch: int,
    vocab: int,
    mode: str,
    dtype: str,
    attention: str,
    device: torch.device,
    seed: int,
    lr: float = 1e-3,
) -> Workload:
    """The CS336 GPT on a fixed random token batch, with random targets."""
    _check_mode(mode, GPT_MODES, "gpt")
    cfg = config_for(size, context_length=context, vocab_size=vocab, attention=attention)
    torch.manual_seed(seed)
    # Built directly on the device: initializing a multi-GB model on the CPU is slow.
    with torch.device(device):
        model = GPT(cfg)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, context), generator=generator).to(device)
    targets = torch.randint(0, vocab, (batch, context), generator=generator).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr) if mode == "train" else None

    def forward() -> torch.Tensor:
        with autocast(device, dtype):
            return model(tokens)

    def loss_fn(logits: torch.Tensor) -> torch.Tensor:
        # fp32 loss whatever the activation dtype (what autocast does on CUDA anyway).
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    return Workload(
        step=_make_step(model, forward, mode, loss_fn=loss_fn, optimizer=optimizer),
        tokens_per_step=batch * context,
        params_count=_count(model),
        forward_flops=flops.gpt_forward_flops(cfg, batch, context),
    )


def _make_step(
    model: nn.Module,
    forward: Callable[[], torch.Tensor],
    mode: str,
    *,
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    grad_output: torch.Tensor | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> Step:
    """Wrap forward / loss / backward / optimizer in their NVTX ranges.

    Backward starts from the scalar loss when there is a ``loss_fn``, else from the model
    output with ``grad_output``. The step returns the loss (or None) without syncing.
    """

    def forward_step() -> None:
        # Inference-style: no autograd graph is recorded, as when serving the model.
        with torch.no_grad(), rng("forward_pass"):
            forward()

    def training_step() -> torch.Tensor | None:
        model.zero_grad(set_to_none=True)
        with rng("forward_pass"):
            out = forward()
        loss = None
        if loss_fn is not None:
            with rng("loss_computation"):
                loss = loss_fn(out)
        with rng("backward_pass"):
            if loss is not None:
                loss.backward()
            else:
                out.backward(grad_output.to(out.dtype))
        if optimizer is not None:
            with rng("optimizer_step"):
                optimizer.step()
        return loss

    return forward_step if mode == "forward" else training_step


def _check_mode(mode: str, allowed: tuple[str, ...], workload: str) -> None:
    if mode not in allowed:
        raise ValueError(f"mode {mode!r} is not available for {workload}; choose from {allowed}")


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
