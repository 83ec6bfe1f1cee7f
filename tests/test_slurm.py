"""Scale-out (docs/cluster.md): the smoke matrix through Snakemake's Slurm executor plugin on a
real single-node Slurm cluster (scripts/slurm-local.sh: munged, MariaDB, slurmdbd, slurmctld,
slurmd), its outputs against the smoke matrix's local run, and one GPU shared safely by the
jobs of one machine.

Needs root and Debian's packages (slurm-wlm, slurmdbd, munge, mariadb-server:
scripts/install-test-deps.sh installs them, and the fixture does when they are missing); run
alone with `python -m pytest tests/test_slurm.py`."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG, snakemake

pytestmark = pytest.mark.slow

SLURM_LOCAL = REPO / "scripts" / "slurm-local.sh"
SLURM_PROFILE = REPO / "profiles" / "slurm"
RESULTS = yaml.safe_load(SMOKE_CONFIG.read_text())["results"]
# Three runs of the smoke matrix and their comparison: every kind of job, in under a minute.
SELECT = ["attention_naive", "attention_sdpa", "gpt_tiny_forward_fp32"]
TARGETS = [
    f"{RESULTS}/summary.csv",
    f"{RESULTS}/compare/attention/compare_categories.csv",
    f"{RESULTS}/compare/attention/speedup.csv",
]
GPU_RULES = {"calibrate", "time_run", "profile"}
# captures; the op and memory captures are the whole matrix's, not the selection's
CAPTURE_RULES = {"profile", "profile_ops", "profile_memory"}
DEVICE_RULES = GPU_RULES | CAPTURE_RULES
ANALYSIS_RULES = {"run_stats", "aggregate", "speedup", "compare"}
LOCAL_RULES = {"plan"}
# Columns of summary.csv that do not depend on timing: what the run was and how it ended.
SUMMARY_KEYS = [
    "run", "workload", "status", "profiled", "device", "dtype", "warmup", "steps", "seed",
    "impl", "batch", "seq", "embed", "heads", "mode", "timing_processes", "timing_steps",
    "kernel_count", "params_count",
]
# Keys of a run record (times.json, timing/r*.json) fixed by the parameters and the seed.
RECORD_KEYS = ["workload", "status", "params", "params_count", "flops_per_step", "run"]


def smoke_args(*extra: str) -> list[str]:
    return [*TARGETS, "--configfile", str(SMOKE_CONFIG),
            "--config", f"select=[{','.join(SELECT)}]", *extra]


# --- the cluster and the two runs ----------------------------------------------------------


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running single-node cluster; stopped (and /etc/slurm restored) whatever happens."""
    installed = subprocess.run([str(SLURM_LOCAL), "install"], capture_output=True, text=True)
    assert installed.returncode == 0, f"scripts/slurm-local.sh install:\n{installed.stderr}"
    state = tmp_path_factory.mktemp("slurm") / "cluster"
    try:
        started = subprocess.run([str(SLURM_LOCAL), "start", str(state)],
                                 capture_output=True, text=True, timeout=180)
        assert started.returncode == 0, f"slurm-local.sh start:\n{started.stderr}"
        yield state
    finally:
        subprocess.run([str(SLURM_LOCAL), "stop", str(state)], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory: pytest.TempPathFactory, slurm_cluster: Path,
              nsys: str) -> tuple[Path, str]:
    """(workdir, Snakemake's output) of the selection run through the Slurm executor."""
    workdir = tmp_path_factory.mktemp("on_slurm")
    done = snakemake(workdir, *smoke_args(
        "--workflow-profile", str(SLURM_PROFILE),
        "--slurm-init-seconds-before-status-checks", "1",  # a test cluster answers at once
        "--verbose",  # the executor logs each sbatch call
    ))
    return workdir, done.stdout + done.stderr


@pytest.fixture(scope="module")
def local_run(smoke_workdir: Path) -> Path:
    """The same runs on this machine: the whole smoke matrix's run (tests/conftest.py, made
    once for every test file), `--cores 2` and the one GPU token of a host without a GPU (the
    one-token case of the token test below)."""
    return smoke_workdir


# --- reading what happened -----------------------------------------------------------------


def submitted_job_ids(output: str) -> list[str]:
    return re.findall(r"has been submitted with SLURM jobid (\d+)", output)


def rule_of(comment: str) -> str:
    """The rule in the plugin's job comment, `rule_<rule>` or `rule_<rule>_wildcards_<...>`."""
    for rule in GPU_RULES | ANALYSIS_RULES:
        if comment == f"rule_{rule}" or comment.startswith(f"rule_{rule}_wildcards_"):
            return rule
    raise AssertionError(f"job comment {comment!r} names no known rule")


def sacct_jobs(job_ids: list[str]) -> pd.DataFrame:
    """sacct's record (from slurmdbd) of the given jobs: id, comment, requested TRES, state."""
    done = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids),
         "-o", "JobID,Comment,ReqTRES,State"],
        capture_output=True, text=True, check=True,
    )
    rows = [line.split("|") for line in done.stdout.splitlines() if line.strip()]
    jobs = pd.DataFrame(rows, columns=["job_id", "comment", "req_tres", "state"])
    jobs["rule"] = jobs["comment"].map(rule_of)
    return jobs


