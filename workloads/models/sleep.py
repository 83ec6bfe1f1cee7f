"""A step that sleeps ``step_ms`` and computes nothing: a step time known in advance.

``python -m workloads sleep --step_ms X``: each step sleeps X ms. Its step
time is known in advance and no CPU noise can reverse an ordering of two of them (10 ms vs
40 ms per step): the tests use it where a pipeline run needs a real, certain difference
(docs/workloads.md). It runs through the same runner as every workload, so its steps sit in
the same NVTX ranges (``warmup``, ``profiled_region``, ``profiled_step``) and its record is an
ordinary result JSON; inside each step one ``sleep`` range holds the sleep. Compile must stay
off; dtype and sdpa_backend have nothing to act on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

RANGE = "sleep"
# its batch changes nothing the step holds: `batch: max` is refused (pipeline/config.py)
BATCH_SETS_MEMORY = False


@dataclass
class Options:
    step_ms: float = field(default=10.0, metadata={
        "help": "milliseconds each step sleeps", "minimum": 0, "required": True})
    batch: int = field(default=1, metadata={
        "help": "accepted like every run's batch key: tokens per step, nothing else",
        "minimum": 1})
    # what the record and the summary line call its one mode
    mode: Literal["step"] = field(default="step", metadata={"fixed": True})


def build(options: Options, run: Any) -> Any:
    """A step that sleeps ``options.step_ms``; the shared settings that change what a step
    computes (dtype, sdpa backend) have nothing to act on; compiling or capturing it is an
    error."""
    import time

    from workloads.nvtx_ranges import rng
    from workloads.steps import Workload

    if run.speed.compile != "off" or run.speed.cuda_graph != "off":
        raise ValueError("sleep: --compile and --cuda-graph must be off (there is nothing to "
                         "compile or capture)")
    seconds = options.step_ms / 1e3

    def step() -> None:
        with rng(RANGE):
            time.sleep(seconds)

    return Workload(step=step, tokens_per_step=options.batch, params_count=0, forward_flops=0,
                    flops_per_step=0)


def kernels_per_step(options: Options, dtype: str) -> int:
    """A sleep launches no kernel."""
    return 0


def summary(options: Options) -> str:
    """The summary line's name of a sleep run."""
    return f"sleep {options.step_ms:g} ms"
