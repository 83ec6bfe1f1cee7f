"""Two results folders, old vs new: which runs got faster or slower, and the kernels, kernel
categories and NVTX ranges that account for the change.

    python -m analysis diff OLD NEW -o DIR [--threshold PCT] [--fail-on-slower PCT]
                                           [--pair OLD_RUN=NEW_RUN ...]

OLD and NEW are results folders: a fresh ``results/`` (``<run>/timing/r<i>.json``,
``<run>/times.json``, ``<run>/stats/*.csv``) or a published one (``<sub>/runs/<run>/`` holding
``times.json`` and the stats CSVs, several sub-folders). Runs are matched by name; a name found
in several sub-folders of one side is one run whose processes are pooled (docs/diff.md).

Step times come from the untraced timing processes; a side without them falls back to its
traced ``times.json`` (``*_timing_source: traced``, indicative only). The ratio ``old / new``
and its CI are :func:`analysis.metrics.timing.speedup`'s; the verdict is ``slower`` /
``faster`` only when the two sides' CIs separate AND the change exceeds the run's noise floor
(:mod:`analysis.outputs.diff_noise`), else ``within noise``.

Exit status: 0; 1 only with ``--fail-on-slower PCT`` and a run ``slower`` by more than PCT
percent; 2 on unusable input (not a results folder, no summary.csv, no run in common), with a
one-line ``error:`` on stderr.

Writes to DIR: ``runs.csv``, ``provenance.csv``, ``categories.csv``, ``kernels.csv``,
``ranges.csv``, ``summary.md`` (a pull-request comment) and ``ratios.png``.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.metrics.phases import STEP_RANGE
from analysis.metrics.phases import _kind as range_kind
from analysis.metrics.timing import speedup, summarize
from analysis.outputs.diff_noise import FASTER, SLOWER, VERDICTS, WITHIN_NOISE, Side, noise_floor
from analysis.outputs.diff_noise import verdict as noise_verdict
from analysis.outputs.runs import OK, Timing, read_json, read_timing, step_times

DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_TOP = 5
# Folders below a results root that never hold runs.
SKIP_DIRS = {"plots", "compare", "logs", "ladders", "overview", "report", "stats", "timing"}
MAX_DEPTH = 3
# Parameters that name files, not the workload.
IGNORED_PARAMS = {"out"}
# NVTX ranges that span the whole step: they always "explain" 100% and say nothing.
STEP_KINDS = {"step", "other"}
RUN_COLUMNS = [
    "run", "presence", "status", "verdict", "old_ms", "old_ci_low_ms", "old_ci_high_ms",
    "new_ms", "new_ci_low_ms", "new_ci_high_ms", "change_pct", "speedup", "speedup_ci_low",
    "speedup_ci_high", "significant", "cis_separate", "noise_floor_pct", "old_noise_pct",
    "new_noise_pct", "old_timing_source", "new_timing_source",
    "old_processes", "new_processes", "old_folders", "new_folders", "params_changed",
]  # fmt: skip
EXPLAIN_COLUMNS = ["run", "verdict", "old_ms_per_step", "new_ms_per_step", "delta_ms_per_step",
                   "share_of_change"]
VERDICT_ORDER = {v: i for i, v in enumerate(VERDICTS)}
NUMERIC_COLUMNS = [
    "old_ms", "old_ci_low_ms", "old_ci_high_ms", "new_ms", "new_ci_low_ms", "new_ci_high_ms",
    "change_pct", "speedup", "speedup_ci_low", "speedup_ci_high", "noise_floor_pct",
    "old_noise_pct", "new_noise_pct",
]  # fmt: skip


class UnusableInput(ValueError):
    """Input the diff cannot compare (exit status 2): not a results folder, no summary.csv,
    no run in common."""


# --- reading one side -------------------------------------------------------------------------


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
    folder = run_dir.parent
    while True:
        if (folder / "summary.csv").is_file():
            return True
        if folder == root or folder == folder.parent:
            return False
        folder = folder.parent


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


def range_table(old: Run, new: Run) -> tuple[pd.Series | None, pd.Series | None, str]:
    """NVTX range ms per step on one basis shared by both sides: ``gpu`` (the launch-based
    attribution of phase_gpu_time.csv) when both have it with GPU work, else ``cpu`` (range
    wall time, nvtx_sum.csv)."""
    po, pn = phase_rows(old), phase_rows(new)
    if po is not None and pn is not None and (po["GPU ms/step"].fillna(0).sum() > 0
                                              or pn["GPU ms/step"].fillna(0).sum() > 0):
        return po["GPU ms/step"].fillna(0.0), pn["GPU ms/step"].fillna(0.0), "gpu"
    return _cpu_ranges(old, po), _cpu_ranges(new, pn), "cpu"


def _cpu_ranges(run: Run, phases: pd.DataFrame | None) -> pd.Series | None:
    ranges = per_step_table(run, "nvtx_sum.csv", "Range", "Total Time (ns)")
    if ranges is None and phases is not None:
        ranges = phases["CPU ms/step"].dropna()
    if ranges is None:
        return None
    # nsys 2025 prints the default domain as a ':' prefix, 2024 does not.
    ranges.index = [str(n)[1:] if str(n).startswith(":") else str(n) for n in ranges.index]
    return ranges.groupby(level=0).sum()


# --- comparing --------------------------------------------------------------------------------


def side_stats(per_process_ms: list[list[float]]) -> tuple[Side, int]:
    """A side's estimate, 95% CI and per-process medians (the verdict's input), and its
    process count."""
    s = summarize(per_process_ms)
    medians = tuple(float(np.median(p)) for p in per_process_ms if len(p))
    return Side(s.median_ms, s.ci_low_ms, s.ci_high_ms, medians), s.processes


def run_row(name: str, old: Run | None, new: Run | None, threshold: float) -> dict[str, Any]:
    """runs.csv row: both sides' step time with CI, the ratio's CI, the verdict."""
    row: dict[str, Any] = {c: None for c in RUN_COLUMNS}
    row["run"] = name
    if old is None or new is None:
        row["presence"] = "old_only" if new is None else "new_only"
        return row
    row["presence"] = "both"
    row["old_folders"], row["new_folders"] = len(old.dirs), len(new.dirs)
    row["params_changed"] = params_changed(old.params(), new.params())
    (ot, osrc), (nt, nsrc) = old.timing(), new.timing()
    row.update(old_timing_source=osrc, new_timing_source=nsrc)
    failed = [f"{side}: {t.status}" for side, t in (("old", ot), ("new", nt)) if t.status != OK]
    if failed:
        row["status"] = "; ".join(failed)
        return row
    (so, old_n), (sn, new_n) = side_stats(ot.per_process_ms), side_stats(nt.per_process_ms)
    s = speedup(ot.per_process_ms, nt.per_process_ms)
    row.update(
        status=OK, old_ms=so.median_ms, old_ci_low_ms=so.ci_low_ms, old_ci_high_ms=so.ci_high_ms,
        new_ms=sn.median_ms, new_ci_low_ms=sn.ci_low_ms, new_ci_high_ms=sn.ci_high_ms,
        change_pct=(sn.median_ms / so.median_ms - 1) * 100, speedup=s.ratio,
        speedup_ci_low=s.ci_low, speedup_ci_high=s.ci_high, significant=s.significant,
        cis_separate=sn.ci_low_ms > so.ci_high_ms or so.ci_low_ms > sn.ci_high_ms,
        noise_floor_pct=noise_floor(so, sn, threshold) * 100,
        old_noise_pct=so.process_noise_rel * 100, new_noise_pct=sn.process_noise_rel * 100,
        verdict=noise_verdict(so, sn, threshold), old_processes=old_n, new_processes=new_n,
    )  # fmt: skip
    return row


def params_changed(old: dict[str, Any], new: dict[str, Any]) -> str:
    """``key: old->new`` for every workload parameter that differs."""
    keys = sorted(set(old) | set(new))
    return "; ".join(f"{k}: {old.get(k)}->{new.get(k)}" for k in keys if old.get(k) != new.get(k))


def explain(
    old: pd.Series | None, new: pd.Series | None, step_delta_ms: float
) -> pd.DataFrame:
    """Per key: ms per step old/new, the difference and its share of the step-time change,
    largest absolute difference first. A key missing on one side counts 0 there."""
    if old is None and new is None:
        return pd.DataFrame(columns=["key", *EXPLAIN_COLUMNS[2:]])
    table = pd.concat({"old_ms_per_step": old if old is not None else pd.Series(dtype=float),
                       "new_ms_per_step": new if new is not None else pd.Series(dtype=float)},
                      axis=1).fillna(0.0)
    table["delta_ms_per_step"] = table["new_ms_per_step"] - table["old_ms_per_step"]
    table["share_of_change"] = table["delta_ms_per_step"] / step_delta_ms if step_delta_ms else None
    table = table.reindex(table["delta_ms_per_step"].abs().sort_values(ascending=False).index)
    return table.rename_axis("key").reset_index()


@dataclass
class Explanation:
    categories: pd.DataFrame
    kernels: pd.DataFrame
    ranges: pd.DataFrame
    range_basis: str


def explain_run(old: Run, new: Run, step_delta_ms: float) -> Explanation:
    """Kernel categories, kernels and NVTX ranges of a changed run, old vs new."""
    def table(r: Run, name: str, key: str) -> pd.Series | None:
        return per_step_table(r, name, key, "Total Time (ns)")

    categories = explain(table(old, "kernel_categories.csv", "Category"),
                         table(new, "kernel_categories.csv", "Category"), step_delta_ms)
    kernels = explain(table(old, "cuda_gpu_kern_sum.csv", "Name"),
                      table(new, "cuda_gpu_kern_sum.csv", "Name"), step_delta_ms)
    ro, rn, basis = range_table(old, new)
    ranges = explain(ro, rn, step_delta_ms)
    ranges.insert(1, "kind", [range_kind(str(k)) for k in ranges["key"]])
    return Explanation(categories, kernels, ranges, basis)


def top_range(ranges: pd.DataFrame) -> str | None:
    """The NVTX range inside the phases (a layer, sublayer or op) whose time changed most."""
    inner = ranges[~ranges["kind"].isin(STEP_KINDS | {"phase"})]
    return None if inner.empty else str(inner["key"].iloc[0])


# --- provenance -------------------------------------------------------------------------------

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


def provenance_table(old: dict[str, str], new: dict[str, str]) -> pd.DataFrame:
    """One row per field, the differing ones first."""
    rows = [{"field": f, "old": old[f], "new": new[f], "differs": old[f] != new[f]}
            for f in PROVENANCE_FIELDS]
    table = pd.DataFrame(rows)
    return table.sort_values("differs", ascending=False, kind="stable").reset_index(drop=True)


# --- the whole diff ---------------------------------------------------------------------------


@dataclass
class Diff:
    old: Path
    new: Path
    runs: pd.DataFrame
    provenance: pd.DataFrame
    explanations: dict[str, Explanation]
    threshold: float


def apply_pairs(old_runs: dict[str, Any], new_runs: dict[str, Any],
                pairs: dict[str, str]) -> dict[str, Any]:
    """``--pair OLD=NEW``: compare differently named runs (e.g. a matrix run and the ladder
    rung that replaced it) under the name ``OLD=NEW``; their parameter changes are listed."""
    old_runs = dict(old_runs)
    for old_name, new_name in pairs.items():
        if old_name not in old_runs:
            raise UnusableInput(f"--pair {old_name}={new_name}: no run {old_name!r} in the old "
                                "folder")
        if new_name not in new_runs:
            raise UnusableInput(f"--pair {old_name}={new_name}: no run {new_name!r} in the new "
                                "folder")
        label = f"{old_name}={new_name}"
        old_runs[label] = old_runs.pop(old_name)
        new_runs[label] = new_runs.pop(new_name)
    return old_runs


def compare(old: Path, new: Path, threshold_pct: float = DEFAULT_THRESHOLD_PCT,
            pairs: dict[str, str] | None = None) -> Diff:
    """Match the runs of two results folders and explain every changed one. Raises
    :class:`UnusableInput` when either folder is not a finished results folder or the two
    have no run in common (``pairs`` included)."""
    old_runs, new_runs = find_runs(old), find_runs(new)
    check_summaries(old, old_runs, "old")
    check_summaries(new, new_runs, "new")
    old_runs = apply_pairs(old_runs, new_runs, pairs or {})
    if not set(old_runs) & set(new_runs):
        raise UnusableInput(f"no run in common: old {old} has {len(old_runs)} runs, new {new} "
                            f"{len(new_runs)}, none of the same name (--pair OLD_RUN=NEW_RUN "
                            "compares renamed runs)")
    threshold = threshold_pct / 100
    names = sorted(set(old_runs) | set(new_runs))
    rows = [run_row(n, old_runs.get(n), new_runs.get(n), threshold) for n in names]
    runs = pd.DataFrame(rows, columns=RUN_COLUMNS)
    runs[NUMERIC_COLUMNS] = runs[NUMERIC_COLUMNS].astype(float)  # None when no side measured
    runs = _sorted_runs(runs)
    counts = ["old_processes", "new_processes", "old_folders", "new_folders"]
    runs[counts] = runs[counts].astype("Int64")
    explanations = {}
    for row in runs.itertuples():
        if row.verdict in (FASTER, SLOWER):
            explanations[row.run] = explain_run(old_runs[row.run], new_runs[row.run],
                                                row.new_ms - row.old_ms)
    prov = provenance_table(side_provenance(old, old_runs), side_provenance(new, new_runs))
    return Diff(old, new, runs, prov, explanations, threshold)


def _sorted_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Slower first (worst first), then faster, then within noise, then failed and one-sided
    runs."""
    rank = runs["verdict"].map(VERDICT_ORDER).fillna(3)
    presence = (runs["presence"] != "both").astype(int)
    magnitude = -(runs["change_pct"].abs().fillna(0))
    order = pd.DataFrame({"p": presence, "r": rank, "m": magnitude, "n": runs["run"]})
    return runs.loc[order.sort_values(["p", "r", "m", "n"]).index].reset_index(drop=True)


