"""On a CUDA GPU: the whole step in one CUDA graph (`cuda_graph: step`) computes what the same
compiled step computes without the graph, and records its phases' node counts.

    python -m pytest tests/gpu/test_step_graph.py      (needs CUDA; not part of the CPU suite)
"""

from __future__ import annotations

import pytest
import torch

from workloads.device import configure_precision
from workloads.graphs import EAGER_WARMUP, PHASES, capture_step
from workloads.models.builder import build_gpt
from workloads.steps import Speed

STEPS = 8


def train_losses(cuda_graph: str, size: str = "small") -> tuple[list[float], dict]:
    configure_precision("bf16")
    device = torch.device("cuda")
    workload = build_gpt(size=size, context=512, batch=4, vocab=10_000, mode="train",
                         dtype="bf16", attention="sdpa", device=device, seed=0,
                         speed=Speed(compile="default", sdpa_backend="cudnn",
                                     optimizer="adamw_master", cuda_graph=cuda_graph))
    step, record = workload.step, {}
    if cuda_graph == "step":
        step, record = capture_step(step, device)
    else:  # the same eager steps the capture runs first
        for _ in range(EAGER_WARMUP):
            step()
    losses = [float(step()) for _ in range(STEPS)]
    torch.cuda.synchronize()
    return losses, record


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[list[float], dict]]:
    if not torch.cuda.is_available():
        pytest.fail("tests/gpu needs a CUDA GPU")
    return {mode: train_losses(mode) for mode in ("off", "step")}


def test_same_losses_with_and_without_the_graph(runs) -> None:
    eager, graph = runs["off"][0], runs["step"][0]
    # the same kernels in the same order; only atomics (embedding backward) may differ
    assert graph == pytest.approx(eager, rel=2e-3), (eager, graph)
    assert graph[-1] < graph[0]  # it trains


def test_phase_node_counts_grow_in_step_order(runs) -> None:
    phases = runs["step"][1]["graph_phases"]
    assert [p["phase"] for p in phases] == list(PHASES)
    counts = [p["nodes"] for p in phases]
    assert counts == sorted(counts) and counts[0] > 0
    # the optimizer (two gathers + two compiled segment updates + the step counter) is small
    assert 0 < counts[-1] - counts[-2] < 20
