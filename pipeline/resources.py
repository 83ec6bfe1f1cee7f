"""What a GPU job reserves on a cluster: host memory and wall time from the run's size and mode.

GPU jobs declare `gpu`, the whole GPUs they use: one (calibrate, time_run, profile), or one per
rank (a distributed run's jobs); on one machine each job's guard takes that many GPUs of its
own (pipeline/gpus.py, rules/common.smk), on a cluster Slurm does. Analysis jobs declare none.
`mem_mb` (host RAM) and `runtime` (minutes) tell a cluster what to reserve: generous estimates
from the run's size and mode, doubled on a retry and never above the guard's own limit
(timeout_min, plus start-up and the nsys export), so the guard, not Slurm, ends a run that
hangs. A site overrides them with --set-resources; each GPU job's `benchmark:` file records its
seconds and max_rss (docs/cluster.md).
"""

from __future__ import annotations

from typing import Any

from workloads import models

# What a job of a workload that does not say (its module's `needs`) reserves: attention,
# attention_core, sleep and calibrate are a few kernels, dominated by start-up.
SMALL_JOB_NEEDS = (8000, 10)
MODE_TIME_FACTOR = {"forward": 1.0, "forward_backward": 2.0, "train": 3.0}
DEFAULT_STEPS = 15  # warm-up + measured steps the size table assumes
COMPILE_MIN = 10  # torch.compile's warm-up compilation
JOB_OVERHEAD_MIN = 10  # process start-up and nsys' SQLite export
TORCHRUN_MIN = 2  # rendezvous and the ranks' process-group set-up


def run_needs(params: dict[str, Any] | None) -> tuple[float, float]:
    """(host MB, minutes) a GPU job of a run with ``params`` needs; ``None``: no run
    (calibrate)."""
    if params is None:
        return SMALL_JOB_NEEDS
    mem_mb, minutes = SMALL_JOB_NEEDS
    module = models.registry()[params["workload"]]
    if hasattr(module, "needs"):  # for the default 5 warm-up + 10 measured steps, forward
        mem_mb, minutes = module.needs(models.options_of(params["workload"], params))
    minutes *= MODE_TIME_FACTOR.get(params.get("mode", "forward"), 1.0)
    minutes *= max(1.0, (params.get("warmup", 0) + params.get("steps", 0)) / DEFAULT_STEPS)
    if params.get("compile", "off") != "off":
        minutes += COMPILE_MIN
    # a distributed run: one process (and its host memory) per rank, plus torchrun's start-up
    ranks = params.get("gpus", 1) if params.get("parallel", "none") != "none" else 1
    return mem_mb * ranks, minutes + (TORCHRUN_MIN if ranks > 1 else 0)


def job_mem_mb(params: dict[str, Any] | None, attempt: int) -> int:
    """Host memory (MB) of a GPU job, doubled on each retry."""
    return int(run_needs(params)[0] * attempt)


def job_runtime_min(params: dict[str, Any] | None, attempt: int, timeout_min: float) -> int:
    """Wall time (minutes) of a GPU job, doubled on each retry, at most the guard's limit."""
    minutes = (run_needs(params)[1] + JOB_OVERHEAD_MIN) * attempt
    return int(min(minutes, timeout_min + JOB_OVERHEAD_MIN))