def explanation_csv(diff: Diff, part: str, key: str) -> pd.DataFrame:
    """categories / kernels / ranges of every changed run in one long table."""
    frames = []
    verdicts = dict(zip(diff.runs["run"], diff.runs["verdict"], strict=True))
    for run, exp in diff.explanations.items():
        table = getattr(exp, part).rename(columns={"key": key}).copy()
        table.insert(0, "run", run)
        table.insert(1, "verdict", verdicts[run])
        if part == "ranges":
            table.insert(3, "basis", exp.range_basis)
        frames.append(table)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run", "verdict", key, *EXPLAIN_COLUMNS[2:]])


def slower_runs(runs: pd.DataFrame, fail_pct: float) -> pd.DataFrame:
    """Runs reported ``slower`` whose step time grew by more than ``fail_pct`` percent."""
    return runs[(runs["verdict"] == SLOWER) & (runs["change_pct"] > fail_pct)]


def write_diff(
    old: Path, new: Path, outdir: Path, fail_on_slower: float | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT, top: int = DEFAULT_TOP,
    pairs: dict[str, str] | None = None,
) -> int:
    """Write the CSVs, summary.md and ratios.png; 1 when ``fail_on_slower`` (percent) is set
    and a run is ``slower`` by more than that, else 0. Raises :class:`UnusableInput` (exit
    status 2 on the command line) before writing anything when the input cannot be compared."""
    diff = compare(Path(old), Path(new), threshold_pct, pairs)
    outdir.mkdir(parents=True, exist_ok=True)
    diff.runs.to_csv(outdir / "runs.csv", index=False)
    diff.provenance.to_csv(outdir / "provenance.csv", index=False)
    for part, key in (("categories", "category"), ("kernels", "kernel"), ("ranges", "range")):
        explanation_csv(diff, part, key).to_csv(outdir / f"{part}.csv", index=False)
    (outdir / "summary.md").write_text(markdown(diff, top))
    plot_ratios(diff.runs, outdir / "ratios.png")
    if fail_on_slower is None:
        return 0
    return 1 if not slower_runs(diff.runs, fail_on_slower).empty else 0


