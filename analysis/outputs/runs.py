"""Reading a results folder: the plan, and each run's timing, capture and statistics records.

Layout (written by the pipeline, docs/timing.md):

    plan.json                      what was run: params, ladder membership, comparisons, git
    calibration.json               measured peaks of the GPU (optional)
    <run>/timing/r<i>.json         untraced timing process i (status, step_ms, gpu_state, ...)
    <run>/times.json               the traced run (inside nsys)
    <run>/stats/metrics.json       GPU metrics of the capture
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis.metrics.modulecheck import check_table_alone

OK = "ok"
# A repeat the guard did not start, because an earlier one ended the run (oom, unsupported,
# timeout: pipeline/guard.py): it measured nothing and says nothing about the run's status.
SKIPPED = "skipped"
# Worst first: the status a run gets when its processes disagree.
STATUS_ORDER = ["error", "timeout", "oom", "unsupported", OK]


@dataclass
class Timing:
    """The untraced timing processes of one run."""

    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def started(self) -> list[dict[str, Any]]:
        """The records of processes that ran (not the repeats skipped after a failure)."""
        return [r for r in self.records if r.get("status") != SKIPPED]

    @property
    def ok_records(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("status", OK) == OK and step_times(r)]

    @property
    def per_process_ms(self) -> list[list[float]]:
        return [step_times(r) for r in self.ok_records]

    @property
    def status(self) -> str:
        """ok when at least one process measured; else the worst failure."""
        if self.ok_records:
            return OK
        statuses = [r.get("status", "error") for r in self.started] or ["error"]
        return min(statuses, key=lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else 0)

    @property
    def message(self) -> str | None:
        failed = [r for r in self.started if r.get("status", OK) != OK]
        return str(failed[0].get("message") or "") if failed else None


def step_times(record: dict[str, Any]) -> list[float]:
    """A record's per-step times: the workload's primary timer (CUDA events on a GPU)."""
    return list(record.get("step_ms") or record.get("step_times_ms") or [])


def empty_cell(value: Any) -> bool:
    """A summary/CSV cell that holds nothing: None, or the NaN pandas reads for an empty one."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def module_table_suspect(results: Path, run: str) -> str | None:
    """Why the run's module table failed its self-check (analysis/metrics/modulecheck.py),
    or None: a table that fails is not drawn as if it were true. A run whose metrics predate
    the check is checked on its table's rows alone."""
    metrics = read_json(results / run / "stats" / "metrics.json") or {}
    if "module_attribution_suspect" in metrics or not metrics:
        reason = metrics.get("module_attribution_suspect")
        return str(reason) if reason else None
    # a run from before the check (its metrics have no such key): the table's rows alone
    table = results / run / "stats" / "module_table.csv"
    if not table.is_file():
        return None
    with open(table, newline="") as f:
        problem = check_table_alone(list(csv.DictReader(f)))
    return f"{problem} (checked on the table alone: the run predates the self-check)" \
        if problem else None


def read_plan(results: Path) -> dict[str, Any]:
    plan = read_json(results / "plan.json")
    if plan is None:
        raise FileNotFoundError(f"{results / 'plan.json'}: no plan (run the pipeline first)")
    return plan


def timing_paths(run_dir: Path) -> list[Path]:
    """A run folder's timing records (``timing/r<i>.json``), in repeat order."""
    return sorted((run_dir / "timing").glob("r*.json"), key=lambda p: int(p.stem[1:] or 0))


def read_timing(run_dir: Path) -> Timing:
    """Every timing record of a run folder, in repeat order."""
    return Timing([r for r in (read_json(p) for p in timing_paths(run_dir)) if r is not None])
