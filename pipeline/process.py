"""Launching one command in a process group of its own, its output streamed through and its
last lines kept, and stopping it (its group and every process below it) on a timeout, a
request of the caller or a signal to the guard. The command is a subprocess.Popen or a child
of a warm parent (warm.Child): both lead their own group and have ``wait``.
"""

from __future__ import annotations

import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import IO, Any

from workloads.proctree import alive, descendants

TAIL_LINES = 200  # kept from the output, to judge a failure
POLL_S = 0.5  # how often `watch` looks at a running command
KILL_WAIT_S = 5.0  # how long SIGKILLed processes may take to go
PR_SET_CHILD_SUBREAPER = 36
_ADOPTED: list[int] = []  # this process's pid, once it adopts its commands' orphans


def adopt_orphans() -> None:
    """Become the subreaper of the commands' trees: a process whose parent died (a rank whose
    torchrun was killed) is still found below the guard. Not for a guard that may start a
    warm parent: that outlives the job."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        _ADOPTED.append(os.getpid())


class Running:
    """A started command: its process (Popen or warm.Child), output pumps and clocks; once
    `wait` returns, how it ended: returncode (< 0: its signal), elapsed_s (from its start:
    its timeout's clock), timed_out, stopped (because `watch` asked)."""

    def __init__(self, proc: Any, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.proc, self.pid = proc, proc.pid
        self.start, self.started_unix = time.monotonic(), round(time.time(), 3)
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.pumps = [threading.Thread(target=self._pump, args=pipes, daemon=True)
                      for pipes in ((stdout, sys.stdout.buffer), (stderr, sys.stderr.buffer))]
        for pump in self.pumps:
            pump.start()

    def _pump(self, source: IO[bytes], sink: IO[bytes] | None) -> None:
        for line in iter(source.readline, b""):
            self.tail.append(line.decode("utf-8", "replace").rstrip("\n"))
            try:
                if sink is not None:
                    sink.write(line)
                    sink.flush()
            except OSError:  # our reader went away: drain on, or the command blocks
                sink = None
        source.close()

    def signal(self, signum: int) -> None:
        """`signum` to the command's group and every process below it (torchrun starts each
        rank in a session of its own) and below the guard, if it adopted orphans."""
        for pid in [-self.pid, *descendants({self.pid, *_ADOPTED})]:
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def stop(self, signum: int, grace_s: float) -> None:
        """`signum`, then SIGKILL after `grace_s`; returns once nothing of it runs."""
        self.signal(signum)
        with suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace_s)
        self.signal(signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + KILL_WAIT_S
        while (any(alive(p) for p in descendants({self.pid, *_ADOPTED}))
               and time.monotonic() < deadline):
            time.sleep(0.05)

    def wait(self, timeout_s: float | None, grace_s: float,
             watch: Callable[[Running], bool]) -> Running:
        """Wait for the end, stopping the command past `timeout_s` (SIGTERM, SIGKILL after
        `grace_s`) or when `watch`, asked every POLL_S, says so; this, ended."""
        deadline = float("inf") if timeout_s is None else self.start + timeout_s
        timed_out = stopped = False
        while not timed_out and not stopped:
            try:
                self.proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                timed_out = time.monotonic() >= deadline
                stopped = not timed_out and watch(self)
        if timed_out or stopped:
            self.stop(signal.SIGTERM, grace_s)
        for pump in self.pumps:  # processes that outlive the command, holding its pipes, go
            pump.join(timeout=5)
            if pump.is_alive():
                self.signal(signal.SIGKILL)
                pump.join()
        if lost := getattr(self.proc, "lost", None):
            self.tail.append(f"guard: {lost}")
        self.returncode, self.timed_out, self.stopped = self.proc.returncode, timed_out, stopped
        self.elapsed_s = round(time.monotonic() - self.start, 3)
        return self


def start(cmd: list[str]) -> Running:
    """`cmd` as a process in a session of its own; OSError when it cannot start."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    return Running(proc, proc.stdout, proc.stderr)  # type: ignore[arg-type]
