"""naive vs SDPA attention module (notebook): projections, attention, residual and LayerNorm.

The Nsight Systems notebook's attention module (workloads/attention.py) on a fixed random
(batch, seq, embed) input; ``impl`` picks its core: the explicit ``softmax(q k^T) v`` or
``F.scaled_dot_product_attention``. No loss: backward starts from a fixed random output
gradient.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

# Kernels per measured step, from H100 captures: 9 (naive) or 6 (SDPA) forward; rounded up,
# and three times that with the backward (the attention workloads' disk estimate).
KERNELS_PER_STEP = {"forward": 10, "forward_backward": 30}


@dataclass
class Options:
    impl: Literal["naive", "sdpa"] = field(default="naive", metadata={
        "help": "naive softmax(q k^T) v, or F.scaled_dot_product_attention", "required": True})
    batch: int = field(default=32, metadata={"minimum": 1, "required": True})
    seq: int = field(default=100, metadata={"minimum": 1, "required": True})
    embed: int = field(default=256, metadata={"minimum": 1, "required": True})
    heads: int = field(default=1, metadata={"minimum": 1})
    mode: Literal["forward", "forward_backward"] = "forward"


def build(options: Options, run: Any) -> Any:
    """The module on its fixed input (workloads/steps.py: build_attention)."""
    from workloads.steps import build_attention

    return build_attention(**dataclasses.asdict(options), dtype=run.dtype, device=run.device,
                           seed=run.seed, speed=run.speed)


def kernels_per_step(options: Options, dtype: str) -> int:
    return KERNELS_PER_STEP.get(options.mode, 30)


def summary(options: Options) -> str:
    return f"attention {options.impl} h={options.heads}"