def scontrol_show_job(job_id: str) -> dict[str, str]:
    done = subprocess.run(["scontrol", "show", "job", job_id, "--oneliner"],
                          capture_output=True, text=True, check=True)
    return dict(re.findall(r"(\S+?)=(\S*)", done.stdout))


def job_counts(output: str) -> dict[str, int]:
    """Snakemake's 'Job stats' table: rule -> number of jobs (total left out)."""
    table = output.split("Job stats:", 1)[1].splitlines()[3:]
    counts = {}
    for line in table:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    counts.pop("total", None)
    return counts


def job_intervals(workdir: Path) -> list[tuple[float, float, str, str]]:
    """(start, end, rule, file) per job from its `benchmark:` record: the file is written as
    the job ends (its mtime) and holds the job's wall seconds `s`."""
    intervals = []
    for path in sorted((workdir / RESULTS / "logs" / "benchmark").rglob("*.jsonl")):
        rule = path.parent.name if path.parent.name != "benchmark" else path.stem
        seconds = json.loads(path.read_text().splitlines()[0])["s"]
        end = path.stat().st_mtime
        intervals.append((end - seconds, end, rule, path.name))
    return intervals


def overlaps(a: tuple[float, float, str, str], b: tuple[float, float, str, str]) -> bool:
    # `s` is rounded to 0.1 ms: intervals that merely touch do not overlap.
    return a[0] < b[1] - 1e-4 and b[0] < a[1] - 1e-4


def result_files(workdir: Path) -> list[str]:
    root = workdir / RESULTS
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def record_view(path: Path) -> dict:
    record = json.loads(path.read_text())
    view = {key: record.get(key) for key in RECORD_KEYS}
    view["steps_timed"] = len(record.get("step_times_ms") or [])
    return view


# --- acceptance 1 and 2: the matrix through sbatch, GPU jobs asking for one GPU ------------


def test_every_job_went_through_sbatch_and_sacct_has_it(slurm_run: tuple[Path, str]) -> None:
    _, output = slurm_run
    job_ids = submitted_job_ids(output)
    expected = {r: n for r, n in job_counts(output).items() if r not in LOCAL_RULES}
    assert sum(expected.values()) == len(job_ids) > 0, (expected, job_ids)
    jobs = sacct_jobs(job_ids)
    assert sorted(jobs["job_id"]) == sorted(job_ids)
    assert set(jobs["state"]) == {"COMPLETED"}, jobs
    assert jobs["rule"].value_counts().to_dict() == expected
    assert len(set(jobs["comment"])) == len(jobs), "each job once (no resubmission)"


def test_gpu_jobs_asked_for_one_gpu_and_analysis_jobs_for_none(
    slurm_run: tuple[Path, str],
) -> None:
    _, output = slurm_run
    jobs = sacct_jobs(submitted_job_ids(output))
    gpu = jobs[jobs["rule"].isin(GPU_RULES)]
    analysis = jobs[jobs["rule"].isin(ANALYSIS_RULES)]
    assert set(gpu["rule"]) == GPU_RULES and set(analysis["rule"]) == ANALYSIS_RULES
    # slurmdbd's record of what each job requested.
    assert all("gres/gpu=1" in tres.split(",") for tres in gpu["req_tres"]), gpu
    assert not any("gpu" in tres for tres in analysis["req_tres"]), analysis
    # slurmctld's view of the submission.
    for job_id in gpu["job_id"]:
        assert scontrol_show_job(job_id).get("TresPerJob") == "gres:gpu:1"
    for job_id in analysis["job_id"]:
        assert "TresPerJob" not in scontrol_show_job(job_id)
    # The executor's own sbatch command lines (logged with --verbose).
    calls = re.findall(r"sbatch call: (.*)", output)
    assert len(calls) == len(jobs)
    for call in calls:
        rule = rule_of(re.search(r"--comment (\S+)", call).group(1).strip("'"))
        assert ("--gpus=1" in call) == (rule in GPU_RULES), call


