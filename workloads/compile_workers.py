"""Inductor's compile worker processes, stopped once a workload's result is written.

A compiled run starts a pool of compile workers (``torch/_inductor/compile_worker``) and, at
exit, Inductor's atexit handler waits up to 300 s for them to shut down (with torch 2.11 on
an H100, a GPT 2.7B ``adamw_master`` timing process can wait there for minutes after writing
its measurement, long enough for a job's time limit to lose the result). The workers have no
work left once the result is written, so the workload stops them itself; their exit cannot
change a number already recorded.
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

