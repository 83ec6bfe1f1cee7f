"""``analysis diff``, reading one side: the runs of a results folder (their folders in every
sub-folder, timing records, stats tables per step, NVTX ranges) and its provenance.

A results folder is one the pipeline finished: runs and a ``summary.csv`` over them
(:func:`check_summaries`); anything else is :class:`UnusableInput` (exit status 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.metrics.phases import STEP_RANGE
from analysis.outputs.runs import Timing, read_json, read_timing, step_times

# Folders below a results root that never hold runs.
SKIP_DIRS = {"plots", "compare", "logs", "ladders", "overview", "report", "stats", "timing"}
MAX_DEPTH = 3
# Parameters that name files, not the workload.
IGNORED_PARAMS = {"out"}


class UnusableInput(ValueError):
    """Input the diff cannot compare (exit status 2): not a results folder, no summary.csv,
    no run in common."""


@dataclass
class Run:
    """One run of one side: its folders (one per sub-folder it appears in) and what they hold."""

    name: str
    dirs: list[Path] = field(default_factory=list)

    def records(self) -> list[dict[str, Any]]:
        """Untraced timing records of every folder, then the traced times.json ones."""
        out = [r for d in self.dirs for r in read_timing(d).records]
        return out or self.traced()

    def traced(self) -> list[dict[str, Any]]:
        return [t for t in (read_json(d / "times.json") for d in self.dirs) if t is not None]

    def timing(self) -> tuple[Timing, str]:
        """The step-time processes and where they come from: untraced, traced or none."""
        untraced = Timing([r for d in self.dirs for r in read_timing(d).records])
        if untraced.records:
            return untraced, "untraced"
        traced = Timing(self.traced())
        return traced, ("traced" if traced.records else "none")

    def params(self) -> dict[str, Any]:
        first = next(iter(self.records()), {})
        return {k: v for k, v in (first.get("params") or {}).items() if k not in IGNORED_PARAMS}


def is_run_dir(path: Path) -> bool:
    return (path / "times.json").is_file() or (path / "timing").is_dir()


def find_runs(root: Path) -> dict[str, Run]:
    """Run folders under ``root`` (directly, under ``runs/``, or in sub-folders), by name."""
    if not root.is_dir():
        raise UnusableInput(f"{root}: not a results folder (no such folder)")
    runs: dict[str, Run] = {}
    for path in _run_dirs(root, 0):
        runs.setdefault(path.name, Run(path.name)).dirs.append(path)
    if not runs:
        raise UnusableInput(f"{root}: no runs found (no <run>/times.json or <run>/timing/)")
    return runs


def check_summaries(root: Path, runs: dict[str, Run], side: str) -> None:
    """Every run folder has a summary.csv in a folder between it and ``root`` (``root``
    included): the mark of a pipeline run that finished. Runs without one (a pipeline cut
    short, a folder of loose timing records) would be compared against a complete side and
    the runs they lack reported as removed."""
    bare = sorted({str(d.parent.relative_to(root)) for run in runs.values() for d in run.dirs
                   if not _has_summary(root, d)})
    if bare:
        where = "" if bare == ["."] else f" over the runs in {', '.join(f'{b}/' for b in bare)}"
        raise UnusableInput(f"{side} folder {root}: no summary.csv{where} (not a finished "
                            "results folder)")


def _has_summary(root: Path, run_dir: Path) -> bool:
    return _summary_of(root, run_dir) is not None


def _summary_of(root: Path, run_dir: Path) -> Path | None:
    """The summary.csv nearest above a run folder, up to ``root``."""
    folder = run_dir.parent
    while True:
        if (folder / "summary.csv").is_file():
            return folder / "summary.csv"
        if folder == root or folder == folder.parent:
            return None
        folder = folder.parent


def summary_runs_only(root: Path, runs: dict[str, Run]) -> dict[str, Run]:
    """The runs as their summary.csv lists them: a run folder left on disk by a config that
    has since dropped the run (its summary no longer lists it) is not part of that side."""
    listed: dict[Path, set[str] | None] = {}

    def in_summary(run_dir: Path) -> bool:
        summary = _summary_of(root, run_dir)
        if summary not in listed:
            table = _read_csv(summary)
            names = table["run"] if table is not None and "run" in table else None
            listed[summary] = None if names is None else set(names.astype(str))
        names = listed[summary]
        return names is None or run_dir.name in names

    kept = {name: Run(name, [d for d in run.dirs if in_summary(d)]) for name, run in runs.items()}
    return {name: run for name, run in kept.items() if run.dirs}


def _run_dirs(folder: Path, depth: int) -> list[Path]:
    found: list[Path] = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir()):
        if child.name.startswith(".") or child.name in SKIP_DIRS:
            continue
        if is_run_dir(child):
            found.append(child)
        elif depth + 1 < MAX_DEPTH:
            found += _run_dirs(child, depth + 1)
    return found


def stats_file(run_dir: Path, name: str) -> Path | None:
    """``stats/<name>`` (pipeline layout) or ``<name>`` beside times.json (published)."""
    for path in (run_dir / "stats" / name, run_dir / name):
        if path.is_file():
            return path
    return None


def capture_steps(run_dir: Path) -> int:
    """Measured steps inside the capture: ``profiled_step`` instances in nvtx_sum.csv, else the
    traced run's step count."""
    nvtx = _read_csv(stats_file(run_dir, "nvtx_sum.csv"))
    if nvtx is not None and {"Range", "Instances"} <= set(nvtx.columns):
        names = nvtx["Range"].astype(str).str.lstrip(":")
        instances = nvtx.loc[names == STEP_RANGE, "Instances"].sum()
        if instances > 0:
            return int(instances)
    times = read_json(run_dir / "times.json") or {}
    return len(step_times(times)) or int((times.get("params") or {}).get("steps") or 1)


