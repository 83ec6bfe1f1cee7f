"""Timing records with known step-time distributions, for the statistics tests.

A record is made by the workloads' own record code (workloads/__main__.py `Record`, the code
that writes every run's JSON) from a parsed `python -m workloads` command line; only its step
times are drawn, from a normal distribution with a fixed seed. The statistics downstream
(CIs, verdicts, significance, flags) then see the same input on every machine, and the
expected outcome follows from the distributions, not from this CPU's noise.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workloads.__main__ import Record, build_parser
from workloads.runner import Measurement
from workloads.steps import Workload

NO_GPU = {"available": False, "reason": "device is cpu, not a GPU"}


def normal_processes(seed: int, mean_ms: float, sd_ms: float, processes: int,
                     steps: int) -> list[list[float]]:
    """Per-process step times drawn from N(mean_ms, sd_ms), never below a tenth of the mean."""
    gen = np.random.default_rng(seed)
    draws = gen.normal(mean_ms, sd_ms, (processes, steps)).clip(min=mean_ms / 10)
    return [list(map(float, row)) for row in draws]


def record(command: str, step_ms: Sequence[float]) -> dict[str, Any]:
    """The result JSON `python -m workloads <command>` writes when its measured steps took
    `step_ms` (ms each) on this CPU."""
    args = build_parser().parse_args([*shlex.split(command), "--device", "cpu"])
    rec = Record(args, torch.device("cpu"), memory_limited=False)
    workload = Workload(step=lambda: None, tokens_per_step=1, params_count=0, forward_flops=0,
                        flops_per_step=0)
    rec.succeed(workload, Measurement(step_times_ms=list(step_ms)), NO_GPU)
    return rec.result


def write_timing(run_dir: Path, command: str, per_process: Sequence[Sequence[float]]) -> None:
    """`<run_dir>/timing/r<i>.json`, one untraced process per entry of `per_process`."""
    (run_dir / "timing").mkdir(parents=True, exist_ok=True)
    for i, steps in enumerate(per_process):
        path = run_dir / "timing" / f"r{i}.json"
        path.write_text(json.dumps(record(command, steps), indent=2) + "\n")
