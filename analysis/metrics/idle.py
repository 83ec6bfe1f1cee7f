"""GPU idle time split by cause, the way HTA's idle-time breakdown does it.

Per device, the GPU operations (kernels, memcpys, memsets) are merged into their busy union;
every gap of that union (time inside the device's span with nothing running) is given one
cause from the operations on either side of it:

* ``memory``: the op before or after the gap is a memcpy / memset (the GPU waits on a copy
  being set up, a host sync around it, or pageable staging);
* ``host``: the next op's launching CUDA API call (same correlationId, joined with
  :func:`analysis.reports.nvtx.match_runtime`, as ``phases.py`` does) ended after the previous
  op ended: the GPU ran dry waiting for the CPU to launch work (launch-bound);
* ``dependency``: the next op was already launched when the previous one ended (a stream
  or event dependency, a sync, or a kernel whose launch row was not found).

The three add up to ``span - busy`` per device (``utilization_table``'s idle time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.reading.export import Export
from analysis.reports.fmt import Table
from analysis.reports.nvtx import match_runtime

CAUSES: tuple[str, ...] = ("host", "dependency", "memory")
HEADER = ["device", "cause", "idle_ns", "gaps", "span_ns", "share_of_span", "share_of_idle"]


@dataclass
class IdleBreakdown:
    """Idle ns and gap count per (device, cause), and the device's span."""

    span_ns: dict[int, int]
    idle_ns: dict[tuple[int, str], int]
    gaps: dict[tuple[int, str], int]

    def total(self, cause: str) -> int:
        return sum(v for (_, c), v in self.idle_ns.items() if c == cause)


def _ops(ex: Export) -> dict[str, np.ndarray]:
    """All GPU ops with device, memory-op flag and the end of their launching API call."""
    k, mc, ms = ex.kernels(launch_config=True), ex.memcpy(), ex.memset()
    nk, nmem = k["start"].size, mc["start"].size + ms["start"].size
    corr = np.concatenate([k["correlationId"], mc["correlationId"], ms["correlationId"]])
    gpid = np.concatenate([k["globalPid"], mc["globalPid"], ms["globalPid"]])
    launch_end = np.full(corr.size, -1, np.int64)
    if corr.size:
        rt = ex.runtime()
        api = match_runtime(rt["correlationId"], rt["globalTid"], corr, gpid)
        found = api >= 0
        launch_end[found] = rt["end"][api[found]]
    return {
        "start": np.concatenate([k["start"], mc["start"], ms["start"]]).astype(np.int64),
        "end": np.concatenate([k["end"], mc["end"], ms["end"]]).astype(np.int64),
        "device": np.concatenate([k["deviceId"], mc["deviceId"], ms["deviceId"]]),
        "memory": np.r_[np.zeros(nk, bool), np.ones(nmem, bool)],
        "launch_end": launch_end,
    }


def _device_gaps(
    start: np.ndarray, end: np.ndarray, memory: np.ndarray, launch_end: np.ndarray
) -> tuple[int, dict[str, tuple[int, int]]]:
    """(span, cause -> (idle ns, gaps)) of one device's ops."""
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    mem, launched = memory[order], launch_end[order]
    reach = np.maximum.accumulate(e)
    # the op that holds the running max end: the op "before" each gap
    holder = np.maximum.accumulate(np.where(e == reach, np.arange(e.size), 0))
    gap = s[1:] - reach[:-1]
    idx = np.flatnonzero(gap > 0)  # gap before op idx+1
    nxt, prev = idx + 1, holder[idx]
    size = gap[idx]
    is_mem = mem[nxt] | mem[prev]
    is_host = ~is_mem & (launched[nxt] > reach[idx])
    masks = {"memory": is_mem, "host": is_host, "dependency": ~is_mem & ~is_host}
    out = {c: (int(size[m].sum()), int(m.sum())) for c, m in masks.items()}
    return int(reach[-1] - s[0]), out


def idle_breakdown(ex: Export) -> IdleBreakdown:
    """Idle time per device and cause for one export (empty when it has no GPU ops)."""
    ops = _ops(ex)
    result = IdleBreakdown({}, {}, {})
    for dev in np.unique(ops["device"]).tolist():
        sel = ops["device"] == dev
        span, causes = _device_gaps(
            ops["start"][sel], ops["end"][sel], ops["memory"][sel], ops["launch_end"][sel]
        )
        result.span_ns[int(dev)] = span
        for cause, (ns, n) in causes.items():
            result.idle_ns[(int(dev), cause)] = ns
            result.gaps[(int(dev), cause)] = n
    return result


def idle_table(ex: Export) -> tuple[Table, dict[str, int | None]]:
    """``idle_time.csv`` and the metrics.json numbers (summed over devices)."""
    b = idle_breakdown(ex)
    rows = []
    for dev, span in sorted(b.span_ns.items()):
        idle = sum(b.idle_ns[(dev, c)] for c in CAUSES)
        for cause in CAUSES:
            ns = b.idle_ns[(dev, cause)]
            rows.append([
                str(dev), cause, str(ns), str(b.gaps[(dev, cause)]), str(span),
                f"{ns / span:.6f}" if span else "", f"{ns / idle:.6f}" if idle else "",
            ])  # fmt: skip
    has = bool(b.span_ns)
    metrics = {f"idle_{c}_ns": (b.total(c) if has else None) for c in CAUSES}
    return Table(HEADER, rows), metrics


__all__ = ["CAUSES", "IdleBreakdown", "idle_breakdown", "idle_table"]
