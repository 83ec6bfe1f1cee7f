"""The findings framework: what a finding is, the results folder the rules read, the measured
gain of a fix and the order of the findings. The rules live in ``findings.py`` (one process)
and ``comm_findings.py`` (distributed runs); both import this module, never each other.

A measured gain names every key in which the measuring run differs from the finding's run
(``gain_changes``). When those differences are more than one recommended change (the keys of
one :class:`Fix`), the gain is a JOINT gain: ``joint_keys`` names what goes beyond the fix, the
sentence says "joint gain" and lists every difference, and ``single_gains`` quotes the gain of
each applied fix alone where the run's ladder has a rung that makes only that change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.outputs.runs import OK, empty_cell, read_json, read_timing
from analysis.outputs.speedup import speedup_row

SUMMARY = "summary.csv"
PHASE_TABLE = "phase_gpu_time"
STEP_RANGE = "profiled_step"
# Keys that set how a run is measured, not what it computes: never a difference between runs.
MEASUREMENT_KEYS = ("warmup", "steps", "seed", "out", "op_ranges", "memory_limit_mb",
                    "peak_tflops")
ON = "on"  # a Fix value: the key set to anything but off
# What a finding is about: the workload (what to change in it) or the measurement (how far to
# trust the numbers). Measurement findings come after every workload finding.
WORKLOAD, MEASUREMENT = "workload", "measurement"
SEVERITY_ORDER = {"high": 0, "medium": 1, "info": 2}


@dataclass(frozen=True)
class Fix:
    """One thing to change: how to say it, and the run keys that apply it (key -> accepted
    values, or ``ON``). ``also``: other key sets that already give what it gives (a whole-step
    graph already has the step in CUDA graphs); ``companions``: keys that go with the fix
    (the SDPA backend with SDPA), part of it when a variant changes them too."""

    text: str
    keys: dict[str, Any]
    also: tuple[dict[str, Any], ...] = ()
    companions: tuple[str, ...] = ()

    def applied(self, params: dict[str, Any]) -> bool:
        return any(all(_matches(params.get(k), v) for k, v in keys.items())
                   for keys in (self.keys, *self.also))

    @property
    def all_keys(self) -> set[str]:
        return {k for keys in (self.keys, *self.also) for k in keys} | set(self.companions)


def _matches(value: Any, accepted: Any) -> bool:
    if accepted == ON:
        return value not in (None, "off", False)
    return value in accepted


@dataclass
class Finding:
    rule: str
    run: str
    title: str
    value: float
    threshold: float  # in the unit of value
    source: str  # CSV path relative to the results folder
    key_column: str
    key: str
    value_column: str
    fix: str
    severity: str = "medium"
    gain_run: str | None = None
    gain: float | None = None
    gain_ci_low: float | None = None
    gain_ci_high: float | None = None
    gain_significant: bool | None = None
    # the gain run's differences beyond the fix ("key=value; ..."): the gain is a joint gain
    joint_keys: str | None = None
    # every key in which the gain run differs from the run ("key=value; ...")
    gain_changes: str | None = None
    # the run keys of each recommended fix: alternatives "a,b | c"
    fix_keys: str | None = None
    # each applied fix alone, from a rung of the run's ladder that makes only that change:
    # "<rung> vs <previous rung> (key=value, ...): 1.23× (95% CI 1.10-1.35); ..."
    single_gains: str | None = None
    about: str = WORKLOAD

    @property
    def joint(self) -> bool:
        return bool(self.joint_keys)


def present(params: dict[str, Any]) -> dict[str, Any]:
    """A summary row as parameters: empty cells (NaN) are unset keys, not values."""
    return {k: v for k, v in params.items() if not empty_cell(v)}


def ok_runs(summary: pd.DataFrame) -> list[str]:
    """The runs that finished. A summary without a status column is from before failed runs
    got rows of their own: each of its rows is a finished run."""
    if "status" not in summary:
        return [str(r) for r in summary["run"]]
    return [str(r) for r in summary.loc[summary["status"] == OK, "run"]]


def changes_text(changes: dict[str, tuple[Any, Any]], sep: str = "; ") -> str:
    """``key=new value`` for each changed key."""
    return sep.join(f"{k}={new}" for k, (_, new) in changes.items())


class Context:
    """One results folder: the summary and lazily read per-run CSVs."""

    def __init__(self, results: Path, summary: pd.DataFrame) -> None:
        self.results = results
        self.summary = summary
        self.by_run = summary.set_index("run")
        self._params: dict[str, dict[str, Any]] = {}

    def stats(self, run: str, name: str) -> pd.DataFrame | None:
        path = self.results / run / "stats" / f"{name}.csv"
        try:
            return pd.read_csv(path)
        except (OSError, pd.errors.EmptyDataError):
            return None

    def cell(self, run: str, column: str) -> Any:
        value = self.by_run.loc[run].get(column) if run in self.by_run.index else None
        return None if empty_cell(value) else value

    def category_share(self, run: str, category: str) -> float | None:
        table = self.stats(run, "kernel_categories")
        if table is None:
            return None
        row = table.loc[table["Category"] == category, "Time (%)"]
        return float(row.iloc[0]) if len(row) else None

    def on_cpu(self, run: str) -> bool:
        """Whether the run was timed on the CPU (host clock, no GPU): its findings then say
        nothing of a GPU."""
        return self.cell(run, "timer") == "wall"

    def has_gpu_time(self, run: str) -> bool:
        """Whether the capture holds GPU kernels (a CPU run's has none)."""
        return bool(self.cell(run, "kernel_time_ns"))

    def cpu_range(self, run: str, name: str) -> tuple[float, float] | None:
        """An NVTX range's CPU ms per step and the step's, from the phase table: where a run
        without GPU time spends its step."""
        table = self.stats(run, PHASE_TABLE)
        if table is None or "CPU ms/step" not in table:
            return None
        ms = table.set_index("Range")["CPU ms/step"]
        if name not in ms.index or STEP_RANGE not in ms.index:
            return None
        value, step = ms[name], ms[STEP_RANGE]
        if empty_cell(value) or empty_cell(step) or not step > 0:
            return None
        return float(value), float(step)

    @cached_property
    def plan(self) -> dict[str, Any]:
        return read_json(self.results / "plan.json") or {}

    @cached_property
    def finished(self) -> set[str]:
        return set(ok_runs(self.summary))

    def params(self, run: str) -> dict[str, Any]:
        """The run's keys as its workload ran them (defaults included): the first timing
        record's, else the traced record's, else the plan's, else the summary row's."""
        if run not in self._params:
            timing = read_timing(self.results / run)
            records = timing.ok_records or timing.records
            record = records[0] if records else read_json(self.results / run / "times.json")
            if record and record.get("params"):
                params = {"workload": record.get("workload"), **record["params"]}
            elif run in self.plan.get("runs", {}):
                params = dict(self.plan["runs"][run].get("params", {}))
            elif run in self.by_run.index:
                params = present(self.by_run.loc[run].to_dict())
            else:
                params = {}
            self._params[run] = {k: v for k, v in params.items() if k not in MEASUREMENT_KEYS}
        return self._params[run]

    def changed_keys(self, run: str, other: str) -> dict[str, tuple[Any, Any]]:
        """key -> (this run's value, the other's), for every key the two runs differ in."""
        a, b = self.params(run), self.params(other)
        return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}

    def ladder_rungs(self, run: str) -> list[str]:
        """The finished rungs of the run's ladder (its group), in rung order; [] outside one."""
        if run not in self.by_run.index or "ladder" not in self.summary:
            return []
        info = self.by_run.loc[run]
        if not isinstance(info.get("ladder"), str):
            return []
        same = self.summary[(self.summary["ladder"] == info["ladder"])
                            & (self.summary["ladder_group"] == info["ladder_group"])]
        return [r for r in same.sort_values("rung_index")["run"].astype(str)
                if r in self.finished]

    def related(self, run: str) -> list[str]:
        """Runs configured as this run's next steps: the later rungs of its ladder (nearest
        first), then the candidates of comparisons whose baseline it is."""
        rungs = self.ladder_rungs(run)
        out = rungs[rungs.index(run) + 1:] if run in rungs else []
        return out + [c["b"] for c in self.plan.get("comparisons", []) if c["a"] == run]

    def fix_variant(self, run: str, fixes: list[Fix]) -> str | None:
        """The measured run that applies one of ``fixes`` to this one: a run differing in one
        fix's keys only (anywhere in the results), else the related run (ladder, comparison)
        with the fewest differences, then the nearest."""
        related = [r for r in self.related(run) if r in self.finished]
        best: tuple[tuple[int, int, int], str] | None = None
        for rank, other in enumerate([*related, *sorted(self.finished - set(related) - {run})]):
            applied = [f for f in fixes if f.applied(self.params(other))]
            if not applied:
                continue
            changed = set(self.changed_keys(run, other))
            alone = any(changed <= f.all_keys for f in applied)
            if not alone and other not in related:
                continue  # an unrelated run that differs in more than the fix proves nothing
            key = (0 if alone else 1, len(changed), rank)
            if best is None or key < best[0]:
                best = (key, other)
        return None if best is None else best[1]

    def single_gains(self, run: str, fixes: list[Fix], changed: Iterable[str]) -> list[str]:
        """Each fix alone, from a rung of the run's ladder that applies it and changes nothing
        else than its keys (keys the measuring run also ``changed``) over the rung before."""
        rungs, changed = self.ladder_rungs(run), set(changed)
        out = []
        for fix in fixes:
            for before, rung in zip(rungs, rungs[1:], strict=False):
                diff = self.changed_keys(before, rung)
                if not diff or not set(diff) <= fix.all_keys & changed:
                    continue
                if fix.applied(self.params(before)) or not fix.applied(self.params(rung)):
                    continue
                row = speedup_row(self.results / before, self.results / rung)
                if row["status"] == OK:
                    out.append(f"{rung} vs {before} ({changes_text(diff, ', ')}): "
                               f"{row['speedup']:.2f}× (95% CI {row['speedup_ci_low']:.2f}-"
                               f"{row['speedup_ci_high']:.2f})")
                    break
        return out


