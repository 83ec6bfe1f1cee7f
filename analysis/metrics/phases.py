"""GPU time per phase (forward / loss / backward / optimizer) and per layer or sublayer range.

nsys projects an NVTX range only onto GPU work launched by the thread that pushed it
(``nvtx_gpu_proj_sum``). PyTorch's autograd runs backward on its own thread, so in that report
``backward_pass`` gets almost nothing while its kernels go unaccounted. The rule here:

    a GPU operation (kernel, memcpy, memset) belongs to every NVTX range, on ANY thread of the
    launching process, that is open when its launch call (the CUDA API row with the same
    correlationId) starts.

Its GPU time (end - start on the device) is then added to that range name. Several instances
of a name (``layer_3`` in every step) are merged into their union first, so overlapping
instances on two threads never count an operation twice.

Limits: a CUDA graph is one launch (``cudaGraphLaunch``) that runs many kernels; they are
attributed by that one launch, so a graph spanning several phases lands in the phase of its
launch. Work launched before a range opens but still running when it closes is not moved: the
attribution is by launch, not by execution time. ``share_of_step`` divides by the GPU time of
every operation launched inside a ``profiled_step`` range.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass

import numpy as np

from analysis.reading.export import Export
from analysis.reports.nvtx import PID_MASK, match_runtime

STEP_RANGE = "profiled_step"
PHASES = ("forward_pass", "loss_computation", "backward_pass", "optimizer_step")
COLUMNS = [
    "Range",
    "Kind",
    "Instances",
    "Ops",
    "GPU Time (ns)",
    "GPU ms/step",
    "Share of Step",
    "CPU ms/step",
]


@dataclass
class Launches:
    """Every GPU op of the capture with the start time and process of its launch call."""

    launch: np.ndarray  # int64 ns, CUDA API start; -1 when no launch row was found
    pid: np.ndarray  # int64, the process bits of the launching thread
    gpu_ns: np.ndarray  # int64, device duration


def gpu_launches(ex: Export) -> Launches:
    """Kernels, memcpys and memsets joined to the CUDA API call that launched them."""
    k, mc, ms = ex.kernels(), ex.memcpy(), ex.memset()
    corr = np.concatenate([k["correlationId"], mc["correlationId"], ms["correlationId"]])
    gpid = np.concatenate([k["globalPid"], mc["globalPid"], ms["globalPid"]])
    dur = np.concatenate([k["end"] - k["start"], mc["end"] - mc["start"],
                          ms["end"] - ms["start"]]).astype(np.int64)
    rt = ex.runtime()
    api = match_runtime(rt["correlationId"], rt["globalTid"], corr, gpid)
    found = api >= 0
    launch = np.full(corr.size, -1, np.int64)
    launch[found] = rt["start"][api[found]]
    return Launches(launch=launch, pid=gpid & PID_MASK, gpu_ns=dur)


def _union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into disjoint, sorted ones."""
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _inside(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of times falling in one of the disjoint sorted [start, end] intervals."""
    pos = np.searchsorted(starts, t, side="right") - 1
    ok = pos >= 0
    result = np.zeros(t.size, bool)
    result[ok] = t[ok] <= ends[pos[ok]]
    return result


def _display(name: str | None) -> str:
    """Range name without the default domain's empty prefix (nsys 2025 writes ':name')."""
    if name is None:
        return ""
    return name[1:] if name.startswith(":") else name


def phase_table(ex: Export) -> list[dict[str, object]]:
    """One row per NVTX range name: GPU time of the ops launched inside it, per step."""
    nv = ex.nvtx()
    if nv is None:
        return []
    closed = nv.end >= nv.start
    names = [_display(n) for n in nv.names]
    ops = gpu_launches(ex)
    has_launch = ops.launch >= 0
    range_pid = nv.global_tid & PID_MASK

    def intervals(code_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sel = code_mask & closed
        return nv.start[sel], nv.end[sel], range_pid[sel]

    def ops_inside(starts: np.ndarray, ends: np.ndarray, pids: np.ndarray) -> np.ndarray:
        mask = np.zeros(ops.launch.size, bool)
        for pid in np.unique(pids):
            s, e = _union(starts[pids == pid], ends[pids == pid])
            mine = has_launch & (ops.pid == pid)
            mask[mine] = _inside(ops.launch[mine], s, e)
        return mask

    step_codes = [i for i, n in enumerate(names) if n == STEP_RANGE]
    step_mask = np.isin(nv.name_code, step_codes)
    steps = int((step_mask & closed).sum())
    step_ops = ops_inside(*intervals(step_mask)) if steps else np.zeros(ops.launch.size, bool)
    step_gpu_ns = int(ops.gpu_ns[step_ops].sum())
    per_step = max(steps, 1)

    rows: list[dict[str, object]] = []
    for name in sorted(set(names)):
        codes = [i for i, n in enumerate(names) if n == name]
        code_mask = np.isin(nv.name_code, codes)
        starts, ends, pids = intervals(code_mask)
        if starts.size == 0:
            continue
        inside = ops_inside(starts, ends, pids)
        gpu_ns = int(ops.gpu_ns[inside].sum())
        rows.append({
            "Range": name,
            "Kind": _kind(name),
            "Instances": int(starts.size),
            "Ops": int(inside.sum()),
            "GPU Time (ns)": gpu_ns,
            "GPU ms/step": gpu_ns / per_step / 1e6,
            "Share of Step": gpu_ns / step_gpu_ns if step_gpu_ns else None,
            "CPU ms/step": float((ends - starts).sum()) / per_step / 1e6,
        })
    if steps:
        rows.append(_other_row(ops, step_ops, rows, step_gpu_ns, per_step))
    rows.sort(key=lambda r: (_KIND_ORDER.index(r["Kind"]), -int(r["GPU Time (ns)"])))
    return rows


def _other_row(
    ops: Launches, step_ops: np.ndarray, rows: list[dict[str, object]], step_gpu_ns: int,
    per_step: int,
) -> dict[str, object]:
    """GPU time launched inside a step but in none of the phases (e.g. zero_grad)."""
    phase_ns = sum(int(r["GPU Time (ns)"]) for r in rows if r["Range"] in PHASES)
    rest = step_gpu_ns - phase_ns
    return {
        "Range": "(step, outside phases)",
        "Kind": "phase",
        "Instances": None,
        "Ops": None,
        "GPU Time (ns)": rest,
        "GPU ms/step": rest / per_step / 1e6,
        "Share of Step": rest / step_gpu_ns if step_gpu_ns else None,
        "CPU ms/step": None,
    }


_KIND_ORDER = ["step", "phase", "layer", "sublayer", "op", "other"]


def _kind(name: str) -> str:
    if name in (STEP_RANGE, "profiled_region"):
        return "step"
    if name in PHASES:
        return "phase"
    if name.startswith("layer_"):
        return "layer"
    if name.endswith("_sublayer"):
        return "sublayer"
    if name in ("warmup",):
        return "other"
    return "op"


def phase_summary(rows: list[dict[str, object]]) -> dict[str, float | None]:
    """Per-phase GPU ms/step and shares, flat, for the run's metrics.json / summary row."""
    out: dict[str, float | None] = {}
    by_name = {r["Range"]: r for r in rows}
    for phase in PHASES:
        row = by_name.get(phase)
        out[f"phase_gpu_ms_{phase}"] = float(row["GPU ms/step"]) if row else None
    step = by_name.get(STEP_RANGE)
    out["phase_gpu_ms_step"] = float(step["GPU ms/step"]) if step else None
    covered = [by_name[p]["Share of Step"] for p in PHASES if p in by_name]
    out["phase_gpu_coverage"] = (
        float(sum(c for c in covered if c is not None)) if covered else None
    )
    return out


def write_phase_table(ex: Export, path: str | os.PathLike[str]) -> dict[str, float | None]:
    """Write ``phase_gpu_time.csv``; return the flat per-phase numbers for metrics.json."""
    rows = phase_table(ex)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(v) for k, v in row.items()})
    return phase_summary(rows)


def _csv_value(v: object) -> object:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v
