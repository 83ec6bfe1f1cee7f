"""Real pipeline runs on the CPU for measuring ``analysis diff``: the same config run several
times (A/A pairs) and with known delays (5%, 10%, 20%), one results folder each.

    python benchmarks/diff_cpu_runs.py [WORKDIR]        # default results/diff-cpu
    python benchmarks/diff_cpu_runs.py --fixture WORKDIR DEST   # the tests' subset

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
only adds what is missing. ``--fixture`` copies a few runs of four folders (the timing
records, plan.json, their summary rows) to ``DEST/<folder>/``: tests/fixtures/diff-cpu, which
tests/test_diff.py diffs.
"""

from __future__ import annotations

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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(folder), "--cores", "2", "--configfile", str(path), "--",
           "results/summary.csv"]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    print(f"ran {results}", flush=True)
    return results


def base_medians(workdir: Path) -> dict[str, float]:
    """Each run's step time, ms: the median over the A/A folders' summaries."""
    tables = [pd.read_csv(workdir / f / "results" / "summary.csv") for f in AA_FOLDERS]
    return pd.concat(tables).groupby("run")["step_ms"].median().to_dict()


def fixture(workdir: Path, dest: Path) -> None:
    """Copy :data:`FIXTURE_RUNS` of :data:`FIXTURE_FOLDERS` (timing records, plan.json and
    their rows of summary.csv) and the manifest's entries for them to ``dest``."""
    for folder in FIXTURE_FOLDERS:
        src, out = workdir / folder / "results", dest / folder
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(src / "plan.json", out / "plan.json")
        summary = pd.read_csv(src / "summary.csv")
        summary[summary["run"].isin(FIXTURE_RUNS)].to_csv(out / "summary.csv", index=False)
        for run in FIXTURE_RUNS:
            shutil.copytree(src / run / "timing", out / run / "timing", dirs_exist_ok=True)
        for path in out.rglob("*"):  # no path of this machine in the copy
            if path.suffix in (".json", ".csv"):
                path.write_text(path.read_text().replace(FACTORY_PATH, FACTORY))
    manifest = json.loads((workdir / "manifest.json").read_text())
    manifest["aa"] = [f for f in manifest["aa"] if f in FIXTURE_FOLDERS]
    manifest["delayed"] = {f: d for f, d in manifest["delayed"].items() if f in FIXTURE_FOLDERS}
    manifest["base_ms"] = {r: ms for r, ms in manifest["base_ms"].items() if r in FIXTURE_RUNS}
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--fixture"]:
        fixture(Path(argv[1]), Path(argv[2]))
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
