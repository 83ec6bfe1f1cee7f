"""Inductor's compile workers, stopped once a workload's result is written: Inductor's exit
handler may wait up to 300 s for them (a 2.7B timing process waited minutes, long enough for a
time limit to lose its result), and their exit cannot change a number already recorded.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from workloads.proctree import alive, descendants

MARKER = "compile_worker"  # in every compile worker's command line (pool and its children)


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def compile_workers() -> list[int]:
    """This process's descendants that are Inductor compile workers (none without /proc)."""
    return [pid for pid in descendants({os.getpid()}) if MARKER in _command_line(pid)]


def stop_compile_workers(grace_s: float = 5.0) -> list[int]:
    """SIGTERM this process's compile workers, SIGKILL what is left after ``grace_s``;
    return the pids that were stopped."""
    workers = compile_workers()
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in workers:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(alive(pid) for pid in workers):
            time.sleep(0.05)
    return workers

