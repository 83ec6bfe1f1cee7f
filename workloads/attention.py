"""The attention module of the Nsight Systems notebook, in a naive and an SDPA flavour.

Both flavours are the same module (same parameters, same projections, same residual +
LayerNorm); only the attention core differs, chosen by ``impl``:

* ``naive``: explicit ``softmax(q k^T / sqrt(d)) v`` with one NVTX range per step;
* ``sdpa``: ``F.scaled_dot_product_attention``, PyTorch's fused kernels.
"""

import contextlib
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from workloads.nvtx_ranges import rng

IMPLS = ("naive", "sdpa")
# `auto` lets PyTorch pick; the others pin one kernel family (torch.nn.attention.sdpa_kernel).
SDPA_BACKENDS = ("auto", "math", "efficient", "flash", "cudnn")
_BACKEND_ENUM = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def sdpa_backend_context(backend: str) -> contextlib.AbstractContextManager:
    """Restrict ``F.scaled_dot_product_attention`` to ``backend`` (nothing for ``auto``)."""
    if backend == "auto":
        return contextlib.nullcontext()
    if backend not in _BACKEND_ENUM:
        raise ValueError(f"unknown sdpa backend {backend!r}; expected one of {SDPA_BACKENDS}")
    return sdpa_kernel(_BACKEND_ENUM[backend])


def sdpa_unsupported_reason(
    backend: str,
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    *,
    causal: bool,
    backward: bool,
) -> str | None:
    """Why ``backend`` cannot run this attention case, or None when it can.

    Runs the case once, eagerly, on a one-sequence slice of the real shape: PyTorch's own
    checks decide, and their warnings (the reasons) become the message.
    """
    if backend == "auto":
        return None
    _, heads, seq, head_dim = shape
    q, k, v = (
        torch.randn(1, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=backward)
        for _ in range(3)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_backend_context(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                if backward:
                    out.sum().backward()
        except RuntimeError as err:
            reasons = "; ".join(dict.fromkeys(str(w.message).strip() for w in caught))
            detail = f" ({reasons})" if reasons else ""
            return f"sdpa backend {backend!r} cannot run this case: {err}{detail}".strip()
    return None


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) [+ causal mask]) v`` spelled out op by op.

    q, k, v: (..., seq, head_dim). Shared by the attention and the GPT workloads.
    """
    with rng("computing attention scores"):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        with rng("causal mask construction"):
            seq = q.size(-2)
            future = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=q.device), diagonal=1)
            scores = scores.masked_fill(future, float("-inf"))
    with rng("computing softmax"):
        probs = F.softmax(scores, dim=-1)
    with rng("final matmul"):
        return probs @ v


def attention_core(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str, causal: bool = False
) -> torch.Tensor:
    """Dispatch to the naive or the fused attention, inside the ``scaled_dot_product_attention``
    range so both implementations show up under the same name in a profile."""
    with rng("scaled_dot_product_attention"):
        if impl == "naive":
            return naive_attention(q, k, v, causal=causal)
        if impl == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        raise ValueError(f"unknown attention impl {impl!r}; expected one of {IMPLS}")


class Attention(nn.Module):
    """q/k/v projections, (multi-head) attention, then ``LayerNorm(x + attention)``."""

    def __init__(self, embed_dim: int, n_heads: int = 1, impl: str = "naive") -> None:
        super().__init__()
        if embed_dim % n_heads:
            raise ValueError(f"embed dim {embed_dim} is not divisible by {n_heads} heads")
        if impl not in IMPLS:
            raise ValueError(f"unknown attention impl {impl!r}; expected one of {IMPLS}")
        self.n_heads = n_heads
        self.impl = impl
        self.query = nn.Linear(embed_dim, embed_dim)
        self.key = nn.Linear(embed_dim, embed_dim)
        self.value = nn.Linear(embed_dim, embed_dim)
        self.layer_norm = nn.LayerNorm(embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq, embed) -> (batch, seq, embed)."""
        with rng("attention projections"):
            q, k, v = (self._split_heads(proj(x)) for proj in (self.query, self.key, self.value))
        y = attention_core(q, k, v, self.impl)
        with rng("residual_layernorm"):
            return self.layer_norm(x + self._merge_heads(y))

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        # (B, T, C) -> (B, H, T, C/H): heads become a batch dimension for the matmuls.
        batch, seq, embed = t.shape
        return t.view(batch, seq, self.n_heads, embed // self.n_heads).transpose(1, 2)

    @staticmethod
    def _merge_heads(t: torch.Tensor) -> torch.Tensor:
        batch, heads, seq, head_dim = t.shape
        return t.transpose(1, 2).reshape(batch, seq, heads * head_dim)
