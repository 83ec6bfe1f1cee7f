"""The device lock of a capture (docs/timing.md, "Whole GPUs per job"): the guard names the
lock file of the job's GPU (``PROFBENCH_DEVICE_LOCK``); the capture holds it from before its
first CUDA call until it exits (the kernel drops it then, also on a kill), and first waits
until what an earlier process left on the GPU is released. Standard library at import.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

ENV_DEVICE_LOCK = "PROFBENCH_DEVICE_LOCK"
# Vacated: at most this much of the GPU's memory held by anything but this process.
VACATED_SLACK_BYTES = 2 << 30
VACATED_WAIT_S = 60.0  # then it goes on, and its record says so


def hold_device(device: Any, process: dict[str, Any]) -> float | None:
    """Take the lock this process was started with, if any (blocking), then wait until the GPU
    is vacated; seconds waited, or None without a lock. `process` (the record's section) gets
    the marks ``device`` and ``vacated``, and ``vacated_wait_timed_out`` if it gave up."""
    path = os.environ.pop(ENV_DEVICE_LOCK, None)  # not inherited by what this process starts
    if not path:
        return None
    import torch

    from workloads import process_state

    start = time.monotonic()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # fd stays open: held until this process exits
    process_state.mark(process, "device")
    deadline = time.monotonic() + VACATED_WAIT_S
    while device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)  # creates this process's context
        if total - free <= VACATED_SLACK_BYTES:
            break
        if time.monotonic() > deadline:
            process["vacated_wait_timed_out"] = True
            break
        time.sleep(0.01)
    process_state.mark(process, "vacated")
    return round(time.monotonic() - start, 4)
