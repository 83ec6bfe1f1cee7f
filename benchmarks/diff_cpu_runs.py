"""Real pipeline runs on the CPU for measuring ``analysis diff``: the same config run several
times (A/A pairs) and with known delays (5%, 10%, 20%), one results folder each.

    python benchmarks/diff_cpu_runs.py [WORKDIR]        # default results/diff-cpu
    python benchmarks/diff_cpu_runs.py --rerun WORKDIR [MAX_REPEATS]   # on demand, default 12
    python benchmarks/diff_cpu_runs.py --fixture WORKDIR DEST   # the tests' subset
    python benchmarks/diff_cpu_runs.py --rerun-fixture WORKDIR DEST   # ... after --rerun

Two kinds of run, three untraced timing processes each (``timing: {repeats: 3}``, the GPU
default), no capture:

* ``sleep_<ms>``: the ``sleep`` workload; its delayed twin sleeps ``step_ms`` x (1 + delay).
  The change is exact and the step barely noisy (the rule's mechanics, on real processes).
* ``mlp_<width>``: a small MLP trained on the CPU (``workload: model``, the factory
  benchmarks/diff_delay_model.py): real matrix work with this CPU's own noise; its delayed
  twin sleeps ``delay x`` the A/A folders' median step in every forward (a fixed extra cost,
  as a regression adds).

Writes ``WORKDIR/<folder>/results`` for folders ``aa1..aa3`` (the unchanged config) and
``d05``, ``d10``, ``d20``, and ``WORKDIR/manifest.json`` (each folder's known change), which
``benchmarks/diff_error_rates.py --runs WORKDIR`` reads. An existing folder is kept: a rerun
only adds what is missing.

``--rerun`` follows the diff's own advice for the pairs it could not judge ("more processes
on demand", docs/diff.md): each folder's three-process results are kept as
``<folder>/results-3``; every pair (each A/A pair, each A/A folder against each delayed one)
is diffed by ``python -m analysis diff --max-repeats MAX_REPEATS`` into
``WORKDIR/advice/<old>-<new>/``, whose ``rerun.yaml`` names the runs to rerun and the
processes; each folder then runs the pipeline once more with its config and a fragment of
the same two keys, the runs any of its pairs asked for and the most processes any asked for
(``<folder>/rerun.yaml``). A pair that asked for N processes is then judged on the first N
records of each rerun run (``diff_error_rates.py --on-demand``): what a rerun with N
processes records, as processes run one after another.

``--fixture`` copies a few runs of four folders (the timing records, plan.json, their summary
rows) to ``DEST/<folder>/``: tests/fixtures/diff-cpu, which tests/test_diff.py diffs.
``--rerun-fixture`` copies one run of an A/A pair and a delayed folder, before and after
``--rerun``: tests/fixtures/diff-cpu-rerun.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parent.parent
# importable by its module name: the jobs run with the checkout on PYTHONPATH
FACTORY = "benchmarks.diff_delay_model:make"
# how runs made before the module form named it (the tests' copy is rewritten to FACTORY)
FACTORY_PATH = f"{REPO / 'benchmarks' / 'diff_delay_model.py'}:make"
SLEEP_MS = (5, 10, 20, 40)
MLP_WIDTHS = (128, 192, 256, 384, 512, 768)
MLP_BATCH = 64
AA_FOLDERS = ("aa1", "aa2", "aa3")
DELAYS = {"d05": 0.05, "d10": 0.10, "d20": 0.20}
REPEATS = 3
FIXTURE_FOLDERS = ("aa1", "aa2", "d10", "d20")
FIXTURE_RUNS = ("sleep_10", "sleep_40", "mlp_128", "mlp_768")
# the on-demand test's: an A/A pair and a 20% delay, before and after the rerun
RERUN_FIXTURE_FOLDERS = ("aa1", "aa3", "d20")
RERUN_FIXTURE_RUNS = ("mlp_128",)


def config(sleep_ms: dict[str, float], mlp_delay_ms: dict[str, float]) -> dict[str, Any]:
    """A CPU config of the sleep and MLP runs: untraced timing only."""
    runs: dict[str, Any] = {name: {"workload": "sleep", "step_ms": ms}
                            for name, ms in sleep_ms.items()}
    for name, delay in mlp_delay_ms.items():
        runs[name] = {"workload": "model", "factory": FACTORY, "batch": MLP_BATCH,
                      "mode": "train",
                      "kwargs": {"width": int(name.split("_")[1]), "delay_ms": delay}}
    return {"results": "results", "timing": {"repeats": REPEATS}, "calibrate": False,
            "nsys": {"trace": "cuda,nvtx"}, "container": {"variant": "cpu"},
            "defaults": {"device": "auto", "warmup": 3, "steps": 15, "seed": 0,
                         "profile": False},
            "runs": runs}


def run_folder(workdir: Path, name: str, cfg: dict[str, Any]) -> Path:
    """Run the pipeline into ``workdir/name/results`` (kept when its summary exists)."""
    folder = workdir / name
    results = folder / "results"
    if (results / "summary.csv").exists():
        return results
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    snakemake(folder, path)
    print(f"ran {results}", flush=True)
    return results


def snakemake(folder: Path, *configfiles: Path, extra: tuple[str, ...] = ()) -> None:
    """The pipeline in ``folder`` with these config files (a later one merged into the
    earlier) and ``extra`` arguments, as a user runs it, up to summary.csv."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(folder), "--cores", "2", "--configfile",
           *map(str, configfiles), *extra, "--", "results/summary.csv"]
    subprocess.run(cmd, env=env, check=True, capture_output=True)


