"""A bad config stops the workflow before any job, with a message naming the key.

Every kind of bad config is checked on pipeline/config.py itself (tests/test_config_module.py);
here two of them go through Snakemake, to show that its run stops before any job."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG, copy_checkout, snakemake


def broken(tmp_path: Path, edit) -> Path:
    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    edit(config)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def typo_in_run_key(c):
    c["runs"]["gpt_tiny_train_bf16"]["bathc"] = 2


def unknown_top_level_key(c):
    c["defualts"] = c.pop("defaults")


# The other kinds of bad config are in tests/test_config_module.py (same messages).
CASES = [
    (typo_in_run_key, ["runs.gpt_tiny_train_bf16.bathc", "'bathc'"]),
    (unknown_top_level_key, ["'defualts'"]),
]


@pytest.mark.parametrize(("edit", "expected"), CASES, ids=[c[0].__name__ for c in CASES])
def test_bad_config_stops_before_any_job(tmp_path: Path, edit, expected: list[str]) -> None:
    config = broken(tmp_path, edit)
    workdir = tmp_path / "work"
    workdir.mkdir()
    done = snakemake(workdir, "--cores", "1", "--configfile", str(config), check=False)
    message = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Invalid config at" in message, message[-3000:]
    for fragment in expected:
        assert fragment in message, (fragment, message[-3000:])
    assert not (workdir / "results").exists(), "a job ran despite the bad config"


def test_valid_smoke_config_plans_every_stage(tmp_path: Path) -> None:
    done = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(SMOKE_CONFIG))
    for rule in ["profile", "run_stats", "aggregate", "plots", "compare"]:
        assert f"rule {rule}:" in done.stdout, rule


def test_booleans_on_the_command_line_mean_booleans(tmp_path: Path) -> None:
    """`--config calibrate=false` (Snakemake passes the string "false") turns calibration off,
    as `calibrate: false` in a config file does; a value that is no boolean is still named."""
    done = snakemake(tmp_path, "-n", "--cores", "1", "--config", "calibrate=false",
                     "keep_captures=TRUE")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rule calibrate:" not in done.stdout and "rule time_run:" in done.stdout
    bad = snakemake(tmp_path, "-n", "--cores", "1", "--config", "calibrate=maybe", check=False)
    assert bad.returncode != 0
    assert ("Invalid config at 'calibrate': 'maybe' is not of type 'boolean'"
            in bad.stdout + bad.stderr)


def timing_jobs_of_three(dry_run: str) -> int:
    """The number of timing jobs in a dry run's output, each of which must write the run's 3
    timing records (one job per run: its processes run one after another)."""
    jobs = dry_run.count("rule time_run:")
    outputs = re.findall(r"output: (\S+)/timing/r0\.json, \1/timing/r1\.json, "
                         r"\1/timing/r2\.json\n", dry_run)
    assert len(outputs) == jobs, (jobs, len(outputs))
    return jobs


def test_default_config_is_valid_and_complete(tmp_path: Path) -> None:
    """The GPU default matrix: the GPT train ladder (9 rungs for small, 8 for 2.7B), CS336's
    2.7B forward and forward+backward at fp32 eager and at the best settings, and the
    notebook's attention case, all captured; the FlashAttention point (5 variants) and 1 OOM
    probe timed only; 3 untraced timing processes per run and one calibration."""
    done = snakemake(tmp_path, "-n", "--cores", "1")
    assert done.stdout.count("rule profile:") == 17 + 4 + 2, done.stdout[-2000:]
    assert timing_jobs_of_three(done.stdout) == 17 + 4 + 2 + 5 + 1
    # the config's 4 comparisons and each ladder rung against the one before
    assert done.stdout.count("rule speedup:") == 4 + 8 + 7
    assert done.stdout.count("rule compare:") == 3 + 8 + 7
    assert done.stdout.count("rule calibrate:") == 1


def test_standard_config_is_the_default_plus_the_attention_sweeps(tmp_path: Path) -> None:
    """config/standard.yaml: config.yaml's runs plus the notebook's s100 pair (captured) and
    36 CS336 and 24 FlashAttention attention cells, timed only."""
    done = snakemake(tmp_path, "-n", "--cores", "1", "--configfile",
                     str(REPO / "config" / "standard.yaml"))
    assert done.stdout.count("rule profile:") == 23 + 2, done.stdout[-2000:]
    assert timing_jobs_of_three(done.stdout) == 29 + 2 + 36 + 24
    assert done.stdout.count("rule calibrate:") == 1


def test_pipeline_installs_nsys_when_none_is_found(tmp_path: Path) -> None:
    """No nsys on PATH and an empty cache: the plan starts with install_nsys, and every
    profile job waits for it."""
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if not shutil.which("nsys", path=d))
    done = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(SMOKE_CONFIG),
                     env_extra={"PROFBENCH_CACHE": str(tmp_path / "cache"), "PATH": path})
    assert done.stdout.count("rule install_nsys:") == 1
    profile_jobs = done.stdout.split("rule profile:")[1:]
    assert profile_jobs and all("nsys-2024.2.3/.complete" in job.split("output:")[0]
                                for job in profile_jobs)


def _copy_with_git(tmp_path: Path) -> tuple[Path, str, str]:
    """The workflow copied into a fresh git repository with two commits; (copy, first, HEAD)."""
    copy = copy_checkout(tmp_path / "copy")
    git = ["git", "-C", str(copy), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                           check=True).stdout.strip()
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "two"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    return copy, first, head


def _planned_git(copy: Path, workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFBENCH_GIT_")}
    env["PYTHONPATH"] = str(copy)
    subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(copy / "Snakefile"),
                    "--directory", str(workdir), "--cores", "1", "results/smoke/plan.json",
                    "--configfile", str(SMOKE_CONFIG)], env=env, check=True, capture_output=True)
    return json.loads((workdir / "results" / "smoke" / "plan.json").read_text())["git"]


def test_git_stamp_wins_over_a_stale_git_copy_only(tmp_path: Path) -> None:
    """A tree shipped with an older .git: the stamped commit (unknown to that .git) is the
    provenance; a stamp left behind in a checkout that moved on is ignored."""
    copy, first, head = _copy_with_git(tmp_path)
    stamp = copy / ".profbench-git.json"
    newer = "f" * 40  # a commit this .git has never seen: the tree is newer than its .git
    stamp.write_text(json.dumps({"commit": newer, "dirty": False}))
    assert _planned_git(copy, tmp_path / "a") == {"commit": newer, "dirty": False}
    stamp.write_text(json.dumps({"commit": first, "dirty": True}))  # stale: HEAD moved on
    assert _planned_git(copy, tmp_path / "b")["commit"] == head


def test_the_compiled_rungs_benchmark_runs_the_standard_configs_runs() -> None:
    """benchmarks/gpu/gpt_compiled_rungs.yaml is config/standard.yaml written out with a
    selection and no capture: its runs are the standard config's, with the same workload
    command lines, so a before/after with it times what the standard config times."""
    from pipeline import config

    bench = config.load(REPO / "benchmarks" / "gpu" / "gpt_compiled_rungs.yaml")
    standard = config.load(REPO / "config" / "standard.yaml")
    assert list(bench.runs) == [r for r in standard.all_runs if r.startswith(
        "gpt_train_small_") and int(r.split("_")[3]) >= 5]
    for name, params in bench.runs.items():
        assert config.workload_args(params) == config.workload_args(standard.all_runs[name])
        assert params.get("profile") is False