def fix_keys_text(fixes: list[Fix]) -> str:
    return " | ".join(",".join(sorted(f.all_keys)) for f in fixes)


def measure_gain(ctx: Context, f: Finding, variant: str, fixes: list[Fix]) -> Finding:
    """``f`` with the measured speed-up of ``variant`` over its run, every key the two differ
    in, and, when that is more than one of ``fixes``, what makes it a joint gain and each
    applied fix's gain alone where the run's ladder has it."""
    f.fix_keys = fix_keys_text(fixes)
    row = speedup_row(ctx.results / f.run, ctx.results / variant)
    if row["status"] != OK:
        return f
    f.gain_run, f.gain = variant, row["speedup"]
    f.gain_ci_low, f.gain_ci_high = row["speedup_ci_low"], row["speedup_ci_high"]
    f.gain_significant = bool(row["significant"])
    changed = ctx.changed_keys(f.run, variant)
    f.gain_changes = changes_text(changed) or None
    applied = [x for x in fixes if x.applied(ctx.params(variant))]
    covered = max((x.all_keys & set(changed) for x in applied), key=len, default=set())
    beyond = {k: v for k, v in changed.items() if k not in covered}
    f.joint_keys = changes_text(beyond) or None
    if beyond:
        f.single_gains = "; ".join(ctx.single_gains(f.run, applied, changed)) or None
    return f