def base_medians(workdir: Path) -> dict[str, float]:
    """Each run's step time, ms: the median over the A/A folders' summaries."""
    tables = [pd.read_csv(workdir / f / "results" / "summary.csv") for f in AA_FOLDERS]
    return pd.concat(tables).groupby("run")["step_ms"].median().to_dict()


def fixture(workdir: Path, dest: Path) -> None:
    """Copy :data:`FIXTURE_RUNS` of :data:`FIXTURE_FOLDERS` (timing records, plan.json and
    their rows of summary.csv) and the manifest's entries for them to ``dest``."""
    for folder in FIXTURE_FOLDERS:
        copy_runs(workdir / folder / "results", dest / folder, FIXTURE_RUNS)
    manifest = json.loads((workdir / "manifest.json").read_text())
    manifest["aa"] = [f for f in manifest["aa"] if f in FIXTURE_FOLDERS]
    manifest["delayed"] = {f: d for f, d in manifest["delayed"].items() if f in FIXTURE_FOLDERS}
    manifest["base_ms"] = {r: ms for r, ms in manifest["base_ms"].items() if r in FIXTURE_RUNS}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))


def copy_runs(src: Path, out: Path, runs: tuple[str, ...], summary: bool = True) -> None:
    """The runs' timing records (and plan.json and their rows of summary.csv) of the results
    folder ``src`` in ``out``, without this machine's paths."""
    out.mkdir(parents=True, exist_ok=True)
    if summary:
        shutil.copy(src / "plan.json", out / "plan.json")
        table = pd.read_csv(src / "summary.csv")
        table[table["run"].isin(runs)].to_csv(out / "summary.csv", index=False)
    for run in runs:
        shutil.copytree(src / run / "timing", out / run / "timing", dirs_exist_ok=True)
    for path in out.rglob("*"):  # no path of this machine in the copy
        if path.suffix in (".json", ".csv"):
            path.write_text(path.read_text().replace(FACTORY_PATH, FACTORY))


def rerun_fixture(workdir: Path, dest: Path) -> None:
    """After ``--rerun``: :data:`RERUN_FIXTURE_RUNS` of :data:`RERUN_FIXTURE_FOLDERS`, their
    three-process results in ``dest/<folder>/`` and the rerun's records in
    ``dest/rerun/<folder>/<run>/timing/`` (tests/fixtures/diff-cpu-rerun)."""
    for folder in RERUN_FIXTURE_FOLDERS:
        copy_runs(workdir / folder / "results-3", dest / folder, RERUN_FIXTURE_RUNS)
        copy_runs(workdir / folder / "results", dest / "rerun" / folder, RERUN_FIXTURE_RUNS,
                  summary=False)


# --- more processes on demand: the diff's rerun.yaml, followed -------------------------------


