"""The whole step in one CUDA graph (run key ``cuda_graph: step``).

``compile: reduce-overhead`` makes one CUDA graph per compiled region (model forward, loss,
their backwards) and replays them from Python, with eager glue (the optimizer's gathers, the
step-begin marker) between them: on a launch-bound step the host's waits between replays stay
on the critical path. Here the complete step (zero_grad, forward, loss, backward, optimizer)
is captured once into a single graph and each step is one replay: the GPU runs the same
kernels (torch.compile in mode ``default`` compiles them; its own CUDA graphs are off, since
graphs do not nest), with nothing from the host between them.

Requirements, checked before the capture: a CUDA device, no host synchronization inside the
step (the optimizers keep their step count on the device: ``adamw_master``, or torch's AdamW
built with ``capturable=True``), no GradScaler (fp16 training checks for infs on the host).

The NVTX ranges of the step exist only while capturing, so a replay has none. To keep the
per-phase attribution, the capture records after each phase range how many graph nodes that
produce GPU activity records (kernel, memset, memcpy) the graph has so far:
``graph_phases = [{"phase": "forward_pass", "nodes": 171}, ...]`` (cumulative, in capture
order), read with ``cudaStreamGetCaptureInfo`` + ``cudaGraphGetNodes`` (cuda-python). A replay
runs its nodes in capture order on one stream, so the analysis splits each replay's GPU
operations, ordered by start, at those counts (analysis/metrics/phases.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from workloads import nvtx_ranges
from workloads.runner import Step
from workloads.status import Unsupported

CUDA_GRAPH_MODES = ("off", "step")
# Eager steps before the capture (on a side stream, as torch.cuda.graphs asks): compilation,
# cuBLAS workspaces and the autograd engine's stream bookkeeping happen there.
EAGER_WARMUP = 3
# The phase ranges whose ends are recorded (workloads/steps.py names them).
PHASES = ("forward_pass", "loss_computation", "backward_pass", "optimizer_step")
# Node types that leave a CUPTI activity record when the graph is replayed.
_ACTIVITY_NODE_TYPES = ("Kernel", "Memset", "Memcpy")


def check_capturable(device: torch.device, dtype: str, mode: str) -> None:
    """Raise Unsupported when the step cannot be captured whole (see the module docstring)."""
    if device.type != "cuda":
        raise Unsupported("cuda_graph: step needs a CUDA device (CUDA graphs)")
    if dtype == "fp16" and mode != "forward":
        raise Unsupported("cuda_graph: step cannot capture fp16 training: its GradScaler checks "
                          "for infs on the host; use bf16")


def capture_step(step: Step, device: torch.device) -> tuple[Step, dict[str, Any]]:
    """Warm ``step`` up eagerly, capture one call of it into a CUDA graph, and return
    (replay step, record) where record holds ``graph_phases`` (None when the node counts
    cannot be read) and the number of eager warm-up steps."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(EAGER_WARMUP):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    counter = PhaseNodeCounter()
    with counter.observing(), torch.cuda.graph(graph):
        output = step()
    static = output.detach() if isinstance(output, torch.Tensor) else None

    def replay() -> torch.Tensor | None:
        graph.replay()
        # the graph overwrites its output on the next replay: hand out a copy
        return None if static is None else static.clone()

    record = {"cuda_graph_eager_warmup": EAGER_WARMUP, "graph_phases": counter.phases(),
              "graph_phases_note": counter.note}
    return replay, record


class PhaseNodeCounter:
    """Counts the capturing graph's activity nodes at the end of each phase range."""

    def __init__(self) -> None:
        self.counts: list[tuple[str, int]] = []
        self.note: str | None = None
        try:
            from cuda.bindings import runtime as cudart
        except ImportError as err:  # cuda-python ships with CUDA builds of torch
            self._cudart = None
            self.note = f"no node counts: cuda-python is missing ({err})"
        else:
            self._cudart = cudart

    @contextlib.contextmanager
    def observing(self) -> Iterator[None]:
        nvtx_ranges.set_exit_observer(self._range_ended if self._cudart else None)
        try:
            yield
        finally:
            nvtx_ranges.set_exit_observer(None)

    def _range_ended(self, name: str) -> None:
        if name in PHASES and self.note is None:
            try:
                self.counts.append((name, self._activity_nodes()))
            except RuntimeError as err:
                self.note = f"no node counts: {err}"

    def _activity_nodes(self) -> int:
        """Kernel, memset and memcpy nodes of the graph being captured on this stream."""
        rt = self._cudart
        stream = torch.cuda.current_stream().cuda_stream
        info = rt.cudaStreamGetCaptureInfo(stream)
        _check(rt, info[0], "cudaStreamGetCaptureInfo")
        graph = info[3]
        err, _, count = rt.cudaGraphGetNodes(graph, 0)
        _check(rt, err, "cudaGraphGetNodes")
        err, nodes, count = rt.cudaGraphGetNodes(graph, count)
        _check(rt, err, "cudaGraphGetNodes")
        n = 0
        for node in nodes[:count]:
            err, kind = rt.cudaGraphNodeGetType(node)
            _check(rt, err, "cudaGraphNodeGetType")
            if any(t in str(kind) for t in _ACTIVITY_NODE_TYPES):
                n += 1
        return n

    def phases(self) -> list[dict[str, Any]] | None:
        if self.note is not None or not self.counts:
            return None
        return [{"phase": name, "nodes": n} for name, n in self.counts]


def _check(rt: Any, err: Any, call: str) -> None:
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"{call} failed: {err}")