def with_gain(ctx: Context, f: Finding, fixes: list[Fix]) -> Finding:
    """``f`` with the gain of the best variant that applies one of ``fixes``, if measured."""
    f.fix_keys = fix_keys_text(fixes)
    variant = ctx.fix_variant(f.run, fixes)
    return f if variant is None else measure_gain(ctx, f, variant, fixes)


def recommend(ctx: Context, f: Finding, fixes: list[Fix]) -> Finding | None:
    """``f`` with the fixes the run does not have yet (None when it has them all) and the
    measured gain of the best variant that applies one of them."""
    todo = [x for x in fixes if not x.applied(ctx.params(f.run))]
    if fixes and not todo:
        return None
    if todo:
        f.fix = " or ".join(x.text for x in todo)
        with_gain(ctx, f, todo)
    return f


Rule = Callable[[Context, str], Iterator[Finding]]


def run_rules(results: Path, summary: pd.DataFrame, rules: Iterable[Rule]) -> list[Finding]:
    """Every rule over every finished run, in :func:`rank` order."""
    ctx = Context(results, summary)
    rules = list(rules)
    out = [f for run in ok_runs(summary) for rule in rules for f in rule(ctx, run)]
    return sorted(out, key=rank)


def rank(f: Finding) -> tuple[int, int, int, float]:
    """Workload findings before measurement ones; then severity; then a gain measured for the
    fix alone, a joint gain, no gain; then the larger gain."""
    evidence = 2 if f.gain is None else (1 if f.joint else 0)
    return (int(f.about == MEASUREMENT), SEVERITY_ORDER[f.severity], evidence, -(f.gain or 0))


def findings_table(findings: list[Finding]) -> pd.DataFrame:
    columns = list(Finding.__dataclass_fields__)
    return pd.DataFrame([asdict(f) for f in findings], columns=columns)


def finding_sentence(f: Finding) -> str:
    """One line for the report: what, where, the fix, and its measured gain with every key the
    measuring run changed (a joint gain when that is more than the fix)."""
    text = f"**{f.run}**: {f.title} → {f.fix}"
    if f.gain is not None:
        sig = "" if f.gain_significant else ", not significant"
        changes = (f.gain_changes or "").replace("; ", ", ")
        text += (f"; measured: **{f.gain:.2f}×** faster in `{f.gain_run}` "
                 f"(95% CI {f.gain_ci_low:.2f}–{f.gain_ci_high:.2f}{sig})")
        if f.joint:
            text += f", a **joint gain** of every difference: {changes}"
            if f.single_gains:
                text += f"; the fix alone in this ladder: {f.single_gains}"
        elif changes:
            text += f", which differs only in {changes}"
    return text + f" [`{f.source}` {f.key_column}={f.key} {f.value_column}]"
