"""The host CPU's speed around the measured steps: the same pure-Python loop, timed.

A launch-bound step (its host issues work more slowly than the GPU runs it) lasts as long as
its host takes, so on a machine whose CPU speed drifts (virtual CPUs beside other tenants,
frequency scaling) its time drifts with it, from step to step and from process to process.
Measured on a 16-vCPU H100 virtual machine with nothing else running: this loop's body run
150,000 times took between 11.7 and 20.8 ms (median of 40 runs) within a minute, and GPT
small's bf16 eager step (host-bound: the host waited 0.1 ms of a 54-92 ms step for the GPU)
moved with it.
Timed before and after the measured steps (never inside them), it lets the summary tell a
host whose speed moved (``cpu_probe_spread``) from a workload that did."""

from __future__ import annotations

import statistics
import time

ROUNDS = 5
LOOP = 20_000  # about 1.5-3 ms per round on the CPUs measured


def _interpret() -> int:
    total = 0
    for i in range(LOOP):
        total += i * i % 7
    return total


def probe_ms(rounds: int = ROUNDS) -> float:
    """Median time (ms) of ``rounds`` runs of the fixed loop on this thread."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        _interpret()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


__all__ = ["probe_ms"]
