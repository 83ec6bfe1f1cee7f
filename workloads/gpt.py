"""A GPT-style language model as in Stanford CS336 (assignment 1), written like nanoGPT.

Token embedding -> n_layers pre-norm blocks (RMSNorm, causal multi-head attention with RoPE,
SwiGLU FFN) -> final RMSNorm -> LM head. No biases, untied embeddings.

Its layers are ``layers.0``, ``layers.1``, ... and their parts ``ln1``, ``attn``, ``ln2`` and
``ffn``: a capture's module ranges (workloads/module_ranges.py) name them as any model's.
torch.compile's block variants (``compile_blocks``) and activation checkpointing are applied
by the step builder (workloads/models/builder.py), as to any model.
"""

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from workloads.attention import IMPLS, attention_core
from workloads.nvtx_ranges import rng


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 10_000
    context_length: int = 512
    d_model: int = 768
    d_ff: int = 3072
    n_layers: int = 12
    n_heads: int = 12
    rope_theta: float = 10_000.0
    attention: str = "sdpa"  # "naive" or "sdpa"

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} not divisible by n_heads {self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError("RoPE needs an even head dimension")
        if self.attention not in IMPLS:
            raise ValueError(f"unknown attention {self.attention!r}; expected one of {IMPLS}")


# d_model / d_ff / n_layers / n_heads of the CS336 model sizes, plus `tiny` for CPU tests.
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(d_model=64, d_ff=128, n_layers=2, n_heads=4),
    "small": dict(d_model=768, d_ff=3072, n_layers=12, n_heads=12),
    "medium": dict(d_model=1024, d_ff=4096, n_layers=24, n_heads=16),
    "large": dict(d_model=1280, d_ff=5120, n_layers=36, n_heads=20),
    "xl": dict(d_model=1600, d_ff=6400, n_layers=48, n_heads=25),
    "2.7B": dict(d_model=2560, d_ff=10240, n_layers=32, n_heads=32),
}


def config_for(size: str, **overrides: int | str | float) -> GPTConfig:
    """The :class:`GPTConfig` of a named size, e.g. ``config_for("small", context_length=256)``."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {list(SIZES)}")
    return replace(GPTConfig(**SIZES[size]), **overrides)


def count_parameters(cfg: GPTConfig) -> int:
    """Closed-form parameter count of :class:`GPT` (checked against the module in tests)."""
    d, v = cfg.d_model, cfg.vocab_size
    per_block = 4 * d * d + 3 * d * cfg.d_ff + 2 * d  # q/k/v/out, SwiGLU w1/w2/w3, 2 RMSNorms
    return 2 * v * d + cfg.n_layers * per_block + d  # embedding + lm_head, blocks, final norm


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 so bf16 activations do not lose the mean of squares.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).type_as(x)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables; rotates adjacent feature pairs (x0, x1), (x2, x3), ..."""

    def __init__(self, head_dim: int, context_length: int, theta: float) -> None:
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32), inv_freq)
        # Not persistent: derived from the config, so they stay out of state_dict.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, heads, seq, head_dim), rotated by each token's position."""
        seq = x.size(-2)
        cos, sin = self.cos[:seq], self.sin[:seq]
        even, odd = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return rotated.flatten(-2).type_as(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.attention = cfg.attention
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.rope = rope  # shared by all layers (registered once: module dedup)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d_model = x.shape
        with rng("attention projections"):
            q, k, v = (
                proj(x).view(batch, seq, self.n_heads, -1).transpose(1, 2)
                for proj in (self.q_proj, self.k_proj, self.v_proj)
            )
        with rng("rope encoding"):
            q, k = self.rope(q), self.rope(k)
        y = attention_core(q, k, v, self.attention, causal=True)
        with rng("output projection"):
            return self.out_proj(y.transpose(1, 2).reshape(batch, seq, d_model))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, cfg: GPTConfig, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.ln1 = RMSNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg, rope)
        self.ln2 = RMSNorm(cfg.d_model)
        self.ffn = SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.token_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        rope = RotaryEmbedding(cfg.d_model // cfg.n_heads, cfg.context_length, cfg.rope_theta)
        self.layers = nn.ModuleList(Block(cfg, rope) for _ in range(cfg.n_layers))
        self.ln_final = RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (batch, seq) int64 -> logits (batch, seq, vocab)."""
        if tokens.size(-1) > self.cfg.context_length:
            raise ValueError(f"sequence {tokens.size(-1)} > context {self.cfg.context_length}")
        with rng("token_embeddings"):
            x = self.token_embeddings(tokens)
        for block in self.layers:
            x = block(x)
        with rng("final_norm"):
            x = self.ln_final(x)
        with rng("lm_head"):
            return self.lm_head(x)


def _init_weights(module: nn.Module) -> None:
    # GPT-2-style small normal init (truncated as in CS336); norms keep their ones.
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.trunc_normal_(module.weight, std=0.02, a=-0.06, b=0.06)