# --- Markdown ---------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    if value is None or pd.isna(value):
        return "–"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:+.0f}%"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _cell(text: object, width: int = 60) -> str:
    s = str(text).replace("|", "\\|")
    return s if len(s) <= width else s[: width - 1] + "…"


def markdown(diff: Diff, top: int = DEFAULT_TOP) -> str:
    """The pull-request comment: provenance differences, then per-run verdicts, then what
    explains each changed run."""
    lines = [f"## profbench diff: `{diff.old}` → `{diff.new}`", "",
             headline(diff.runs, bold=True), ""]
    lines += _provenance_md(diff.provenance) + _timing_source_md(diff.runs)
    lines += _runs_md(diff.runs, diff.threshold) + _one_sided_md(diff.runs)
    for run, exp in diff.explanations.items():
        row = diff.runs.set_index("run").loc[run]
        lines += _explanation_md(run, row, exp, top)
    return "\n".join(lines).rstrip() + "\n"


def headline(runs: pd.DataFrame, bold: bool = False) -> str:
    """Runs matched and their verdicts, failed ones, and the runs of one side only."""
    both = runs[runs["presence"] == "both"]
    counts = both["verdict"].value_counts()
    parts = [f"{counts.get(v, 0)} {v}" for v in VERDICTS]
    failed = int((both["status"].notna() & (both["status"] != OK)).sum())
    only_old = int((runs["presence"] == "old_only").sum())
    only_new = int((runs["presence"] == "new_only").sum())
    matched = f"{len(both)} run{'' if len(both) == 1 else 's'} matched"
    return (f"{f'**{matched}**' if bold else matched}: {', '.join(parts)}, {failed} failed on "
            f"a side; {only_old} only in old, {only_new} only in new.")


