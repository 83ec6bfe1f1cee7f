"""A CS336 (assignment 1) Transformer language model as a profbench model factory.

Token embedding -> num_layers pre-norm blocks (RMSNorm, causal multi-head attention with
RoPE, SwiGLU FFN) -> final RMSNorm -> LM head. No biases, untied embeddings. The module
names are those of cs336_basics, so a student's own model profiles with the same table:

    runs:
      cs336_small: {workload: model, factory: "workloads/models/cs336_lm.py:make",
                    kwargs: {context_length: 256}, batch: 8, mode: train, dtype: bf16}

``checkpoint``: activation checkpointing of every block with ``torch.utils.checkpoint``
(``nonreentrant``, PyTorch's recommended form, or ``reentrant``): each block's forward runs
again in backward, as a model trained at the edge of its memory does.

This file stands alone (torch only) as a user's model file would.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint as recompute_in_backward

from workloads.models.parts import ModelParts, Structure

# The batch maker's seed: every call, and every run, sees the same tokens.
SEED = 0
CHECKPOINTS = ("none", "nonreentrant", "reentrant")


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The mean of squares in fp32: bf16 activations would lose it.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE: rotates adjacent feature pairs (x0, x1), (x2, x3), ... by each position's angle."""

    def __init__(self, context_length: int, d_head: int, theta: float = 10_000.0) -> None:
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32), inv_freq)
        # Not persistent: derived from the sizes, so they stay out of the state_dict.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, heads, seq, d_head), token i at position i."""
        seq = x.size(-2)
        cos, sin = self.cos[:seq], self.sin[:seq]
        even, odd = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return rotated.flatten(-2).to(x.dtype)


class CausalMultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, positional_encoder: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.output_proj = nn.Linear(d_model, d_model, bias=False)
        # One RoPE table for all layers, as in cs336_basics: named_modules() lists it once, at
        # the top level (the model registers it first).
        self.positional_encoder = positional_encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        q, k, v = (
            proj(x).view(batch, seq, self.num_heads, -1).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = self.positional_encoder(q), self.positional_encoder(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.output_proj(y.transpose(1, 2).reshape(batch, seq, d_model))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm: x + attn(ln1(x)), then x + ffn(ln2(x))."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int,
                 positional_encoder: RotaryEmbedding) -> None:
        super().__init__()
        self.ln1 = RMSNorm(d_model)
        self.attn = CausalMultiHeadSelfAttention(d_model, num_heads, positional_encoder)
        self.ln2 = RMSNorm(d_model)
        self.ffn = SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int,
                 num_heads: int, d_ff: int, rope_theta: float = 10_000.0,
                 checkpoint: str = "none") -> None:
        super().__init__()
        if checkpoint not in CHECKPOINTS:
            raise ValueError(f"checkpoint {checkpoint!r}: expected one of {CHECKPOINTS}")
        self.checkpoint = checkpoint
        if d_model % num_heads or (d_model // num_heads) % 2:
            raise ValueError(f"d_model {d_model} must split into {num_heads} heads of an even "
                             "size (RoPE rotates pairs)")
        self.context_length = context_length
        self.token_embeddings = nn.Embedding(vocab_size, d_model)
        self.positional_encoder = RotaryEmbedding(context_length, d_model // num_heads,
                                                  rope_theta)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, self.positional_encoder)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (batch, seq) int64 -> logits (batch, seq, vocab)."""
        if tokens.size(-1) > self.context_length:
            raise ValueError(f"sequence {tokens.size(-1)} > context {self.context_length}")
        x = self.token_embeddings(tokens)
        for layer in self.layers:
            if self.checkpoint == "none" or not torch.is_grad_enabled():
                x = layer(x)
            else:
                x = recompute_in_backward(layer, x,
                                          use_reentrant=self.checkpoint == "reentrant")
        return self.lm_head(self.ln_final(x))


def _init_weights(module: nn.Module) -> None:
    # CS336's init: truncated normals at 3 sigma, sigma^2 = 2 / (fan_in + fan_out) for linear
    # maps and 1 for the embedding; the norms keep their ones.
    if isinstance(module, nn.Linear):
        std = math.sqrt(2.0 / (module.in_features + module.out_features))
        nn.init.trunc_normal_(module.weight, std=std, a=-3 * std, b=3 * std)
    elif isinstance(module, nn.Embedding):
        nn.init.trunc_normal_(module.weight, std=1.0, a=-3.0, b=3.0)


def count_parameters(d_model: int, d_ff: int, num_layers: int, vocab_size: int) -> int:
    """Closed-form parameter count of :class:`TransformerLM` (RoPE has none)."""
    per_layer = 4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model  # attn, ffn, 2 norms
    return 2 * vocab_size * d_model + num_layers * per_layer + d_model  # + ln_final


def make(d_model: int = 768, d_ff: int = 3072, num_layers: int = 12, num_heads: int = 12,
         vocab_size: int = 10_000, context_length: int = 512,
         rope_theta: float = 10_000.0, checkpoint: str = "none") -> ModelParts:
    """The model (CS336's "small" by default), random tokens and next-token cross entropy."""
    model = TransformerLM(vocab_size, context_length, d_model, num_layers, num_heads, d_ff,
                          rope_theta, checkpoint)

    def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # Drawn on the CPU so the tokens are the same on every device.
        generator = torch.Generator().manual_seed(SEED)
        shape = (batch_size, context_length)
        tokens = torch.randint(0, vocab_size, shape, generator=generator)
        targets = torch.randint(0, vocab_size, shape, generator=generator)
        return tokens.to(device), targets.to(device)

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # The softmax over the vocabulary in fp32, whatever the autocast dtype.
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    return ModelParts(
        model=model,
        make_batch=make_batch,
        loss=loss,
        structure=Structure(layers="layers.*", sublayers="attn|ffn|ln1|ln2"),
        items_per_sample=context_length,
        constant_buffers=True,  # the RoPE tables: DDP need not broadcast them every step
    )