def _read_csv(path: Path | None) -> pd.DataFrame | None:
    if path is None:
        return None
    try:
        return pd.read_csv(path)
    except (pd.errors.EmptyDataError, OSError):
        return None


def per_step_table(run: Run, name: str, key: str, column: str) -> pd.Series | None:
    """``column`` (ns over the capture) of a stats CSV as ms per step by ``key``, averaged over
    the run's folders; None when no folder has the table."""
    parts = []
    for d in run.dirs:
        table = _read_csv(stats_file(d, name))
        if table is None or key not in table or column not in table:
            continue
        ms = table.groupby(key)[column].sum() / 1e6 / capture_steps(d)
        parts.append(ms)
    if not parts:
        return None
    return pd.concat(parts, axis=1).fillna(0.0).mean(axis=1)


def phase_rows(run: Run) -> pd.DataFrame | None:
    """phase_gpu_time.csv rows (Range, Kind, GPU ms/step, CPU ms/step), mean over folders."""
    tables = [t for t in (_read_csv(stats_file(d, "phase_gpu_time.csv")) for d in run.dirs)
              if t is not None and "Range" in t]
    if not tables:
        return None
    both = pd.concat(tables)
    return both.groupby("Range")[["GPU ms/step", "CPU ms/step"]].mean()


def phase_kinds(run: Run) -> dict[str, str]:
    """Range -> its Kind in the run's phase_gpu_time.csv (a layer or sublayer is told there,
    by how its ranges nest)."""
    out: dict[str, str] = {}
    for d in run.dirs:
        table = _read_csv(stats_file(d, "phase_gpu_time.csv"))
        if table is not None and {"Range", "Kind"} <= set(table.columns):
            out.update(zip(table["Range"].astype(str), table["Kind"].astype(str), strict=True))
    return out


def range_table(old: Run, new: Run) -> tuple[pd.Series | None, pd.Series | None, str]:
    """NVTX range ms per step on one basis shared by both sides: ``gpu`` (the launch-based
    attribution of phase_gpu_time.csv) when both have it with GPU work, else ``cpu`` (range
    wall time, nvtx_sum.csv)."""
    po, pn = phase_rows(old), phase_rows(new)
    if po is not None and pn is not None and (po["GPU ms/step"].fillna(0).sum() > 0
                                              or pn["GPU ms/step"].fillna(0).sum() > 0):
        return po["GPU ms/step"].fillna(0.0), pn["GPU ms/step"].fillna(0.0), "gpu"
    return _cpu_ranges(old, po), _cpu_ranges(new, pn), "cpu"


MODULE_TABLE = "module_table.csv"  # a model workload's (analysis/metrics/modules.py)


