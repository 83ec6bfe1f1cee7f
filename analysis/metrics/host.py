"""Whether the host set a run's step time, and whether the host's speed moved meanwhile.

From the untraced timing records (workloads/runner.py, workloads/cpuprobe.py):

* ``host_bound_share``: 1 - the share of the step the host spent waiting for the GPU in the
  step's closing synchronize (median over steps, then over processes). Near 1, the GPU was
  done as soon as the host had issued the step's last work: the step lasted as long as the
  host took to issue it (a launch-bound step), so its time is the CPU's as much as the GPU's.
  None on a CPU run (no synchronize to wait in) or in records made before it was recorded.
* ``cpu_probe_spread``: (slowest - fastest) / fastest over every CPU probe of every process
  (a fixed pure-Python loop timed before and after each process's measured steps): how much
  the host's own speed moved during the run.

A host-bound step on a host whose speed moved has a wide CI for a reason no repeat removes;
the flags and the unstable-timing finding say so.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

HOST_BOUND_SHARE = 0.9  # the host waited for the GPU in under a tenth of the step
CPU_SPEED_VARIED = 0.10  # the probes' slowest over their fastest, minus one


def _waited_share(record: dict[str, Any]) -> float | None:
    waits = record.get("sync_wait_ms") or []
    steps = record.get("step_times_ms") or []
    shares = [w / s for w, s in zip(waits, steps, strict=False) if s > 0]
    return statistics.median(shares) if shares else None


def host_bound_share(records: Iterable[dict[str, Any]]) -> float | None:
    """1 - the median over processes of the median share of a step spent waiting on the GPU."""
    waited = [w for w in map(_waited_share, records) if w is not None]
    return 1 - statistics.median(waited) if waited else None


def cpu_probe_spread(records: Iterable[dict[str, Any]]) -> float | None:
    """(slowest - fastest) / fastest over every probe of every process; None without two."""
    probes = [v for r in records for v in (r.get("cpu_probe_ms") or {}).values()
              if isinstance(v, int | float) and v > 0]
    if len(probes) < 2:
        return None
    return max(probes) / min(probes) - 1


def host_flags(share: float | None, spread: float | None) -> list[str]:
    """``host_bound`` (the step's time is the host's) and, for such a step only (where the
    host's speed is the step's), ``cpu_speed_varied`` (it moved during the run)."""
    if share is None or share < HOST_BOUND_SHARE:
        return []
    if spread is not None and spread > CPU_SPEED_VARIED:
        return ["host_bound", "cpu_speed_varied"]
    return ["host_bound"]


__all__ = ["CPU_SPEED_VARIED", "HOST_BOUND_SHARE", "cpu_probe_spread", "host_bound_share",
           "host_flags"]