def _provenance_md(prov: pd.DataFrame) -> list[str]:
    differs = prov[prov["differs"]]
    lines = ["### Provenance differences", ""]
    if differs.empty:
        lines += ["None: same GPU, software and commit as far as recorded.", ""]
    else:
        lines += _table(["", "old", "new"], [[f, _cell(o), _cell(n)] for f, o, n in
                                             zip(differs["field"], differs["old"],
                                                 differs["new"], strict=True)]) + [""]
    same = prov[~prov["differs"]]
    if not same.empty:
        lines += ["Same on both sides: " + "; ".join(
            f"{f} {v}" for f, v in zip(same["field"], same["old"], strict=True)) + ".", ""]
    return lines


def _timing_source_md(runs: pd.DataFrame) -> list[str]:
    sources = set(runs["old_timing_source"].dropna()) | set(runs["new_timing_source"].dropna())
    if "traced" not in sources:
        return []
    what = ("mixes traced and untraced step times" if "untraced" in sources
            else "uses traced step times on both sides")
    return [f"> **Indicative only**: this comparison {what}. A side without untraced timing "
            "records (`old_timing_source` / `new_timing_source: traced` in runs.csv) is timed "
            "from its run inside nsys, one process per run folder, so the profiler's overhead "
            "and a single process's noise are part of the difference.", ""]


