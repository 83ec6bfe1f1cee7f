"""The ``process`` section of a result record: what this workload process started from,
read before any device work and changing nothing the workload uses (docs/timing.md, "What
repeats share"); tests/test_warm.py compares it between repeats and launchers.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from workloads.contract import LAUNCHER_ENV


def at_start() -> dict[str, Any]:
    """This process and its state before the workload runs."""
    numpy = sys.modules.get("numpy")
    return {
        "pid": os.getpid(),
        "parent_pid": os.getppid(),
        "launcher": os.environ.get(LAUNCHER_ENV, "process"),
        # differs between interpreters unless PYTHONHASHSEED is set (a forked child keeps its
        # server's): tells repeats from different interpreters apart
        "str_hash": hash("profbench"),
        "cuda_initialized": torch.cuda.is_initialized(),
        # the caching allocator's bytes, only if CUDA already exists (reading would create it)
        "cuda_memory": {"allocated": torch.cuda.memory_allocated(),
                        "reserved": torch.cuda.memory_reserved()}
        if torch.cuda.is_initialized() else None,
        "inductor_code_cache_modules": _inductor_modules(),
        "dynamo_frame_counts": _dynamo_frame_counts(),
        "python_random_draw": random.random(),
        "numpy_random_draw": None if numpy is None else float(numpy.random.random()),
        "torch_initial_seed": torch.initial_seed(),
        "torch_rng_digest": hashlib.sha256(bytes(
            torch.default_generator.get_state().tolist())).hexdigest()[:16],
    }


def started_unix() -> float:
    """When this process began (a forked child: its fork), Unix time to ~10 ms, from its
    age in /proc (start ticks against the system's uptime)."""
    after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    start_ticks = int(after_name[19])  # field 22, starttime (the name is field 2)
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return round(time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK")), 3)


def mark(section: dict[str, Any], moment: str) -> None:
    """Note when this process reached ``moment`` (Unix time) in the section's timeline
    (benchmarks/job_overhead.py turns the marks into where a job's seconds went)."""
    now = round(time.time(), 3)
    if "timeline_unix" not in section:  # the first mark: when the process began, once
        section["timeline_unix"] = {"started": started_unix()}
    section["timeline_unix"][moment] = now


def after_build() -> dict[str, Any]:
    """A draw from a copy of torch's default generator, as the workload's seeding and build
    left it (the same in every repeat of a run: each starts from its seed)."""
    generator = torch.Generator()
    generator.set_state(torch.default_generator.get_state())
    return {"torch_draw_after_build": float(torch.rand(1, generator=generator))}


def _inductor_modules() -> int:
    """Modules in Inductor's in-memory code cache (0 when Inductor was never imported)."""
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is None:
        return 0
    cache = codecache.PyCodeCache
    return len(getattr(cache, "modules", [])) + len(getattr(cache, "modules_no_attr", {}))


def _dynamo_frame_counts() -> int:
    """Dynamo's frame counters (frames seen, compiled): 0 when it has compiled nothing."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0
    return sum(utils.counters["frames"].values())
