"""The start gate of a timing repeat: start while the previous repeat exits, measure after.

A run's timing repeats are processes one after another (pipeline/guard.py, ``--repeats``).
Each pays its CUDA context at the start (~0.35 s on the H100) and its teardown at the end
(~0.2 s). The guard therefore starts repeat i+1 as soon as repeat i has written its record
(its measurement is over), with ``PROFBENCH_START_GATE`` naming a gate file. The new process
creates its CUDA context, and nothing else, while repeat i exits; then it waits here until
the guard has reaped repeat i and opened the gate (created the file). Only then does it build
its model: its first allocation, warm-up and measurement run on a GPU that holds no other
repeat's process, as before. Standard library only at import: the guard imports this module.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from workloads.proctree import alive

ENV_GATE = "PROFBENCH_START_GATE"  # "<gate file>:<guard pid>"
POLL_S = 0.002  # between looks at the gate: the wait ends within this of the guard opening it
GUARD_CHECK_EVERY = 50  # looks: is the guard still there (0.1 s)


class GateAbandoned(RuntimeError):
    """The guard that would open the gate is gone: nothing will ever open it."""


def honours_gate(cmd: list[str]) -> bool:
    """Whether `cmd` waits at a start gate: a workload process (``<python> -m workloads``)."""
    return cmd[1:3] == ["-m", "workloads"]


def gate_value(path: Path, guard_pid: int) -> str:
    """The variable's value for a process the guard at `guard_pid` lets through `path`."""
    return f"{path}:{guard_pid}"


def open_gate(path: Path) -> None:
    """Let the waiting process go on (the previous repeat has been reaped)."""
    path.touch()


def pass_gate(device: Any, process: dict[str, Any]) -> float | None:
    """Wait at the gate this process was started with, if any, having created the device's
    CUDA context first; seconds waited, or None without a gate. The variable is removed,
    so nothing this process starts (compile workers) inherits it. `process` (the record's
    ``process`` section) gets the timeline marks ``context`` and ``gate``."""
    value = os.environ.pop(ENV_GATE, None)
    if not value:
        return None
    from workloads import process_state  # torch: only in a workload process

    path, _, guard = value.rpartition(":")
    if device.type == "cuda":
        import torch

        torch.cuda.mem_get_info(device)  # creates the context; allocates nothing
    process_state.mark(process, "context")
    start = time.monotonic()
    gate = Path(path)
    looks = 0
    while not gate.exists():
        looks += 1
        if looks % GUARD_CHECK_EVERY == 0 and not alive(int(guard)):
            raise GateAbandoned(f"the guard (pid {guard}) that would open {path} is gone")
        time.sleep(POLL_S)
    process_state.mark(process, "gate")
    return round(time.monotonic() - start, 4)


# --- the device lock: captures side by side -------------------------------------------------
# A capture holds its GPU's lock (one file per GPU the guard assigned, pipeline/gpus.py) from
# before its first CUDA call until it exits, and first waits for what an earlier process left
# on the GPU to be released.
ENV_DEVICE_LOCK = "PROFBENCH_DEVICE_LOCK"  # the lock file of the GPU the guard assigned
# The GPU counts as vacated when at most this much of its memory is held by anything but the
# new process (a context being torn down, a desktop): the lock's holder is gone by then.
VACATED_SLACK_BYTES = 2 << 30
VACATED_WAIT_S = 60.0  # then it goes on and its record says so


def hold_device(device: Any, process: dict[str, Any]) -> float | None:
    """Take the device lock this process was started with, if any (blocking), then wait until
    the previous holder's memory is back; seconds waited in all, or None without a lock.
    Held until this process exits (the kernel releases it). `process` gets the marks
    ``device`` (lock taken) and ``vacated``, and ``vacated_wait_timed_out`` if it gave up."""
    path = os.environ.pop(ENV_DEVICE_LOCK, None)
    if not path:
        return None
    import fcntl

    from workloads import process_state

    start = time.monotonic()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # fd stays open: the lock is held until this process exits
    process_state.mark(process, "device")
    if device.type == "cuda" and not _wait_until_vacated(device):
        process["vacated_wait_timed_out"] = True
    process_state.mark(process, "vacated")
    return round(time.monotonic() - start, 4)


def _wait_until_vacated(device: Any) -> bool:
    """Whether the GPU's memory, but for VACATED_SLACK_BYTES, came free within VACATED_WAIT_S
    (the previous capture's process frees its memory as it exits)."""
    import torch

    deadline = time.monotonic() + VACATED_WAIT_S
    while True:
        free, total = torch.cuda.mem_get_info(device)  # creates this process's context
        if total - free <= VACATED_SLACK_BYTES:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