def _runs_md(runs: pd.DataFrame, threshold: float) -> list[str]:
    both = runs[runs["presence"] == "both"]
    rows = []
    for r in both.itertuples():
        if r.status != OK:
            rows.append([f"`{r.run}`", "–", "–", "–", "–", "–", f"failed ({r.status})",
                         _cell(r.params_changed or "", 40)])
            continue
        rows.append([
            f"`{r.run}`", _ci_ms(r.old_ms, r.old_ci_low_ms, r.old_ci_high_ms),
            _ci_ms(r.new_ms, r.new_ci_low_ms, r.new_ci_high_ms), _pct(r.change_pct),
            f"{r.speedup:.3f} [{r.speedup_ci_low:.3f}, {r.speedup_ci_high:.3f}]",
            f"{r.noise_floor_pct:.0f}%", _verdict_md(r.verdict),
            _cell(r.params_changed or "", 40),
        ])
    header = ["run", "old ms [95% CI]", "new ms [95% CI]", "change", "old/new [95% CI]",
              "noise floor", "verdict", "changed params"]
    note = ("Verdict: `slower`/`faster` only when the two 95% CIs do not overlap **and** the "
            "change (as a factor, new/old or old/new, minus 1) exceeds the run's noise floor: "
            f"the largest of the threshold ({threshold:.0%}), either side's relative CI "
            "half-width and either side's process noise (99% Student-t half-width over its "
            "per-process medians); otherwise `within noise` (not shown to have changed).")
    return ["### Step time per run", "", *_table(header, rows), "", note, ""]


