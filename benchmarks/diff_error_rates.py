"""How often ``analysis diff``'s verdict is wrong, and how often it sees a known change.

    python benchmarks/diff_error_rates.py [OLD NEW]     # recorded runs, changes applied to NEW
    python benchmarks/diff_error_rates.py --runs WORKDIR   # real CPU runs with known delays
    python benchmarks/diff_error_rates.py --on-demand WORKDIR   # the same, after the reruns

Recorded runs: OLD and NEW are two results folders of the same config on the same GPU and
software (by default the two published runs of the standard config on one H100:
tests/fixtures/published/h100-standard-efb5638 and published/h100/standard). Every run that
finished on both sides is an A/A pair. A known change is the same pair with every step of NEW
made slower by a factor (5%, 10%, 15%, 20%): the processes keep their real noise, and the
change is known exactly.

Real runs (``--runs``): the folders benchmarks/diff_cpu_runs.py made, the same CPU config run
three times (three A/A folder pairs) and with 5%, 10% and 20% delays (each against each A/A
folder), every pair diffed by ``python -m analysis diff`` as a user runs it; its runs.csv is
what is counted.

On demand (``--on-demand``): the same pairs after ``diff_cpu_runs.py --rerun`` followed each
pair's ``rerun.yaml``: a pair whose diff asked for N processes of some runs is diffed again
with those runs' first N rerun records on both sides, its other runs as they were (three
processes); the rates are over all pairs, and the runs that stay inconclusive are named with
their process counts.

Counted, at the default threshold: on A/A pairs any ``slower`` or ``faster`` is a false
verdict; on a known slowdown ``slower`` is a detection, over all pairs and over the
*judgeable* ones (noise floor at the threshold, so not ``inconclusive``).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's analysis package, wherever it runs from
from analysis.outputs.diff_load import find_runs, summary_runs_only  # noqa: E402
from analysis.outputs.diff_noise import (  # noqa: E402
    FASTER,
    INCONCLUSIVE,
    SLOWER,
    floor_rule,
    gap_rule,
    judgeable,
    verdict,
)
from analysis.outputs.diff_verdicts import DEFAULT_THRESHOLD_PCT, side_stats  # noqa: E402
from analysis.outputs.runs import OK  # noqa: E402
from benchmarks.diff_cpu_runs import folder_pairs  # noqa: E402

DEFAULT = (REPO / "tests/fixtures/published/h100-standard-efb5638",
           REPO / "published/h100/standard")
CHANGES = (1.05, 1.10, 1.15, 1.20)
THRESHOLD = DEFAULT_THRESHOLD_PCT / 100


@dataclass
class Tally:
    """Verdicts of one set of pairs: how many, how many judgeable, the verdicts' names."""

    pairs: int = 0
    judgeable: int = 0
    hits: list[str] = field(default_factory=list)  # slower/faster (A/A) or slower (change)
    judgeable_hits: int = 0
    inconclusive: int = 0

    def add(self, name: str, hit: bool, is_judgeable: bool, reading: str) -> None:
        self.pairs += 1
        self.judgeable += is_judgeable
        self.hits += [name] if hit else []
        self.judgeable_hits += hit and is_judgeable
        self.inconclusive += reading == INCONCLUSIVE

    def false_line(self) -> str:
        return (f"{len(self.hits)} false of {self.pairs} ({_rate(len(self.hits), self.pairs)})"
                f"; inconclusive {self.inconclusive}: {', '.join(self.hits) or 'none'}")

    def power_line(self) -> str:
        return (f"read slower in {len(self.hits)} of {self.pairs} "
                f"({_rate(len(self.hits), self.pairs)}); of the {self.judgeable} judgeable: "
                f"{self.judgeable_hits} ({_rate(self.judgeable_hits, self.judgeable)})")


def _rate(k: int, n: int) -> str:
    return f"{k / n:.0%}" if n else "-"


# --- recorded runs, a known factor applied to NEW ------------------------------------------


def pairs(old: Path, new: Path) -> dict[str, tuple[list[list[float]], list[list[float]]]]:
    """Run name -> (old, new) per-process step times, for every run ok on both sides."""
    a, b = (summary_runs_only(p, find_runs(p)) for p in (old, new))
    out = {}
    for name in sorted(set(a) & set(b)):
        (ta, _), (tb, _) = a[name].timing(), b[name].timing()
        if ta.status == OK and tb.status == OK:
            out[name] = (ta.per_process_ms, tb.per_process_ms)
    return out


def recorded(old: Path, new: Path) -> None:
    """Print the rates on two recorded folders, the rules apart and the verdict."""
    found = pairs(old, new)
    print(f"{len(found)} A/A pairs ({old.name} vs {new.name}), threshold {THRESHOLD:.0%}")
    rules = {"verdict": lambda o, n: verdict(o, n, THRESHOLD) in (SLOWER, FASTER),
             "CIs apart beyond the noise floor": lambda o, n: floor_rule(o, n, THRESHOLD) != 0,
             "processes apart": lambda o, n: gap_rule(o, n, THRESHOLD) != 0}
    for rule, changed in rules.items():
        tally = Tally()
        for name, (a, b) in found.items():
            o, n = side_stats(a)[0], side_stats(b)[0]
            tally.add(name, changed(o, n), judgeable(o, n, THRESHOLD), verdict(o, n, THRESHOLD))
        print(f"  A/A, {rule}: {tally.false_line()}")
    for factor in CHANGES:
        tally = Tally()
        for name, (a, b) in found.items():
            o = side_stats(a)[0]
            n = side_stats([[ms * factor for ms in process] for process in b])[0]
            reading = verdict(o, n, THRESHOLD)
            tally.add(name, reading == SLOWER, judgeable(o, n, THRESHOLD), reading)
        print(f"  NEW {factor - 1:.0%} slower: {tally.power_line()}")