def test_outputs_equal_a_local_run(slurm_run: tuple[Path, str], local_run: Path) -> None:
    """Every file the selection made on Slurm, the local run of the whole matrix made too;
    each run's files, and the comparison's, alike (same tables, same records)."""
    on_slurm, _ = slurm_run
    made_on_slurm = result_files(on_slurm)
    assert set(made_on_slurm) <= set(result_files(local_run))
    per_run = [rel for rel in made_on_slurm if rel.split("/")[0] in SELECT]
    assert {rel.split("/")[0] for rel in per_run} == set(SELECT)
    assert [rel for rel in result_files(local_run) if rel.split("/")[0] in SELECT] == per_run
    for rel in made_on_slurm:
        a, b = local_run / RESULTS / rel, on_slurm / RESULTS / rel
        if rel.startswith("logs/") or rel.split("/")[0] not in {*SELECT, "compare"}:
            continue
        if rel.endswith(".csv"):  # same table: columns and rows (values are timings)
            ta, tb = pd.read_csv(a), pd.read_csv(b)
            assert list(ta.columns) == list(tb.columns) and len(ta) == len(tb), rel
        elif rel.endswith("times.json") or "/timing/" in rel:
            assert record_view(a) == record_view(b), rel
    summary_local = pd.read_csv(local_run / TARGETS[0])
    summary_slurm = pd.read_csv(on_slurm / TARGETS[0])
    keys = [c for c in SUMMARY_KEYS if c in summary_slurm.columns]
    summary_local = summary_local[summary_local["run"].isin(SELECT)][keys]
    # the whole matrix's failed rows leave some of its integer columns floats (NaN)
    pd.testing.assert_frame_equal(summary_local.sort_values("run", ignore_index=True),
                                  summary_slurm[keys].sort_values("run", ignore_index=True),
                                  check_dtype=False)
    assert sorted(summary_slurm["run"]) == sorted(SELECT)
    for run in SELECT:
        nvtx = [
            pd.read_csv(w / RESULTS / run / "stats" / "nvtx_sum.csv")[["Range", "Instances"]]
            .sort_values("Range", ignore_index=True)  # nsys orders the rows by time
            for w in (local_run, on_slurm)
        ]
        pd.testing.assert_frame_equal(*nvtx)
        losses = [json.loads((w / RESULTS / run / "times.json").read_text())["losses"]
                  for w in (local_run, on_slurm)]
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)


# --- acceptance 3: one machine, the GPU's work one job at a time, analysis alongside -------


def planned_runs(workdir: Path) -> list[dict]:
    """The runs of the run's plan (plan.json)."""
    return list(json.loads((workdir / RESULTS / "plan.json").read_text())["runs"].values())


def device_jobs(workdir: Path) -> int:
    """The run's GPU jobs, from its plan: the calibration (the smoke config's default), a
    timing job per run, a capture per captured run and an op capture and a memory capture
    per run that asks for one (the smoke config is no GPU config: `memory: auto` asks for
    none)."""
    runs = planned_runs(workdir)
    return (1 + len(runs) + sum(r["profile"] for r in runs) + sum(bool(r["ops"]) for r in runs)
            + sum(r.get("memory") is True for r in runs))


def capture_device_phases(workdir: Path) -> list[tuple[float, float]]:
    """(took the device lock, wrote its record) of each capture's workload process, in order."""
    phases = []
    for run in SELECT:
        marks = json.loads((workdir / RESULTS / run / "times.json").read_text()
                           )["process"]["timeline_unix"]
        phases.append((marks["device"], marks["written"]))
    return sorted(phases)


def test_gpu_work_takes_turns_while_analysis_overlaps(local_run: Path) -> None:
    intervals = job_intervals(local_run)
    gpu = sorted(i for i in intervals if i[2] in DEVICE_RULES)
    analysis = [i for i in intervals if i[2] == "run_stats"]
    assert len(gpu) == device_jobs(local_run)
    assert len(analysis) == sum(r["profile"] for r in planned_runs(local_run))
    # calibration and timing take the whole GPU: nothing GPU beside them
    whole = [i for i in gpu if i[2] not in CAPTURE_RULES]
    assert not any(overlaps(w, g) for w in whole for g in gpu if g is not w), gpu
    # captures may run two at once, but their device phases (from the device lock to the
    # record, after the measured steps) follow one another
    phases = capture_device_phases(local_run)
    for before, after in zip(phases, phases[1:], strict=False):
        assert after[0] >= before[1], phases
    # an untraced timing job takes every core (rules: timing_threads): nothing runs beside it
    timing = [i for i in gpu if i[2] == "time_run"]
    assert not any(overlaps(a, t) for a in analysis for t in timing), intervals
    # the analysis of one run overlaps the capture of another
    captures = [i for i in gpu if i[2] == "profile"]
    assert any(overlaps(a, c) for a in analysis for c in captures), intervals


def test_captures_overlap_as_the_tokens_allow(tmp_path: Path, nsys: str,
                                              local_run: Path) -> None:
    """The control for the test above: with three tokens the captures start together, yet
    the device lock still runs their device phases one after another; with one token
    (the local run's) no two GPU jobs overlap at all."""
    targets = [f"{RESULTS}/{run}/profile.sqlite" for run in SELECT]
    three = tmp_path / "gpu3"
    three.mkdir()
    snakemake(three, *targets, "--cores", "4", "--resources", "gpu=3",
              "--configfile", str(SMOKE_CONFIG), "--config", f"select=[{','.join(SELECT)}]")
    for workdir, tokens, jobs in ((three, 3, len(SELECT)), (local_run, 1, device_jobs(local_run))):
        gpu = sorted(i for i in job_intervals(workdir) if i[2] in DEVICE_RULES)
        assert len(gpu) == jobs
        overlapping = any(overlaps(a, b) for a in gpu for b in gpu if a is not b)
        assert overlapping == (tokens > 1), (tokens, gpu)
        phases = capture_device_phases(workdir)
        assert all(b[0] >= a[1] for a, b in zip(phases, phases[1:], strict=False)), phases