def _ci_ms(ms: float, low: float, high: float) -> str:
    return f"{_ms(ms)} [{_ms(low)}, {_ms(high)}]"


def _verdict_md(verdict: str) -> str:
    return {SLOWER: "**slower**", FASTER: "**faster**"}.get(verdict, verdict)


def _one_sided_md(runs: pd.DataFrame) -> list[str]:
    lines = []
    for presence, title in (("old_only", "Only in old"), ("new_only", "Only in new")):
        names = runs.loc[runs["presence"] == presence, "run"]
        if not names.empty:
            lines += [f"**{title}** ({len(names)}): " + ", ".join(f"`{n}`" for n in names), ""]
    return lines


def _explanation_md(run: str, row: pd.Series, exp: Explanation, top: int) -> list[str]:
    delta = row["new_ms"] - row["old_ms"]
    lines = [f"### `{run}`: {row['verdict']} ({_pct(row['change_pct'])}, "
             f"{delta:+.3g} ms per step)", ""]
    lines += _kernel_total_md(exp.categories, delta)
    lines += _part_md("Kernel categories", exp.categories, top, "category")
    lines += _part_md("Top kernels", exp.kernels, top, "kernel")
    basis = ("GPU time of the ops launched inside each range" if exp.range_basis == "gpu"
             else "range wall time on the CPU: GPU attribution missing on a side")
    ranges = exp.ranges[~exp.ranges["kind"].isin(STEP_KINDS)]
    phases = ranges[ranges["kind"] == "phase"]
    inner = ranges[ranges["kind"] != "phase"]
    lines += _part_md(f"NVTX phases ({basis})", phases, top, "phase")
    lines += _part_md("Top NVTX ranges", inner, top, "range")
    return lines


def _kernel_total_md(categories: pd.DataFrame, step_delta_ms: float) -> list[str]:
    """How much of the step-time change the GPU kernels' time accounts for."""
    if categories.empty:
        return []
    old, new = categories["old_ms_per_step"].sum(), categories["new_ms_per_step"].sum()
    if old <= 0 and new <= 0:
        return []
    share = (new - old) / step_delta_ms if step_delta_ms else float("nan")
    return [f"GPU kernel time per step: {_ms(old)} → {_ms(new)} ms ({new - old:+.3g} ms, "
            f"{_share(share)} of the change); the rest is time the GPU was idle or the host "
            "ran.", ""]