def folder_pairs(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """(old, new) folder pairs: each A/A pair, then each A/A folder against each delayed one."""
    aa = manifest["aa"]
    return [*itertools.combinations(aa, 2),
            *((a, d) for d in manifest["delayed"] for a in aa)]


def snapshot(workdir: Path, folder: str) -> Path:
    """``<folder>/results-3``: the folder's results before any rerun (made once)."""
    kept = workdir / folder / "results-3"
    if not kept.exists():
        shutil.copytree(workdir / folder / "results", kept, ignore=shutil.ignore_patterns("logs"))
    return kept


def advise(workdir: Path, old: str, new: str, max_repeats: int) -> dict[str, Any] | None:
    """``analysis diff`` of the two folders' three-process results into
    ``advice/<old>-<new>``; its rerun.yaml's keys (None: nothing to rerun)."""
    out = workdir / "advice" / f"{old}-{new}"
    subprocess.run([sys.executable, "-m", "analysis", "diff", str(snapshot(workdir, old)),
                    str(snapshot(workdir, new)), "-o", str(out), "--max-repeats",
                    str(max_repeats)], cwd=REPO, check=True, capture_output=True)
    path = out / "rerun.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def folder_fragments(advice: dict[tuple[str, str], dict[str, Any] | None]
                     ) -> dict[str, dict[str, Any]]:
    """Per folder, one fragment for all its pairs: the runs any asked for, the most
    processes any asked for."""
    out: dict[str, dict[str, Any]] = {}
    for (old, new), keys in advice.items():
        for folder in (old, new) if keys else ():
            frag = out.setdefault(folder, {"select": [], "timing": {"repeats": 0}})
            frag["select"] += [r for r in keys["select"] if r not in frag["select"]]
            frag["timing"]["repeats"] = max(frag["timing"]["repeats"],
                                            keys["timing"]["repeats"])
    return out


def rerun(workdir: Path, max_repeats: int) -> None:
    """Diff every pair, then rerun each folder's advised runs with the advised processes."""
    manifest = json.loads((workdir / "manifest.json").read_text())
    advice = {pair: advise(workdir, *pair, max_repeats) for pair in folder_pairs(manifest)}
    for folder, frag in folder_fragments(advice).items():
        path = workdir / folder / "rerun.yaml"
        if path.is_file() and yaml.safe_load(path.read_text()) == frag:
            continue  # rerun already (its records are in results/)
        path.write_text(yaml.safe_dump(frag, default_flow_style=None))
        # as rerun.yaml's comment says: the side's config, the fragment, --forcerun time_run
        snakemake(workdir / folder, workdir / folder / "config.yaml", path,
                  extra=("--forcerun", "time_run"))
        print(f"reran {folder}: {len(frag['select'])} runs x {frag['timing']['repeats']} "
              "processes", flush=True)
    manifest["on_demand"] = {"max_repeats": max_repeats,
                             "advice": {f"{o}-{n}": k for (o, n), k in advice.items()}}
    (workdir / "manifest.json").write_text(json.dumps(manifest, indent=1))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--fixture"]:
        fixture(Path(argv[1]), Path(argv[2]))
        return 0
    if argv[:1] == ["--rerun-fixture"]:
        rerun_fixture(Path(argv[1]), Path(argv[2]))
        return 0
    if argv[:1] == ["--rerun"]:
        rerun(Path(argv[1]), int(argv[2]) if len(argv) > 2 else 12)
        return 0
    workdir = Path(argv[0]) if argv else REPO / "results" / "diff-cpu"
    sleeps = {f"sleep_{ms}": float(ms) for ms in SLEEP_MS}
    mlps = {f"mlp_{w}": 0.0 for w in MLP_WIDTHS}
    for name in AA_FOLDERS:
        run_folder(workdir, name, config(sleeps, mlps))
    base = base_medians(workdir)
    manifest = {"aa": list(AA_FOLDERS), "delayed": {}, "base_ms": base}
    for name, delay in DELAYS.items():
        run_folder(workdir, name, config({n: ms * (1 + delay) for n, ms in sleeps.items()},
                                         {n: base[n] * delay for n in mlps}))
        manifest["delayed"][name] = delay
    (workdir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {workdir / 'manifest.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
