"""The largest batch that fits (`batch: max` runs): summary.csv's columns from the run's
search (``<run>/maxbatch.json``, workloads/maxbatch.py) and the overview's table of them.

A `batch: max` run's row has the batch its timing processes ran (``batch``; empty when the
search found none) and ``batch_from`` = ``max``; its ``max_batch_*`` columns: the search's
``bound`` and ``start``, its ``status`` and what ``limited_by`` it, ``processes`` (the batches
tried), ``oom_batch`` (the first batch up that ran out of memory: one above ``batch`` when
memory, not the bound, limited it) with that row's ``oom_status`` and ``oom_message``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from analysis.outputs.overview_experiments import ms, number
from analysis.outputs.overview_page import EMPTY, Grid, Titled
from analysis.outputs.runs import empty_cell, read_json

TITLE = "The largest batch that fits (batch: max)"


def max_batch_columns(run_dir: Path, info: dict[str, Any],
                      record: dict[str, Any]) -> dict[str, Any]:
    """A `batch: max` run's columns (none for any other run): the batch its records ran,
    what its search found and the row one batch up."""
    if "max_batch" not in info:
        return {}
    search = read_json(run_dir / "maxbatch.json") or {}
    tried = {r.get("batch"): r for r in search.get("tried") or []}
    oom_batch = search.get("oom_batch")
    oom_row = tried.get(oom_batch) or {}
    batch = (record.get("params") or {}).get("batch") if record.get("max_batch") else None
    return {
        "batch": batch if batch is not None else search.get("batch"),
        "batch_from": "max",
        "max_batch_bound": search.get("bound", info["max_batch"].get("bound")),
        "max_batch_start": search.get("start", info["max_batch"].get("start")),
        "max_batch_status": search.get("status"),
        "max_batch_limited_by": search.get("limited_by"),
        "max_batch_processes": len(tried),
        "max_batch_oom_batch": oom_batch,
        "max_batch_oom_status": oom_row.get("status"),
        "max_batch_oom_message": oom_row.get("message"),  # its first line (maxbatch.probe)
    }


def max_batch_table(summary: pd.DataFrame) -> list[Titled]:
    """The `batch: max` runs: the batch found, its peak memory and step time (the timing
    processes'), the next batch up and how it ended, the bound and the processes the search
    took; nothing without such a run."""
    if "batch_from" not in summary.columns:
        return []
    runs = summary[summary["batch_from"] == "max"]
    if runs.empty:
        return []
    header = ["run", "batch", "peak GiB", "step ms", "next batch", "next status", "bound",
              "processes"]
    rows = [_row(row) for _, row in runs.iterrows()]
    caption = ("Each run's batch is the largest its search found to fit; the next batch up "
               "ran in its own process and ran out of memory (docs/workloads.md).")
    return [Titled(TITLE, Grid(header, rows, caption))]


def _row(row: pd.Series) -> list[str]:
    found = number(row.get("batch"))
    peak = number(row.get("peak_memory_gib"))
    nxt = number(row.get("max_batch_oom_batch"))
    # the timing processes' step time also where a later capture failed; else the status
    step = (ms(row.get("step_ms")) if number(row.get("step_ms")) is not None
            else str(row.get("status")))
    return [str(row["run"]), EMPTY if found is None else str(int(found)),
            EMPTY if peak is None else f"{peak:.2f}", step,
            EMPTY if nxt is None else str(int(nxt)), _cell(row.get("max_batch_oom_status")),
            _cell(row.get("max_batch_bound"), integer=True),
            _cell(row.get("max_batch_processes"), integer=True)]


def _cell(value: Any, integer: bool = False) -> str:
    if empty_cell(value):
        return EMPTY
    return str(int(float(value))) if integer else str(value)
