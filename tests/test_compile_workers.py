"""A workload stops Inductor's compile workers once its result is written (they once held a
2.7B run in Inductor's exit handler for minutes) and leaves every other child alone."""

from __future__ import annotations

import subprocess
import sys
import time

from workloads.proctree import compile_workers, stop_compile_workers

SLEEP = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


def start(*marker: str) -> subprocess.Popen:
    """A child that ignores SIGTERM (as a stuck worker would); `marker` goes on its argv."""
    return subprocess.Popen([sys.executable, "-c", SLEEP, *marker])


def test_compile_workers_are_stopped_and_other_children_are_not() -> None:
    worker, other = start("torch/_inductor/compile_worker/__main__.py"), start("--other")
    try:
        time.sleep(0.5)  # both have exec'd: their command lines are theirs
        assert compile_workers() == [worker.pid]
        assert stop_compile_workers(grace_s=1.0) == [worker.pid]
        assert worker.wait(timeout=30) == -9  # SIGTERM ignored: killed after the grace
        assert other.poll() is None and compile_workers() == []
    finally:
        for proc in (worker, other):
            proc.kill()
            proc.wait()

