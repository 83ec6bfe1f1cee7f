"""The one warm-up / measure loop shared by every workload.

Capture contract with the pipeline (see docs/workloads.md):

* each warm-up step runs inside an NVTX range ``warmup``, before any capture starts;
* all measured steps run inside ONE range ``profiled_region`` (nsys
  ``--capture-range=nvtx --nvtx-capture=profiled_region``), bracketed on CUDA by
  ``torch.cuda.profiler.start()/stop()`` (for ``--capture-range=cudaProfilerApi``);
* each measured step is a ``profiled_step`` range, synchronized before its timer stops;
* with ``op_ranges`` on (the op capture only), PyTorch's op ranges are emitted around the
  measured steps (``workloads/op_ranges.py``); never in the timing processes.

The published timer is CUDA events on CUDA (``cuda_event``) and the host clock on CPU
(``wall``); ``step_ms`` holds that timer's per-step times and every statistic uses it.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from workloads.device import synchronize
from workloads.nvtx_ranges import PROFILED_REGION, rng
from workloads.op_ranges import op_ranges as op_range_context

# A step runs one iteration of the workload and returns its loss (or None), not yet synced.
Step = Callable[[], torch.Tensor | None]


@dataclass
class Measurement:
    """Per-step results of :func:`run_steps`."""

    step_times_ms: list[float]
    losses: list[float] = field(default_factory=list)
    # CUDA-event times of the same steps (GPU-side), empty on CPU.
    cuda_event_times_ms: list[float] = field(default_factory=list)
    # What the measured steps held at their peak (CUDA only): the allocator's peak of
    # allocated bytes plus the free space of CUDA graphs' private pools, which a replay's
    # kernels use without the allocator seeing it (workloads/memory_capture.py).
    peak_memory_bytes: int | None = None
    peak_allocated_bytes: int | None = None  # the allocator's own peak (max_memory_allocated)
    peak_reserved_bytes: int | None = None  # max_memory_reserved: the pools included
    cuda_graph_pool_bytes: int | None = None  # reserved by CUDA graphs' private pools
    # Host-clock time of each warm-up step (compilation and autotuning happen there).
    warmup_times_ms: list[float] = field(default_factory=list)
    # Host time to enter and to leave the measured region (cudaProfilerStart + the range's
    # push; its pop + cudaProfilerStop): where nsys starts and stops collecting in a capture
    # (its own cost inside the process, outside every step), ~0 untraced.
    region_ms: dict[str, float] = field(default_factory=dict)
    # Host time each measured step spent waiting in its closing synchronize (CUDA only): ~0
    # when the GPU finished as soon as the host had issued the step's last work, i.e. when
    # the host's speed, not the GPU's, set the step time (a launch-bound step).
    sync_wait_ms: list[float] = field(default_factory=list)

    @property
    def timer(self) -> str:
        return "cuda_event" if self.cuda_event_times_ms else "wall"

    @property
    def step_ms(self) -> list[float]:
        """The published per-step times: CUDA events when recorded, else the host clock."""
        return self.cuda_event_times_ms or self.step_times_ms

    def compile_seconds(self) -> float:
        """Warm-up time beyond what the same number of steady steps takes."""
        steady = statistics.median(self.step_times_ms) * len(self.warmup_times_ms)
        return max(0.0, sum(self.warmup_times_ms) - steady) / 1e3

    def summary(self) -> dict[str, float]:
        """Mean/median/std/min/max of :attr:`step_ms`, in ms."""
        times = self.step_ms
        return {
            "mean_ms": statistics.fmean(times),
            "median_ms": statistics.median(times),
            # Sample standard deviation; 0 for a single step.
            "std_ms": statistics.stdev(times) if len(times) > 1 else 0.0,
            "min_ms": min(times),
            "max_ms": max(times),
        }


def run_steps(
    step: Step,
    *,
    warmup: int,
    steps: int,
    device: torch.device,
    before_measure: Callable[[], None] | None = None,
    after_measure: Callable[[], None] | None = None,
    op_ranges: str = "off",
    before_step: Callable[[], None] | None = None,
) -> Measurement:
    """Run ``warmup`` unmeasured then ``steps`` measured calls of ``step`` on ``device``.

    ``before_measure`` / ``after_measure`` run just outside the measured region (e.g. GPU
    state snapshots), so they cost the steps nothing and stay out of the capture.
    ``op_ranges`` (off / on / shapes): PyTorch's op ranges around the measured steps.
    ``before_step`` starts every warm-up and measured step, inside its time (a distributed
    rank marks its step's start there, workloads/parallel.py).
    """
    begin = before_step or (lambda: None)
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    on_cuda = device.type == "cuda"

    warmup_ms: list[float] = []
    for _ in range(warmup):
        start = time.perf_counter()
        with rng("warmup"):
            begin()
            step()
            synchronize(device)
        warmup_ms.append((time.perf_counter() - start) * 1e3)
    if before_measure is not None:
        before_measure()

    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times_ms: list[float] = []
    event_pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    loss_tensors: list[torch.Tensor] = []
    sync_waits: list[float] = []

    with op_range_context(op_ranges, device):
        entering = time.perf_counter()
        if on_cuda:
            torch.cuda.profiler.start()
        with rng(PROFILED_REGION):
            entered = time.perf_counter()
            for _ in range(steps):
                with rng("profiled_step"):
                    start_event = _record_event() if on_cuda else None
                    start = time.perf_counter()
                    begin()
                    loss = step()
                    end_event = _record_event() if on_cuda else None
                    issued = time.perf_counter()
                    synchronize(device)
                    done = time.perf_counter()
                    times_ms.append((done - start) * 1e3)
                    if on_cuda:
                        sync_waits.append((done - issued) * 1e3)
                if start_event is not None and end_event is not None:
                    event_pairs.append((start_event, end_event))
                if loss is not None:
                    # Kept as tensors: .item() here would add a device-to-host copy per step.
                    loss_tensors.append(loss.detach())
            leaving = time.perf_counter()
        if on_cuda:
            torch.cuda.profiler.stop()
        left = time.perf_counter()
    if after_measure is not None:
        after_measure()

    # after the measured region: a snapshot of the allocator's segments costs no step time
    memory = peak_memory(device) if on_cuda else {}
    return Measurement(
        **memory,
        warmup_times_ms=warmup_ms,
        region_ms={"enter": round((entered - entering) * 1e3, 3),
                   "exit": round((left - leaving) * 1e3, 3)},
        step_times_ms=times_ms,
        losses=[float(loss) for loss in loss_tensors],
        cuda_event_times_ms=[start.elapsed_time(end) for start, end in event_pairs],
        sync_wait_ms=sync_waits,
    )


def peak_memory(device: torch.device) -> dict[str, int]:
    """The measured steps' peak: allocated, reserved, and what the step held (allocated plus
    the free bytes of CUDA graphs' private pools: a graph replays into its whole pool)."""
    pool_total, pool_free = graph_pools(device)
    allocated = torch.cuda.max_memory_allocated(device)
    return {"peak_memory_bytes": allocated + pool_free, "peak_allocated_bytes": allocated,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
            "cuda_graph_pool_bytes": pool_total}


def graph_pools(device: torch.device) -> tuple[int, int]:
    """(reserved, of it free) bytes of the device's CUDA-graph private pools."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = free = 0
    for segment in torch.cuda.memory._snapshot()["segments"]:
        if segment["device"] == index and tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0):
            total += segment["total_size"]
            free += segment["total_size"] - segment["allocated_size"]
    return total, free


def _record_event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
