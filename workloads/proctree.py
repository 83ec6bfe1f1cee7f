"""Processes below a process, from /proc (Linux; none elsewhere), and stopping Inductor's
compile workers once a workload's result is written: Inductor's exit handler may wait up to
300 s for them (a 2.7B timing process waited long enough for its time limit to lose its
result), and their exit cannot change a number already recorded. No torch: the guard uses it.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from pathlib import Path

COMPILE_WORKER = "compile_worker"  # in every compile worker's command line (pool and children)


def descendants(roots: set[int]) -> set[int]:
    """Every live process below ``roots``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(text[text.rfind(")") + 2:].split()[1]), []).append(
            int(stat.parent.name))
    found: set[int] = set()
    todo = list(roots)
    while todo:
        new = set(children.get(todo.pop(), [])) - found - roots
        found |= new
        todo += new
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` has not exited (a zombie has: its parent reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def compile_workers() -> list[int]:
    """This process's descendants that are Inductor compile workers."""
    found = []
    for pid in descendants({os.getpid()}):
        with suppress(OSError):  # gone meanwhile
            if COMPILE_WORKER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def stop_compile_workers(grace_s: float = 5.0) -> list[int]:
    """SIGTERM this process's compile workers, SIGKILL what is left after ``grace_s``; the
    pids stopped."""
    workers = compile_workers()
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in workers:
            with suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(alive(pid) for pid in workers):
            time.sleep(0.05)
    return workers
