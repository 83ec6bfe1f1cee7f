"""``analysis diff``'s advice for the runs it could not judge, as a config fragment to run:
``rerun.yaml`` beside runs.csv selects the ``inconclusive`` runs (``select``) and gives them
the timing processes that would judge them (``timing: {repeats: N}``).

Each side reruns with its own config and the fragment after it; Snakemake merges the second
``--configfile`` into the first, key by key, so the runs, results folder and every other
setting stay the side's:

    .venv/bin/snakemake --cores N --configfile OLD_CONFIG DIR/rerun.yaml --forcerun time_run
    .venv/bin/snakemake --cores N --configfile NEW_CONFIG DIR/rerun.yaml --forcerun time_run

``select`` leaves only those runs' jobs in the plan, so ``--forcerun time_run`` reruns their
timing jobs alone (records r0..rN-1 replace the old ones), also in a folder copied without
Snakemake's records of what ran (there a missing r3.json alone reruns nothing); the other runs
keep their records and their summary rows (docs/diff.md, "More processes on demand").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from analysis.outputs.diff_noise import INCONCLUSIVE, MAX_PROCESSES

FILE = "rerun.yaml"
# after the side's own config; --forcerun: select has left only the runs to rerun
COMMAND = ".venv/bin/snakemake --cores N --configfile {config} {fragment} --forcerun time_run"
# The most processes the advice asks for: a run that needs more (or more than MAX_PROCESSES)
# is rerun with this many, which also re-estimates its spread from more than three processes.
DEFAULT_MAX_REPEATS = 20


@dataclass(frozen=True)
class Rerun:
    """What the inconclusive runs need: the run names to select (both names of a ``--pair``),
    the processes per run and side, and each run's own need (None: more than
    :data:`MAX_PROCESSES`). ``left_out``: inconclusive runs whose sides already have
    ``repeats`` processes or more (more processes of the same steps would not help)."""

    select: list[str]
    repeats: int
    needs: dict[str, int | None]
    left_out: list[str] = field(default_factory=list)

    @property
    def capped(self) -> list[str]:
        """The runs that need more processes than ``repeats``."""
        return [r for r, n in self.needs.items() if n is None or n > self.repeats]


def advice(runs: pd.DataFrame, max_repeats: int = DEFAULT_MAX_REPEATS) -> Rerun | None:
    """The rerun that would judge ``runs.csv``'s inconclusive runs: ``timing: {repeats: N}``
    with N their largest ``processes_needed``, at most ``max_repeats``; None when no run is
    inconclusive or none would get more processes than it has."""
    if max_repeats < 2:
        raise ValueError(f"--max-repeats {max_repeats}: at least 2 processes a side")
    unjudged = runs[(runs["presence"] == "both") & (runs["verdict"] == INCONCLUSIVE)]
    needs = {str(r.run): (None if pd.isna(r.processes_needed) else int(r.processes_needed))
             for r in unjudged.itertuples()}
    if not needs:
        return None
    repeats = min(max_repeats, max(max_repeats if n is None else n for n in needs.values()))
    has = dict(zip(unjudged["run"].astype(str), unjudged[["old_processes", "new_processes"]]
                   .max(axis=1).astype(int), strict=True))
    chosen = [r for r in needs if has[r] < repeats]
    if not chosen:
        return None
    select = [name for label in chosen for name in dict.fromkeys(label.split("="))]
    return Rerun(select=select, repeats=repeats, needs={r: needs[r] for r in chosen},
                 left_out=[r for r in needs if r not in chosen])


def fragment(rerun: Rerun, outdir: Path, threshold: float) -> str:
    """rerun.yaml's text: what it is and how to run it (comments), then the two keys."""
    needs = ", ".join(f"{r} {n if n is not None else f'more than {MAX_PROCESSES}'}"
                      for r, n in rerun.needs.items())
    lines = [
        f"# analysis diff: {len(rerun.needs)} run(s) inconclusive at the {threshold:.0%} "
        "threshold (docs/diff.md).",
        "# Rerun them on each side with more timing processes, the side's config first,",
        "# then diff again:",
        f"#   {COMMAND.format(config='OLD_CONFIG', fragment=outdir / FILE)}",
        f"#   {COMMAND.format(config='NEW_CONFIG', fragment=outdir / FILE)}",
        f"# processes_needed: {needs}",
    ]
    if rerun.capped:
        lines.append(f"# capped at {rerun.repeats} (--max-repeats): "
                     f"{', '.join(rerun.capped)} may stay inconclusive")
    if rerun.left_out:
        lines.append(f"# not rerun (already {rerun.repeats} processes or more): "
                     f"{', '.join(rerun.left_out)}")
    keys = {"select": rerun.select, "timing": {"repeats": rerun.repeats}}
    return "\n".join(lines) + "\n" + yaml.safe_dump(keys, default_flow_style=None,
                                                    sort_keys=False)


def write_rerun(runs: pd.DataFrame, outdir: Path, threshold: float,
                max_repeats: int = DEFAULT_MAX_REPEATS) -> Rerun | None:
    """Write ``outdir/rerun.yaml`` when a rerun would judge runs; remove an earlier one
    otherwise (a diff folder written again must not keep stale advice)."""
    rerun = advice(runs, max_repeats)
    path = outdir / FILE
    if rerun is None:
        path.unlink(missing_ok=True)
        return None
    path.write_text(fragment(rerun, outdir, threshold))
    return rerun
