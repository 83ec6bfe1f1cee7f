"""What the figures read: the summary's runs and each run's ``stats/`` tables.

Every reader returns something empty instead of raising: a figure without data says so
(:class:`analysis.outputs.style.NoData`), it never stops the report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.outputs import style

_NOT_RUNS = {"plots", "ladders", "logs", "published"}
STEP_RANGE = "profiled_step"  # phase_gpu_time.csv's row of the measured steps (Kind "step")


def read_table(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (OSError, ValueError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def run_names(summary: pd.DataFrame, results: Path) -> list[str]:
    """Runs of the summary, in its order, then run folders the summary does not list."""
    names = [str(r) for r in summary["run"]] if "run" in summary else []
    if results.is_dir():
        extra = sorted(p.name for p in results.iterdir()
                       if p.is_dir() and p.name not in _NOT_RUNS and p.name not in names
                       and ((p / "stats").is_dir() or (p / "timing").is_dir()))  # fmt: skip
        names += extra
    return names


def stats_tables(results: Path, runs: list[str], name: str) -> dict[str, pd.DataFrame]:
    """run -> its non-empty ``stats/<name>`` table."""
    tables = {run: read_table(results / run / "stats" / name) for run in runs}
    return {run: t for run, t in tables.items() if not t.empty}


def num(frame: pd.DataFrame, column: str) -> pd.Series:
    """A numeric column (NaN where missing or not a number)."""
    if column not in frame:
        return pd.Series(np.nan, index=frame.index)
    return pd.to_numeric(frame[column], errors="coerce")


def status(frame: pd.DataFrame) -> pd.Series:
    """Each row's run status; a table without the column ran fine."""
    if "status" not in frame:
        return pd.Series(style.OK, index=frame.index)
    return frame["status"].fillna("no data").astype(str)


def captured_steps(phase_table: pd.DataFrame) -> int | None:
    """How many measured steps the capture holds (the step range's instances), so that a
    capture total becomes a per-step value; None when the run has no step range."""
    if phase_table.empty or "Range" not in phase_table:
        return None
    rows = phase_table[phase_table["Range"].astype(str) == STEP_RANGE]
    steps = num(rows, "Instances").max() if not rows.empty else np.nan
    return int(steps) if pd.notna(steps) and steps > 0 else None
