"""``analysis diff``, comparing the two sides: per run the step time with its CI on each side,
the ratio and the verdict (the rule is :mod:`analysis.outputs.diff_noise`'s), and for a changed
run the kernel categories, kernels and NVTX ranges that account for the change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.metrics.phases import name_kind
from analysis.metrics.timing import speedup, summarize
from analysis.outputs.diff_load import (
    PROVENANCE_FIELDS,
    Run,
    UnusableInput,
    check_summaries,
    find_runs,
    module_table,
    per_step_table,
    phase_kinds,
    range_table,
    side_provenance,
    summary_runs_only,
)
from analysis.outputs.diff_noise import (
    FASTER,
    INCONCLUSIVE,
    SLOWER,
    VERDICTS,
    Side,
    noise_floor,
    process_gap,
    processes_needed,
)
from analysis.outputs.diff_noise import verdict as noise_verdict
from analysis.outputs.runs import OK, empty_cell
from workloads.contract import NEW_DEFAULTS

DEFAULT_THRESHOLD_PCT = 5.0
# NVTX ranges that span the whole step: they always "explain" 100% and say nothing.
STEP_KINDS = {"step", "other"}
RUN_COLUMNS = [
    "run", "presence", "status", "verdict", "old_ms", "old_ci_low_ms", "old_ci_high_ms",
    "new_ms", "new_ci_low_ms", "new_ci_high_ms", "change_pct", "speedup", "speedup_ci_low",
    "speedup_ci_high", "significant", "cis_separate", "noise_floor_pct", "old_noise_pct",
    "new_noise_pct", "process_gap_pct", "processes_needed", "old_timing_source",
    "new_timing_source", "old_processes", "new_processes", "old_folders", "new_folders",
    "params_changed",
    "old_peak_gib", "new_peak_gib", "peak_change_pct",
]  # fmt: skip
EXPLAIN_COLUMNS = ["run", "verdict", "old_ms_per_step", "new_ms_per_step", "delta_ms_per_step",
                   "share_of_change"]
VERDICT_ORDER = {v: i for i, v in enumerate(VERDICTS)}
NUMERIC_COLUMNS = [
    "old_ms", "old_ci_low_ms", "old_ci_high_ms", "new_ms", "new_ci_low_ms", "new_ci_high_ms",
    "change_pct", "speedup", "speedup_ci_low", "speedup_ci_high", "noise_floor_pct",
    "old_noise_pct", "new_noise_pct", "process_gap_pct", "old_peak_gib", "new_peak_gib",
    "peak_change_pct",
]  # fmt: skip


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
    row.update(peak_columns(ot.records, nt.records))
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
        process_gap_pct=process_gap(so, sn) * 100,
        verdict=noise_verdict(so, sn, threshold), old_processes=old_n, new_processes=new_n,
    )  # fmt: skip
    if row["verdict"] == INCONCLUSIVE:  # what would make the pair judgeable
        row["processes_needed"] = processes_needed(so, sn, threshold)
    return row


def peak_columns(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, Any]:
    """Both sides' peak memory (GiB the step held: the largest of their processes' records)
    and its change; none where a side has no peak (a CPU run, an older record)."""
    def peak(records: list[dict[str, Any]]) -> float | None:
        values = [r["peak_memory_bytes"] for r in records if r.get("peak_memory_bytes")]
        return max(values) / 1024**3 if values else None

    a, b = peak(old), peak(new)
    return {"old_peak_gib": a, "new_peak_gib": b,
            "peak_change_pct": (b / a - 1) * 100 if a and b else None}


def params_changed(old: dict[str, Any], new: dict[str, Any]) -> str:
    """``key: old->new`` for every workload parameter that differs. An option added after the
    old record was written differs only where the new run set it off its default."""
    def at_default(side: dict[str, Any], key: str, other: dict[str, Any]) -> bool:
        return key not in side and (key, json.dumps(other.get(key))) in NEW_DEFAULTS

    keys = sorted(set(old) | set(new))
    return "; ".join(f"{k}: {old.get(k)}->{new.get(k)}" for k in keys if old.get(k) != new.get(k)
                     and not at_default(old, k, new) and not at_default(new, k, old))


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
    # by module path (a model workload's module table), eager and compiled rungs alike
    modules: pd.DataFrame
    module_basis: str


def explain_run(old: Run, new: Run, step_delta_ms: float) -> Explanation:
    """Kernel categories, kernels and NVTX ranges of a changed run, old vs new."""
    def table(r: Run, name: str, key: str) -> pd.Series | None:
        return per_step_table(r, name, key, "Total Time (ns)")

    categories = explain(table(old, "kernel_categories.csv", "Category"),
                         table(new, "kernel_categories.csv", "Category"), step_delta_ms)
    kernels = explain(table(old, "cuda_gpu_kern_sum.csv", "Name"),
                      table(new, "cuda_gpu_kern_sum.csv", "Name"), step_delta_ms)
    ro, rn, basis = range_table(old, new)
    ranges = one_sided_ranges(explain(ro, rn, step_delta_ms), ro, rn, old, new)
    kinds = {**phase_kinds(old), **phase_kinds(new)}
    ranges.insert(1, "kind", [kinds.get(str(k)) or name_kind(str(k)) for k in ranges["key"]])
    mo, mn, module_basis = module_table(old, new)
    modules = one_sided_ranges(explain(mo, mn, step_delta_ms), mo, mn, old, new, "module")
    return Explanation(categories, kernels, ranges, basis, modules, module_basis)


def one_sided_ranges(table: pd.DataFrame, old_ms: pd.Series | None, new_ms: pd.Series | None,
                     old: Run, new: Run, what: str = "range") -> pd.DataFrame:
    """A range (or module) that one side does not have is not comparable, never a -100%
    change: compiled code runs no NVTX range inside its graphs (module ranges included), so
    an eager rung's ranges are absent from a compiled one. Its ms there and its Δ are empty,
    ``comparable`` says why (empty for a key of both sides)."""
    sides = {"old": (set() if old_ms is None else set(old_ms.index), old),
             "new": (set() if new_ms is None else set(new_ms.index), new)}
    notes = []
    for key in table["key"]:
        lacking = [side for side, (keys, _) in sides.items() if key not in keys]
        notes.append(_not_comparable(what, lacking[0], sides[lacking[0]][1]) if lacking
                     else "")
    table = table.assign(comparable=notes)
    for side, (keys, _) in sides.items():
        table.loc[~table["key"].isin(keys), f"{side}_ms_per_step"] = np.nan
    gap = table["comparable"] != ""
    table.loc[gap, ["delta_ms_per_step", "share_of_change"]] = np.nan
    return pd.concat([table[~gap], table[gap]], ignore_index=True)


def _not_comparable(what: str, side: str, run: Run) -> str:
    compiled = str(run.params().get("compile", "off")) not in ("off", "None", "")
    if what == "module":
        why = ("no kernel of its compiled code traced back to it" if compiled else
               "not in its module table")
    else:
        why = ("compiled code has no NVTX ranges inside its graphs" if compiled else
               "its code does not open it")
    return f"not comparable (no such {what} in {side}: {why})"


def top_range(ranges: pd.DataFrame) -> str | None:
    """The NVTX range inside the phases (a layer, sublayer or op) whose time changed most."""
    inner = ranges[~ranges["kind"].isin(STEP_KINDS | {"phase"})]
    if "comparable" in inner:
        # read back from ranges.csv, an empty cell is NaN
        inner = inner[[empty_cell(note) or note == "" for note in inner["comparable"]]]
    return None if inner.empty else str(inner["key"].iloc[0])


def provenance_table(old: dict[str, str], new: dict[str, str]) -> pd.DataFrame:
    """One row per field, the differing ones first."""
    rows = [{"field": f, "old": old[f], "new": new[f], "differs": old[f] != new[f]}
            for f in PROVENANCE_FIELDS]
    table = pd.DataFrame(rows)
    return table.sort_values("differs", ascending=False, kind="stable").reset_index(drop=True)


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
    old_runs, new_runs = summary_runs_only(old, old_runs), summary_runs_only(new, new_runs)
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
    counts = ["old_processes", "new_processes", "old_folders", "new_folders",
              "processes_needed"]
    runs[counts] = runs[counts].astype("Int64")
    explanations = {}
    for row in runs.itertuples():
        if row.verdict in (FASTER, SLOWER):
            explanations[row.run] = explain_run(old_runs[row.run], new_runs[row.run],
                                                row.new_ms - row.old_ms)
    prov = provenance_table(side_provenance(old, old_runs), side_provenance(new, new_runs))
    return Diff(old, new, runs, prov, explanations, threshold)


def _sorted_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """Slower first (worst first), then faster, then within noise, then inconclusive, then
    failed and one-sided runs."""
    rank = runs["verdict"].map(VERDICT_ORDER).fillna(len(VERDICTS))
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
        if part in ("ranges", "modules"):
            table.insert(3, "basis", exp.range_basis if part == "ranges" else exp.module_basis)
        frames.append(table)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["run", "verdict", key, *EXPLAIN_COLUMNS[2:]])


def slower_runs(runs: pd.DataFrame, fail_pct: float) -> pd.DataFrame:
    """Runs reported ``slower`` whose step time grew by more than ``fail_pct`` percent."""
    return runs[(runs["verdict"] == SLOWER) & (runs["change_pct"] > fail_pct)]
