"""Resume anywhere: part of a matrix runs in one checkout; its results folder, copied WITHOUT
the nsys captures to a fresh checkout elsewhere (as a preemptible node's or a borrowed GPU's
results come back), is finished there, and nothing already finished is recomputed.

Real Snakemake, real nsys; the two checkouts are copies of this working tree in different
folders, each with its own .snakemake (none is copied along)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from conftest import LEAN_NSYS, copy_checkout, private_tmpdir

pytestmark = pytest.mark.slow

RESULTS = "results"
# Two captured runs with a comparison between them (compare reads both runs' stats/), one
# more captured run and one timed-only run: the first two finish in checkout A.
CONFIG = {
    "results": RESULTS,
    "timing": {"repeats": 1},
    "calibrate": False,
    "nsys": LEAN_NSYS,
    "defaults": {"device": "cpu", "dtype": "fp32", "warmup": 1, "steps": 2, "seed": 0},
    "runs": {
        "naive": {"workload": "attention", "impl": "naive", "batch": 2, "seq": 32, "embed": 16,
                  "heads": 2},
        "sdpa": {"workload": "attention", "impl": "sdpa", "batch": 2, "seq": 32, "embed": 16,
                 "heads": 2},
        "gpt": {"workload": "gpt", "size": "tiny", "mode": "train", "context": 16, "batch": 2},
        "core": {"workload": "attention_core", "impl": "sdpa", "batch": 1, "heads": 2,
                 "seq": 32, "head_dim": 8, "profile": False},
    },
    "comparisons": [{"name": "naive_vs_sdpa", "a": "naive", "b": "sdpa"}],
    "container": {"variant": "cpu"},
}
FIRST = ["naive", "sdpa"]
# The same commit and state for both checkouts: a fresh checkout of the same commit.
GIT_ENV = {"PROFBENCH_GIT_COMMIT": "0" * 40, "PROFBENCH_GIT_DIRTY": "0"}


def checkout(dest: Path) -> Path:
    """A fresh checkout of this commit (without tests and published results)."""
    return copy_checkout(dest, skip=("tests/", "published/"))


def run(tree: Path, config: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV, "PYTHONPATH": str(tree), "TMPDIR": private_tmpdir(tree)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile",
                           str(tree / "Snakefile"), "--directory", str(tree), *args,
                           "--configfile", str(config)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout + done.stderr


def executed_jobs(log: str) -> dict[str, list[str]]:
    """rule -> the `run` wildcard of every job Snakemake started (from its log)."""
    jobs: dict[str, list[str]] = {}
    rule = None
    for line in log.splitlines():
        line = line.strip()
        if line.startswith(("rule ", "localrule ")) and line.endswith(":"):
            rule = line.split()[1].rstrip(":")
            jobs.setdefault(rule, [])
        elif rule and line.startswith("wildcards:"):
            for part in line.removeprefix("wildcards:").split(","):
                key, _, value = part.strip().partition("=")
                if key == "run":
                    jobs[rule].append(value)
    return jobs


def copy_without_captures(src: Path, dest: Path, archive: Path) -> None:
    """tar keeps the files' times, as rsync -a or cp -a do (a plain cp would not)."""
    with tarfile.open(archive, "w") as tar:
        tar.add(src, arcname=RESULTS,
                filter=lambda t: None if t.name.endswith((".sqlite", ".nsys-rep")) else t)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="tar")


@pytest.mark.parametrize("keep_captures", [True, False])
def test_partial_results_finish_elsewhere_without_recomputing(
    tmp_path: Path, nsys: str, keep_captures: bool
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "keep_captures": keep_captures}))
    a, b = checkout(tmp_path / "a"), checkout(tmp_path / "b")
    targets = [f"{RESULTS}/{run}/stats/metrics.json" for run in FIRST]
    targets += [f"{RESULTS}/compare/naive_vs_sdpa/compare_categories.csv",
                f"{RESULTS}/{FIRST[0]}/timing/r0.json", f"{RESULTS}/{FIRST[1]}/timing/r0.json"]
    run(a, config, *targets, "--cores", "2")
    captures = sorted(p.name for p in (a / RESULTS).rglob("profile.sqlite"))
    # keep_captures false: gone once every job that reads them (run_stats, compare) is done
    assert captures == (["profile.sqlite"] * 2 if keep_captures else [])

    copy_without_captures(a / RESULTS, b, tmp_path / "results.tar")
    # every file but the fork servers' logs and verdict, which each invocation writes to
    finished = {p: p.stat().st_mtime_ns for p in (b / RESULTS).rglob("*")
                if p.is_file() and not p.name.startswith("forkserver")}
    log = run(b, config, "--cores", "2")
    jobs = executed_jobs(log)
    for rule in ("profile", "time_run", "run_stats"):
        assert not set(jobs.get(rule, [])) & set(FIRST), (rule, jobs)
    assert set(jobs["profile"]) == {"gpt"} and set(jobs["time_run"]) == {"gpt", "core"}
    assert "compare" not in jobs and "speedup" in jobs
    changed = [p for p, t in finished.items() if p.stat().st_mtime_ns != t]
    assert changed == [], changed  # nothing finished was rewritten
    assert (b / RESULTS / "summary.csv").is_file()
    # and nothing is left to do
    assert "Nothing to be done" in run(b, config, "--cores", "1", "-n")

    # Re-capture one run (as after an analysis fix): its capture, statistics and comparison
    # are made again; the run it is compared with is not captured again (its capture is gone).
    # Once, with the configs' default: without captures to keep, the same jobs run.
    if not keep_captures:
        return
    (b / RESULTS / "sdpa" / "times.json").unlink()
    shutil.rmtree(b / RESULTS / "sdpa" / "stats")
    other = b / RESULTS / "naive" / "stats" / "metrics.json"
    other_made = other.stat().st_mtime_ns
    jobs = executed_jobs(run(b, config, "--cores", "2"))
    assert jobs["profile"] == ["sdpa"] and jobs["run_stats"] == ["sdpa"], jobs
    assert "compare" in jobs and other.stat().st_mtime_ns == other_made
    assert (b / RESULTS / "compare" / "naive_vs_sdpa" / "compare_categories.csv").stat().st_size
