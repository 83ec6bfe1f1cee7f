"""softmax(q k^T) v on (batch, heads, seq, head_dim): the attention kernel alone, for sweeps.

q, k and v are fixed random tensors of that shape; ``impl`` picks the explicit formula or
``F.scaled_dot_product_attention`` (and with it ``sdpa_backend``'s kernel family). Its TFLOP/s
come from analytic FLOPs (workloads/flops.py: 4·B·H·S²·D forward, halved when causal).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from workloads.models.attention import KERNELS_PER_STEP


@dataclass
class Options:
    impl: Literal["naive", "sdpa"] = field(default="sdpa", metadata={
        "help": "naive softmax(q k^T) v, or F.scaled_dot_product_attention", "required": True})
    batch: int = field(default=8, metadata={"minimum": 1, "required": True})
    heads: int = field(default=16, metadata={"minimum": 1, "required": True})
    seq: int = field(default=4096, metadata={"minimum": 1, "required": True})
    head_dim: int = field(default=128, metadata={"minimum": 1, "required": True})
    causal: bool = field(default=False, metadata={"help": "true/false: a causal mask"})
    mode: Literal["forward", "forward_backward"] = "forward"


def build(options: Options, run: Any) -> Any:
    """The kernel on fixed random q, k, v (workloads/steps.py: build_attention_core)."""
    from workloads.steps import build_attention_core

    return build_attention_core(**dataclasses.asdict(options), dtype=run.dtype,
                                device=run.device, seed=run.seed, speed=run.speed)


def kernels_per_step(options: Options, dtype: str) -> int:
    return KERNELS_PER_STEP.get(options.mode, 30)


def summary(options: Options) -> str:
    return (f"attention_core {options.impl} h={options.heads} s={options.seq} "
            f"d={options.head_dim}")
