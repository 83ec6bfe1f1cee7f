"""A small MLP for ``workload: model`` whose step can carry a known delay, for measuring
``analysis diff`` on real CPU runs (benchmarks/diff_cpu_runs.py, docs/diff.md).

``make(width, depth, delay_ms)``: ``depth`` Linear+ReLU layers of ``width`` on a batch of
``width``-wide rows; its forward does real matrix work (so the step carries the CPU's own
noise), then sleeps ``delay_ms`` (a regression of known size: 0 for the unchanged model).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Delay(nn.Module):
    """Sleeps ``delay_ms`` in forward; the identity on its input."""

    def __init__(self, delay_ms: float) -> None:
        super().__init__()
        self.seconds = delay_ms / 1e3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.seconds > 0:
            time.sleep(self.seconds)
        return x


def make(width: int = 256, depth: int = 4, delay_ms: float = 0.0) -> tuple[Any, Any, Any]:
    """The model, a seeded batch maker and a regression loss (docs/workloads.md)."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, 1), Delay(delay_ms))

    def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        inputs = torch.randn(batch_size, width, generator=g)
        return inputs.to(device), torch.randn(batch_size, 1, generator=g).to(device)

    return model, make_batch, lambda out, target: F.mse_loss(out, target)