# --- real runs: `python -m analysis diff` on the folders of diff_cpu_runs.py -----------------


def results(workdir: Path, folder: str) -> Path:
    """A folder's results: ``<folder>/results`` as the pipeline ran, or ``<folder>`` itself
    (the tests' copy, tests/fixtures/diff-cpu)."""
    ran = workdir / folder / "results"
    return ran if ran.is_dir() else workdir / folder


def diff_runs(workdir: Path, old: str, new: str, scratch: Path) -> pd.DataFrame:
    """runs.csv of ``python -m analysis diff`` OLD NEW (runs ok on both sides)."""
    return diff_folders(results(workdir, old), results(workdir, new), scratch / f"{old}-{new}")


def diff_folders(old: Path, new: Path, out: Path) -> pd.DataFrame:
    """runs.csv of ``python -m analysis diff OLD NEW -o OUT``, the runs ok on both sides."""
    subprocess.run([sys.executable, "-m", "analysis", "diff", str(old), str(new), "-o",
                    str(out)], cwd=REPO, check=True, capture_output=True)
    runs = pd.read_csv(out / "runs.csv")
    return runs[(runs["presence"] == "both") & (runs["status"] == OK)]


def tally_runs(frames: list[pd.DataFrame], hit: tuple[str, ...]) -> dict[str, Tally]:
    """Per kind of run (the name's first part: sleep, mlp) and over all."""
    tallies: dict[str, Tally] = {}
    for runs in frames:
        for r in runs.itertuples():
            is_judgeable = r.noise_floor_pct <= DEFAULT_THRESHOLD_PCT
            for key in (r.run.split("_")[0], "all"):
                tallies.setdefault(key, Tally()).add(r.run, r.verdict in hit, is_judgeable,
                                                     r.verdict)
    return dict(sorted(tallies.items(), key=lambda kv: (kv[0] == "all", kv[0])))


def real_runs(workdir: Path) -> None:
    """Print the rates on the A/A and delayed CPU folders of ``workdir``."""
    manifest = json.loads((workdir / "manifest.json").read_text())
    aa = manifest["aa"]
    print(f"{workdir}: A/A folders {', '.join(aa)}; threshold {THRESHOLD:.0%}")
    with tempfile.TemporaryDirectory() as scratch:
        frames = [diff_runs(workdir, a, b, Path(scratch))
                  for a, b in itertools.combinations(aa, 2)]
        for kind, tally in tally_runs(frames, (SLOWER, FASTER)).items():
            print(f"  A/A, {kind}: {tally.false_line()}")
        for folder, delay in manifest["delayed"].items():
            frames = [diff_runs(workdir, a, folder, Path(scratch)) for a in aa]
            for kind, tally in tally_runs(frames, (SLOWER,)).items():
                print(f"  {delay:.0%} delay, {kind}: {tally.power_line()}")


# --- on demand: the pairs after following their rerun.yaml -----------------------------------


def rerun_view(workdir: Path, folder: str, keys: dict | None, dest: Path) -> Path:
    """The folder as a user holds it after following ``keys`` (a pair's rerun.yaml): its
    three-process results, the selected runs' timing replaced by the first ``repeats`` records
    of the rerun (diff_cpu_runs.py --rerun ran them one after another)."""
    shutil.copytree(workdir / folder / "results-3", dest)
    for run in (keys or {}).get("select", []):
        timing, rerun = dest / run / "timing", workdir / folder / "results" / run / "timing"
        shutil.rmtree(timing)
        timing.mkdir()
        for i in range(keys["timing"]["repeats"]):  # fails loudly if the rerun has fewer
            shutil.copy(rerun / f"r{i}.json", timing / f"r{i}.json")
    return dest


def on_demand(workdir: Path) -> None:
    """Print the rates over all pairs after each pair's rerun, and what stays inconclusive."""
    manifest = json.loads((workdir / "manifest.json").read_text())
    advice, cap = manifest["on_demand"]["advice"], manifest["on_demand"]["max_repeats"]
    print(f"{workdir}: on demand (rerun.yaml followed, at most {cap} processes); "
          f"threshold {THRESHOLD:.0%}")
    frames: dict[str, list[pd.DataFrame]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for old, new in folder_pairs(manifest):
            keys, pair = advice[f"{old}-{new}"], Path(scratch) / f"{old}-{new}"
            runs = diff_folders(rerun_view(workdir, old, keys, pair / "old"),
                                rerun_view(workdir, new, keys, pair / "new"), pair / "diff")
            kind = "A/A" if new in manifest["aa"] else f"{manifest['delayed'][new]:.0%} delay"
            frames.setdefault(kind, []).append(runs.assign(pair=f"{old}-{new}"))
    for kind, runs in frames.items():
        hit = (SLOWER, FASTER) if kind == "A/A" else (SLOWER,)
        for part, tally in tally_runs(runs, hit).items():
            print(f"  {kind}, {part}: "
                  f"{tally.false_line() if kind == 'A/A' else tally.power_line()}")
        left = pd.concat(runs).query("verdict == @INCONCLUSIVE")
        print(f"  {kind}, still inconclusive: {len(left)}: " + (", ".join(
            f"{r.pair} {r.run} ({r.old_processes}+{r.new_processes} processes, needs "
            f"{'>100' if pd.isna(r.processes_needed) else int(r.processes_needed)})"
            for r in left.itertuples()) or "none"))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--runs"]:
        real_runs(Path(argv[1]))
        return 0
    if argv[:1] == ["--on-demand"]:
        on_demand(Path(argv[1]))
        return 0
    old, new = (Path(p) for p in argv) if len(argv) == 2 else DEFAULT
    recorded(old, new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