def module_table(old: Run, new: Run) -> tuple[pd.Series | None, pd.Series | None, str]:
    """Module ms per step by module path, on one basis for both sides: ``gpu`` (forward +
    backward GPU ms of the module table) when either side has GPU time, else ``cpu`` (its
    forward + backward CPU ms). Eager rungs get their rows from module ranges, compiled ones
    from Inductor's provenance: the paths are the same whatever the rung's kind."""
    to, tn = _module_tables(old), _module_tables(new)
    gpu = any(t is not None and t["GPU ms/step"].sum() > 0 for t in (to, tn))
    columns = (["Forward GPU ms/step", "Backward GPU ms/step"] if gpu else
               ["Forward CPU ms/step", "Backward CPU ms/step"])

    def per_module(table: pd.DataFrame | None) -> pd.Series | None:
        return None if table is None else table[columns].sum(axis=1)

    return per_module(to), per_module(tn), "gpu" if gpu else "cpu"


def _module_tables(run: Run) -> pd.DataFrame | None:
    """The run's module tables (ms per step already), averaged over its folders; None
    without rows (not a model workload, or a compiled one on the CPU)."""
    tables = [t for t in (_read_csv(stats_file(d, MODULE_TABLE)) for d in run.dirs)
              if t is not None and not t.empty and "Module" in t]
    if not tables:
        return None
    numeric = ["Forward GPU ms/step", "Backward GPU ms/step", "GPU ms/step",
               "Forward CPU ms/step", "Backward CPU ms/step"]
    both = pd.concat(tables)
    both[numeric] = both[numeric].apply(pd.to_numeric, errors="coerce").fillna(0.0)
    return both.groupby("Module")[numeric].mean()


def _cpu_ranges(run: Run, phases: pd.DataFrame | None) -> pd.Series | None:
    ranges = per_step_table(run, "nvtx_sum.csv", "Range", "Total Time (ns)")
    if ranges is None and phases is not None:
        ranges = phases["CPU ms/step"].dropna()
    if ranges is None:
        return None
    # nsys 2025 prints the default domain as a ':' prefix, 2024 does not.
    ranges.index = [str(n)[1:] if str(n).startswith(":") else str(n) for n in ranges.index]
    return ranges.groupby(level=0).sum()


# field -> where to look in a timing/traced record (dotted paths, first found wins)
PROVENANCE_FIELDS = {
    "gpu": ["device_name"],
    "driver": ["provenance.driver", "provenance.versions.driver", "gpu_state.driver_version"],
    "torch": ["provenance.versions.torch", "torch"],
    "cuda": ["provenance.versions.torch_cuda", "cuda"],
    "cudnn": ["provenance.versions.cudnn"],
    "triton": ["provenance.versions.triton"],
    "python": ["provenance.versions.python"],
    "nsys": ["provenance.versions.nsys", "provenance.nsys"],
    "environment": ["provenance.environment"],
    "commit": ["provenance.git_commit"],
    "dirty": ["provenance.git_dirty"],
    "timer": ["timer"],
}


def _dig(record: dict[str, Any], dotted: str) -> Any:
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def side_provenance(root: Path, runs: dict[str, Run]) -> dict[str, str]:
    """Each field's distinct values over the side's runs ("not recorded" when none)."""
    records = [r for run in runs.values() for r in run.records()[:1]]
    values: dict[str, set[str]] = {f: set() for f in PROVENANCE_FIELDS}
    for record in records:
        for name, paths in PROVENANCE_FIELDS.items():
            found = next((v for v in (_dig(record, p) for p in paths) if v is not None), None)
            if found is not None:
                values[name].add(str(found))
    plan = read_json(root / "plan.json") or {}
    for key, name in (("commit", "commit"), ("dirty", "dirty")):
        if (plan.get("git") or {}).get(key) is not None:
            values[name] = {str(plan["git"][key])}
    values["nsys"] |= _nsys_versions(runs)
    return {k: ", ".join(sorted(v)) if v else "not recorded" for k, v in values.items()}


def _nsys_versions(runs: dict[str, Run]) -> set[str]:
    """The nsys that made each capture, from the export's metadata (metrics.json)."""
    found = set()
    for run in runs.values():
        for d in run.dirs:
            path = stats_file(d, "metrics.json")
            metrics = (read_json(path) if path else None) or {}
            if metrics.get("nsys_version"):
                found.add(str(metrics["nsys_version"]))
    return found
