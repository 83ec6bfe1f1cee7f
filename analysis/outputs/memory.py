"""A run's memory view (``python -m analysis memory``), from its memory capture
(``memory.json``, workloads/memory_capture.py): docs/analysis.md "Where the memory goes".

Writes, in the run's ``stats/``: ``memory_metrics.json`` (peak allocated and reserved, the
bytes by category at the peak, the analytic parameter / gradient / optimizer bytes, what CUDA
graphs' pools hold), ``memory_ops.csv`` (per ATen op: TensorBoard's allocation count,
allocation size and size increase, self and total), ``memory_modules.csv`` (per module path:
bytes saved for backward, MemTracker's peak rise in forward and backward and the temporaries
at its backward peak) and ``memory_phases.csv`` (per phase: the bytes alive at its start and
end, its peak); and the figure ``trace/memory.png`` (analysis/outputs/figures_memory.py).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

# The categories of the bytes at the peak, in the capture's order (workloads/memory_capture.py;
# not imported from there: the analysis commands start without torch).
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "other",
)
OP_COLUMNS = [
    "op",
    "calls",
    "self_allocation_count",
    "self_allocation_bytes",
    "self_size_increase_bytes",
    "total_allocation_count",
    "total_allocation_bytes",
    "total_size_increase_bytes",
]
MODULE_COLUMNS = [
    "module",
    "saved_for_backward_bytes",
    "forward_peak_increase_bytes",
    "backward_peak_increase_bytes",
    "backward_peak_temporaries_bytes",
]
PHASE_COLUMNS = [
    "phase",
    "start_ms",
    "end_ms",
    "allocated_at_start_bytes",
    "allocated_at_end_bytes",
    "peak_bytes",
    "peak_increase_bytes",
]
METRIC_KEYS = (
    "device",
    "peak_allocated_bytes",
    "max_memory_allocated",
    "peak_reserved_bytes",
    "start_allocated_bytes",
    "peak_time_ms",
    "cuda_graph_pool_bytes",
    "saved_bytes",
    "history_entries",
    "capture_s",
    "notes",
    "at_peak_activations_kept",
    "activations_from",
)


def load(path: Path) -> dict[str, Any]:
    """The capture; a failed run leaves an empty file: ``{"status": "failed"}``."""
    text = path.read_text() if path.is_file() else ""
    if not text.strip():
        return {"status": "failed", "message": f"{path}: no memory capture (the run failed)"}
    return json.loads(text)


def metrics(capture: dict[str, Any]) -> dict[str, Any]:
    """memory_metrics.json: the capture's scalars, the categories at the peak with their
    sum, and each category's share of the peak."""
    out: dict[str, Any] = {
        "status": capture.get("status", "error"),
        "message": capture.get("message", ""),
    }
    out.update({k: capture.get(k) for k in METRIC_KEYS if k in capture})
    at_peak = capture.get("at_peak")
    if at_peak:
        total = sum(at_peak.values())
        out["at_peak"] = at_peak
        out["at_peak_sum_bytes"] = total
        out["at_peak_share"] = {
            c: (at_peak.get(c, 0) / total if total else None) for c in CATEGORIES
        }
    if "analytic" in capture:
        out["analytic"] = capture["analytic"]
    modules = capture.get("modules_peak", {})
    if "error" in modules:
        out["modules_note"] = f"MemTracker: {modules['error']}"
    return out


def module_rows(capture: dict[str, Any]) -> list[dict[str, Any]]:
    """Per module path: bytes saved for backward (its own: the hooks' innermost module) and
    MemTracker's peaks (where it ran)."""
    saved = capture.get("saved_by_module", {})
    tracked = capture.get("modules_peak", {}).get("modules", {})
    rows = []
    for path in sorted(set(saved) | set(tracked), key=_natural):
        states = tracked.get(path, {})
        rows.append(
            {
                "module": path or "(model)",
                "saved_for_backward_bytes": saved.get(path, 0),
                "forward_peak_increase_bytes": _rise(states, "Peak-Forward", "Pre-Forward"),
                "backward_peak_increase_bytes": _rise(states, "Peak-Backward", "Pre-Backward"),
                "backward_peak_temporaries_bytes": states.get("Peak-Backward", {}).get("Temp"),
            }
        )
    return rows


def _rise(states: dict[str, dict[str, int]], peak: str, before: str) -> int | None:
    if peak not in states or before not in states:
        return None
    return states[peak].get("Total", 0) - states[before].get("Total", 0)


def _natural(path: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in path.split(".")]


def phase_rows(capture: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for row in capture.get("phases", []):
        if "peak_bytes" in row:
            rise = row["peak_bytes"] - row["allocated_at_start_bytes"]
            row = {**row, "peak_increase_bytes": rise}
        rows.append(row)
    return rows


def write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write(capture_path: Path, outdir: Path, figure: Path | None, name: str | None) -> dict:
    """Every table of the memory view, and its figure."""
    from analysis.outputs.figures_memory import memory_figure

    capture = load(capture_path)
    outdir.mkdir(parents=True, exist_ok=True)
    result = metrics(capture)
    (outdir / "memory_metrics.json").write_text(json.dumps(result, indent=2) + "\n")
    write_csv(outdir / "memory_ops.csv", OP_COLUMNS, capture.get("ops", []))
    write_csv(outdir / "memory_modules.csv", MODULE_COLUMNS, module_rows(capture))
    write_csv(outdir / "memory_phases.csv", PHASE_COLUMNS, phase_rows(capture))
    if figure is not None:
        title = name or capture_path.parent.name
        try:
            memory_figure(capture, figure, title)
        except Exception as err:  # noqa: BLE001 - a figure never fails the run's tables
            from analysis.outputs.style import empty_figure

            empty_figure(figure, f"Memory: {title}", f"the figure failed: {err}")
    return result


def add_command(sub: argparse._SubParsersAction) -> None:
    """``memory``: a run's memory view from its memory capture."""
    mp = sub.add_parser(
        "memory",
        help="a run's memory view (memory_metrics.json, "
        "memory_ops.csv, memory_modules.csv, memory_phases.csv, its figure)",
    )
    mp.set_defaults(handler=run)
    mp.add_argument("capture", type=Path, help="the run's memory.json (its memory capture)")
    mp.add_argument("-o", "--output", type=Path, required=True, help="output folder (stats/)")
    mp.add_argument("--figure", type=Path, default=None, help="the memory figure (PNG)")
    mp.add_argument("--name", default=None, help="the figure's title")


def run(args: argparse.Namespace) -> int:
    result = write(args.capture, args.output, args.figure, args.name)
    peak = result.get("peak_allocated_bytes")
    print(
        f"memory view: {result['status']}"
        + (f", peak {peak / 2**30:.3f} GiB allocated" if peak else "")
    )
    return 0
