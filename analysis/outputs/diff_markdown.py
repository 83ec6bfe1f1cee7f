"""``analysis diff``, the pull-request comment (summary.md): the headline, provenance
differences, the step time and verdict per run, the runs of one side only, then what explains
each changed run.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis.outputs.diff_noise import FASTER, INCONCLUSIVE, MAX_PROCESSES, SLOWER, VERDICTS
from analysis.outputs.diff_rerun import COMMAND, FILE, Rerun
from analysis.outputs.diff_verdicts import STEP_KINDS, Diff, Explanation
from analysis.outputs.runs import OK

DEFAULT_TOP = 5


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


def markdown(diff: Diff, top: int = DEFAULT_TOP, rerun: Rerun | None = None) -> str:
    """The pull-request comment: provenance differences, then per-run verdicts (and the rerun
    that would judge the inconclusive ones), then what explains each changed run."""
    lines = [f"## profbench diff: `{diff.old}` → `{diff.new}`", "",
             headline(diff.runs, bold=True), ""]
    lines += _provenance_md(diff.provenance) + _timing_source_md(diff.runs)
    lines += _runs_md(diff.runs, diff.threshold, rerun) + _one_sided_md(diff.runs)
    for run, exp in diff.explanations.items():
        row = diff.runs.set_index("run").loc[run]
        lines += _explanation_md(run, row, exp, top)
    return "\n".join(lines).rstrip() + "\n"


def headline(runs: pd.DataFrame, bold: bool = False) -> str:
    """Runs matched and their verdicts, failed ones, and the runs of one side only."""
    both = runs[runs["presence"] == "both"]
    counts = both["verdict"].value_counts()
    parts = [f"{counts.get(v, 0)} {v}" for v in VERDICTS]
    only_old = int((runs["presence"] == "old_only").sum())
    only_new = int((runs["presence"] == "new_only").sum())
    matched = f"{len(both)} run{'' if len(both) == 1 else 's'} matched"
    return (f"{f'**{matched}**' if bold else matched}: {', '.join(parts)}, "
            f"{_failed(both['status'])}; {only_old} only in old, {only_new} only in new.")


def _failed(statuses: pd.Series) -> str:
    """``2 failed on both sides, 1 on the new side`` (runs.csv's status: ``old: oom; new:
    oom``), or ``0 failed``."""
    sides = [("old:" in s, "new:" in s) for s in statuses.dropna().astype(str) if s != OK]
    counts = [(sum(o and n for o, n in sides), "both sides"),
              (sum(o and not n for o, n in sides), "the old side"),
              (sum(n and not o for o, n in sides), "the new side")]
    said = [f"{k} on {where}" for k, where in counts if k]
    if not said:
        return "0 failed"
    first, *rest = said
    return ", ".join([first.replace(" on ", " failed on ", 1), *rest])


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


def _peak_md(r: Any) -> str:
    """Peak memory old → new (change), or – where a side has none (CPU runs)."""
    old, new = getattr(r, "old_peak_gib", None), getattr(r, "new_peak_gib", None)
    if old is None or new is None or pd.isna(old) or pd.isna(new):
        return "–"
    return f"{old:.2f} → {new:.2f} ({(new / old - 1) * 100:+.0f}%)"


def _runs_md(runs: pd.DataFrame, threshold: float, rerun: Rerun | None) -> list[str]:
    both = runs[runs["presence"] == "both"]
    rows = []
    for r in both.itertuples():
        if r.status != OK:
            rows.append([f"`{r.run}`", "–", "–", "–", "–", "–", f"failed ({r.status})",
                         "–", _cell(r.params_changed or "", 40)])
            continue
        rows.append([
            f"`{r.run}`", _ci_ms(r.old_ms, r.old_ci_low_ms, r.old_ci_high_ms),
            _ci_ms(r.new_ms, r.new_ci_low_ms, r.new_ci_high_ms), _pct(r.change_pct),
            f"{r.speedup:.3f} [{r.speedup_ci_low:.3f}, {r.speedup_ci_high:.3f}]",
            f"{r.noise_floor_pct:.0f}%", _verdict_md(r.verdict, r.processes_needed),
            _peak_md(r),
            _cell(r.params_changed or "", 40),
        ])
    header = ["run", "old ms [95% CI]", "new ms [95% CI]", "change", "old/new [95% CI]",
              "noise floor", "verdict", "peak GiB old → new", "changed params"]
    note = ("Verdict: `slower`/`faster` only when the two 95% CIs do not overlap **and** the "
            "change (as a factor, new/old or old/new, minus 1) exceeds the run's noise floor: "
            f"the largest of the threshold ({threshold:.0%}), either side's relative CI "
            "half-width and either side's process noise (99% Student-t half-width over its "
            "per-process medians); or when every process of one side is slower than every "
            "process of the other by more than the threshold, the CI half-widths and either "
            "side's own process spread (`process_gap_pct` in runs.csv); "
            "otherwise `within noise` (not shown to have changed, and a change above the "
            "threshold would have cleared the floor) or `inconclusive` (the floor is above the "
            "threshold: the run cannot show a change of the threshold's size).")
    return ["### Step time per run", "", *_table(header, rows), "", note, "",
            *_inconclusive_md(both, threshold, rerun)]


def _inconclusive_md(both: pd.DataFrame, threshold: float, rerun: Rerun | None) -> list[str]:
    """What would make the inconclusive runs judgeable: more timing processes, as rerun.yaml
    has them."""
    runs = both[both["verdict"] == INCONCLUSIVE]
    if runs.empty:
        return []
    said = [f"**{len(runs)} inconclusive**: their processes spread (or their steps scatter) "
            f"too much to show a {threshold:.0%} change."]
    if rerun is not None:
        said.append(f"`{FILE}` (beside this file) reruns {len(rerun.needs)} of them with "
                    f"`timing: {{repeats: {rerun.repeats}}}`: on each side, "
                    f"`{COMMAND.format(config='CONFIG', fragment=FILE)}` with the side's "
                    "config, then diff again.")
        if rerun.capped:
            said.append(f"{len(rerun.capped)} need more than {rerun.repeats} processes "
                        "(`processes_needed` in runs.csv) and may stay inconclusive.")
    return [" ".join(said) + " Or compare at a larger `--threshold`.", ""]


def _ci_ms(ms: float, low: float, high: float) -> str:
    return f"{_ms(ms)} [{_ms(low)}, {_ms(high)}]"


def _verdict_md(verdict: str, processes_needed: float | None = None) -> str:
    """The verdict's cell; an inconclusive run's says how many processes would judge it."""
    if verdict == INCONCLUSIVE:
        needs = (f"{int(processes_needed)} processes" if pd.notna(processes_needed)
                 else f"> {MAX_PROCESSES} processes")
        return f"inconclusive (needs {needs})"
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
    if not exp.modules.empty:  # a model workload: by module path, eager or compiled
        lines += _part_md(f"Top modules ({exp.module_basis.upper()} ms per step by module "
                          "path, from module ranges or compiled kernels' provenance)",
                          exp.modules, top, "module")
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
    if table.empty or not (table[["old_ms_per_step", "new_ms_per_step"]].fillna(0).to_numpy()
                           > 0).any():
        return [f"*{title}*: none recorded on either side.", ""]
    rows = [[_cell(r.key), _ms(r.old_ms_per_step), _ms(r.new_ms_per_step),
             *_delta_cells(r)] for r in table.head(top).itertuples()]
    header = [key, "old ms/step", "new ms/step", "Δ ms/step", "share of Δ"]
    return [f"*{title}*", "", *_table(header, rows), ""]


def _delta_cells(row: object) -> list[str]:
    """Δ and its share, or why there is none (a range on one side only: never a -100%)."""
    note = getattr(row, "comparable", "")
    if isinstance(note, str) and note:
        return [note, "–"]
    return [f"{row.delta_ms_per_step:+.3g}", _share(row.share_of_change)]


def _share(value: float | None) -> str:
    return "–" if value is None or pd.isna(value) else f"{value:.0%}"
