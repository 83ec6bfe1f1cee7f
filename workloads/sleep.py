"""``python -m workloads sleep --step_ms X``: a step that sleeps X ms and computes nothing.

Its step time is known in advance and no CPU noise can reverse an ordering of two of them
(10 ms vs 40 ms per step): the tests use it where a pipeline run needs a real, certain
difference (docs/workloads.md). It runs through the same runner as every workload, so its
steps sit in the same NVTX ranges (``warmup``, ``profiled_region``, ``profiled_step``) and its
record is an ordinary result JSON; inside each step one ``sleep`` range holds the sleep.
"""

import argparse
import time
from collections.abc import Callable
from typing import Any

from workloads.nvtx_ranges import rng
from workloads.steps import Workload

RANGE = "sleep"


def add_arguments(parser: argparse.ArgumentParser, flag: Callable[..., None]) -> None:
    """The sleep workload's own options (``flag`` adds both spellings of one)."""
    flag(parser, "step_ms", type=_non_negative_ms, default=10.0, help="sleep per step (ms)")
    flag(parser, "batch", type=_positive, default=1,
         help="accepted like every run's batch key: tokens per step, nothing else")
    parser.set_defaults(mode="step")  # what the record and summary line call its one mode


def build(args: argparse.Namespace) -> Workload:
    """A step that sleeps ``args.step_ms``; the common options that change what a step
    computes (dtype, sdpa backend) have nothing to act on; compiling or capturing it is an
    error."""
    if args.compile != "off" or args.cuda_graph != "off":
        raise ValueError("sleep: --compile and --cuda-graph must be off (there is nothing to "
                         "compile or capture)")
    seconds = args.step_ms / 1e3

    def step() -> None:
        with rng(RANGE):
            time.sleep(seconds)

    return Workload(step=step, tokens_per_step=args.batch, params_count=0, forward_flops=0,
                    flops_per_step=0)


def variant(params: dict[str, Any]) -> str:
    """The summary line's name of a sleep run."""
    return f"sleep {params['step_ms']:g} ms"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_ms(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 ms, got {text}")
    return value