def _part_md(title: str, table: pd.DataFrame, top: int, key: str) -> list[str]:
    if table.empty or not (table[["old_ms_per_step", "new_ms_per_step"]].to_numpy() > 0).any():
        return [f"*{title}*: none recorded on either side.", ""]
    rows = [[_cell(r.key), _ms(r.old_ms_per_step), _ms(r.new_ms_per_step),
             f"{r.delta_ms_per_step:+.3g}", _share(r.share_of_change)]
            for r in table.head(top).itertuples()]
    header = [key, "old ms/step", "new ms/step", "Δ ms/step", "share of Δ"]
    return [f"*{title}*", "", *_table(header, rows), ""]


def _share(value: float | None) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.0%}"


# --- figure -----------------------------------------------------------------------------------


COLORS = {FASTER: "tab:green", SLOWER: "tab:red", WITHIN_NOISE: "tab:gray"}


def plot_ratios(runs: pd.DataFrame, path: Path) -> None:
    """old/new step-time ratio per matched run with its 95% CI, sorted; > 1 is faster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = runs[runs["speedup"].notna()].sort_values("speedup")
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.3 * max(len(ok), 1)))
    if ok.empty:
        ax.text(0.5, 0.5, "no run measured on both sides", ha="center", va="center")
        ax.set_axis_off()
    else:
        y = range(len(ok))
        err = [ok["speedup"] - ok["speedup_ci_low"], ok["speedup_ci_high"] - ok["speedup"]]
        colors = [COLORS.get(v, "tab:gray") for v in ok["verdict"]]
        for i, (x, lo, hi, c) in enumerate(zip(ok["speedup"], err[0], err[1], colors,
                                               strict=True)):
            ax.errorbar([x], [i], xerr=[[lo], [hi]], fmt="o", color=c, capsize=3)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(list(y), ok["run"], fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("old / new step time (> 1: new is faster), 95% CI")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- command line -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", type=Path, help="baseline results folder")
    parser.add_argument("new", type=Path, help="results folder to compare with it")
    parser.add_argument("-o", "--outdir", type=Path, required=True)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD_PCT,
                        metavar="PCT", help="smallest change reported as faster/slower, "
                        "however quiet the run (percent, default "
                        f"{DEFAULT_THRESHOLD_PCT:g}); noisier runs need more (docs/diff.md)")
    parser.add_argument("--fail-on-slower", type=float, default=None, metavar="PCT",
                        help="exit 1 when a run is slower (beyond noise) by more than PCT "
                        "percent")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP,
                        help="rows per table in summary.md")
    parser.add_argument("--pair", action="append", default=[], metavar="OLD=NEW",
                        help="also compare run OLD of the old folder with run NEW of the new "
                        "one (repeatable), e.g. a run renamed between the two")


def _pair(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old or not new:
        raise ValueError(f"--pair {text!r}: expected OLD_RUN=NEW_RUN")
    return old, new


def run(args: argparse.Namespace) -> int:
    """0; 1 only when --fail-on-slower trips; 2 on unusable input (a one-line ``error:`` on
    stderr) and on any other error (its traceback, then that line): a crash never reads as
    a slowdown."""
    try:
        pairs = dict(_pair(p) for p in args.pair)
        code = write_diff(args.old, args.new, args.outdir, args.fail_on_slower,
                          args.threshold, args.top, pairs)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # a bug or an unreadable file: exit 2, never the gate's 1
        traceback.print_exc()
        print(f"error: analysis diff failed ({type(err).__name__}: {err}); no verdict",
              file=sys.stderr)
        return 2
    runs = pd.read_csv(args.outdir / "runs.csv")
    print(f"wrote {args.outdir}: {headline(runs)}")
    for presence, title in (("old_only", "only in old"), ("new_only", "only in new")):
        names = list(runs.loc[runs["presence"] == presence, "run"])
        if names:
            print(f"{title} ({len(names)}): {', '.join(names)}")
    if code:
        print(f"slower by more than {args.fail_on_slower:g}%: "
              + ", ".join(slower_runs(runs, args.fail_on_slower)["run"]), file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
