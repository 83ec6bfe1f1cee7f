"""Whole GPUs per job (pipeline/gpus.py, the guard's --gpu-locks): the allocator on real lock
files and real processes, and a real pipeline run on a pretend 4-GPU host
(CUDA_VISIBLE_DEVICES=0,1,2,3, every run on the CPU), judged from the jobs' own records: the
GPUs each job got and when it ran."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, snakemake

from pipeline import gpus, warm

PY = sys.executable
FOUR = ["0", "1", "2", "3"]


# --- the host's GPUs ----------------------------------------------------------------------------


def test_host_gpus_are_cuda_visible_devices_entries_as_cuda_reads_them() -> None:
    assert gpus.slots({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == FOUR
    assert gpus.slots({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}) == ["GPU-aa", "GPU-bb"]
    assert gpus.slots({"CUDA_VISIBLE_DEVICES": "2,-1,3"}) == ["2"]  # CUDA stops at -1
    for hidden in ("-1", "", " "):  # no GPU: one slot, the CPU
        assert gpus.slots({"CUDA_VISIBLE_DEVICES": hidden}) == [gpus.CPU]


# --- taking and freeing GPUs --------------------------------------------------------------------


def test_jobs_get_distinct_gpus_and_a_job_gets_all_it_needs_or_none(tmp_path: Path) -> None:
    held = [gpus.try_take(tmp_path, FOUR, 1, owner=f"job{i}") for i in range(3)]
    assert all(h is not None for h in held)
    assert sorted(g for h in held for g in h.gpus) == ["0", "1", "2"]
    assert gpus.try_take(tmp_path, FOUR, 2) is None  # one free, two needed: nothing kept
    last = gpus.try_take(tmp_path, FOUR, 1)
    assert last is not None and last.gpus == ["3"] and last.indices == [3]
    assert last.env() == {"CUDA_VISIBLE_DEVICES": "3"}
    for fd in held[0].fds + held[2].fds:  # as when their guards exit
        os.close(fd)
    pair = gpus.try_take(tmp_path, FOUR, 2)
    assert pair is not None and pair.gpus == ["0", "2"]
    assert pair.env() == {"CUDA_VISIBLE_DEVICES": "0,2"}


def test_the_cpu_slot_keeps_the_environments_cuda_visible_devices(tmp_path: Path) -> None:
    held = gpus.take(tmp_path, [gpus.CPU], 2)  # a 2-rank job on a host without a GPU
    assert held.gpus == [gpus.CPU] and held.env() == {}
    assert held.record({"CUDA_VISIBLE_DEVICES": "-1"})["cuda_visible_devices"] == "-1"


def holder(folder: Path, gpu_ids: list[str]) -> subprocess.Popen[str]:
    """A process that takes one GPU and keeps it; it prints the GPU once it holds it."""
    code = ("import sys, time; from pathlib import Path; from pipeline import gpus; "
            f"h = gpus.take(Path({str(folder)!r}), {gpu_ids!r}, 1); "
            "print(h.gpus[0], flush=True); time.sleep(300)")
    proc = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() in gpu_ids
    return proc


def test_a_killed_holder_frees_its_gpu(tmp_path: Path) -> None:
    proc = holder(tmp_path, ["0"])
    try:
        assert gpus.try_take(tmp_path, ["0"], 1) is None
        # the lock file says who holds it
        assert (tmp_path / "0.lock").read_text().split()[0] == str(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    freed = gpus.try_take(tmp_path, ["0"], 1)
    assert freed is not None and freed.gpus == ["0"]


def test_the_guard_runs_its_command_on_the_gpus_it_took(tmp_path: Path) -> None:
    """The guard waits while its GPU is held, then gives the command CUDA_VISIBLE_DEVICES
    (and a capture its GPU's device lock) and records them."""
    locks, out = tmp_path / "locks", tmp_path / "out.json"
    seen = ("import json, os, sys; json.dump({'status': 'ok', 'seen': "
            "{k: os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', 'PROFBENCH_DEVICE_LOCK')}}"
            ", open(sys.argv[1], 'w'))")
    busy = holder(locks, ["GPU-aa"])
    guard = subprocess.Popen(
        [PY, "-m", "pipeline.guard", "--out", str(out), "--gpu-locks", str(locks),
         "--host-gpus", "GPU-aa,GPU-bb", "--gpus", "2", "--device-lock", "--",
         PY, "-c", seen, str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "-1"},
        stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            guard.wait(timeout=1.5)  # one of its two GPUs is held
        assert not out.exists()
    finally:
        busy.send_signal(signal.SIGKILL)
        busy.wait()
    assert guard.wait(timeout=30) == 0, guard.stderr.read() if guard.stderr else ""
    record = json.loads(out.read_text())
    assert record["seen"] == {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb",
                              "PROFBENCH_DEVICE_LOCK": str(locks / "GPU-aa.device")}
    assigned = record["assigned_gpus"]
    assert assigned["gpus"] == ["GPU-aa", "GPU-bb"] and assigned["indices"] == [0, 1]
    assert assigned["waited_s"] > 0.5  # of the 1.5 s, its own start-up aside
    assert gpus.try_take(locks, ["GPU-aa", "GPU-bb"], 2) is not None  # freed at its exit


# --- a pipeline run on a pretend 4-GPU host -----------------------------------------------------
# Two one-GPU timing runs and a 2-rank DDP run: the host's 4 GPUs at once.
TIMED = ["s1", "s2"]
RUNS = {
    "s1": {"workload": "sleep", "step_ms": 250, "profile": False},
    "s2": {"workload": "sleep", "step_ms": 250, "profile": False},
    "ddp": {"workload": "gpt", "size": "tiny", "mode": "train", "context": 32, "batch": 2,
            "parallel": "ddp", "gpus": 2, "profile": False},
}


@pytest.fixture(scope="module")
def four_gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("four_gpus")
    config = workdir / "four_gpus.yaml"
    config.write_text(yaml.safe_dump({
        "results": "results", "calibrate": False, "timing": {"repeats": 1},
        "defaults": {"device": "cpu", "warmup": 1, "steps": 4, "seed": 0},
        "runs": RUNS, "container": {"variant": "cpu"}}))
    snakemake(workdir, *[f"results/{run}/timing/r0.json" for run in RUNS], "--cores", "4",
              "--configfile", str(config),
              # the fork servers preload torch only: two start at once on CI's two cores
              env_extra={"CUDA_VISIBLE_DEVICES": ",".join(FOUR),
                         "PROFBENCH_FORKSERVER_PRELOAD": "torch"})
    return workdir / "results"


def job_records(results: Path) -> dict[str, dict]:
    """Each GPU job's record (the guard's, with the workload's own inside)."""
    return {run: json.loads((results / run / "timing" / "r0.json").read_text()) for run in RUNS}


def held(record: dict) -> tuple[float, float]:
    """When the job held its GPUs: from taking them until its command ended (it frees them
    as its guard exits, right after)."""
    return record["assigned_gpus"]["taken_unix"], record["guard_unix"]["ended"]


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.slow
def test_no_two_jobs_on_one_gpu_and_one_gpu_jobs_side_by_side(four_gpu_run: Path) -> None:
    records = job_records(four_gpu_run)
    for run, record in records.items():
        assert record["status"] == "ok", (run, record.get("message"))
        assigned = record["assigned_gpus"]
        assert set(assigned["gpus"]) <= set(FOUR), (run, assigned)
        # what the command got is its GPUs, as CUDA_VISIBLE_DEVICES
        assert assigned["cuda_visible_devices"] == ",".join(assigned["gpus"]), (run, assigned)
        assert assigned["taken_unix"] <= record["guard_unix"]["started"]
    # the 2-rank job: two ranks ran, on two GPUs of their own
    assert records["ddp"]["distributed"]["world_size"] == 2
    assert len(set(records["ddp"]["assigned_gpus"]["gpus"])) == 2, records["ddp"]
    # no job held a GPU that another job held at the same time (every job here is a timing job)
    for a, b in itertools.combinations(records, 2):
        if overlap(held(records[a]), held(records[b])):
            shared = (set(records[a]["assigned_gpus"]["gpus"])
                      & set(records[b]["assigned_gpus"]["gpus"]))
            assert not shared, (a, b, shared, held(records[a]), held(records[b]))
    # the one-GPU jobs ran side by side, on different GPUs
    assert overlap(held(records["s1"]), held(records["s2"])), {r: held(records[r]) for r in TIMED}
    assert records["s1"]["assigned_gpus"]["gpus"] != records["s2"]["assigned_gpus"]["gpus"]


@pytest.mark.slow
def test_timing_jobs_are_forked_by_their_gpus_fork_servers(four_gpu_run: Path) -> None:
    records = job_records(four_gpu_run)
    for run in TIMED:
        record = records[run]
        assert record["process"]["launcher"] == "fork"  # the server's env is its GPU's
        server = warm.SLOTS_PER_GPU * record["assigned_gpus"]["indices"][0]
        log = (four_gpu_run / "logs" / "time_run" / f"{run}.log").read_text()
        assert f"forked by fork server {server} " in log, log[-2000:]


@pytest.mark.slow
def test_gpu_sharing_benchmark_reads_the_runs_assignment(four_gpu_run: Path,
                                                         tmp_path: Path) -> None:
    """benchmarks/gpu_sharing.py on the run's records, as a user runs it: every job on the GPUs
    its record names, none held by two jobs at once; against itself as the reference, every
    run within its own CI and the jobs at the same pace."""
    out = tmp_path / "sharing.json"
    done = subprocess.run([PY, "benchmarks/gpu_sharing.py", "--results", str(four_gpu_run),
                           "--reference", str(four_gpu_run), "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    records = job_records(four_gpu_run)
    assert {j["run"] for j in report["jobs"]} == set(RUNS)
    for job in report["jobs"]:
        assert job["gpus"] == records[job["run"]]["assigned_gpus"]["gpus"]
        assert (job["start"], job["end"]) == held(records[job["run"]])
    assert report["shared_gpus"] == 0
    assert sum(row["jobs"] for row in report["busy"].values()) == 2 + 2  # s1, s2; ddp on two
    assert {r["run"] for r in report["steps"]} == set(RUNS)
    assert all(r["cis_overlap"] and r["ratio"] == 1 for r in report["steps"])
    assert report["reference_jobs"]["duration_ratio_median"] == 1
    assert "GPU held by two jobs at once: 0" in done.stdout


@pytest.mark.slow
def test_gpu_sharing_benchmark_fails_on_a_shared_gpu(four_gpu_run: Path, tmp_path: Path) -> None:
    """The same records with s2 put on s1's GPU (the two ran side by side): exit 1, one pair."""
    copy = tmp_path / "results"
    shutil.copytree(four_gpu_run, copy)
    path = copy / "s2" / "timing" / "r0.json"
    record = json.loads(path.read_text())
    record["assigned_gpus"]["gpus"] = job_records(four_gpu_run)["s1"]["assigned_gpus"]["gpus"]
    path.write_text(json.dumps(record))
    done = subprocess.run([PY, "benchmarks/gpu_sharing.py", "--results", str(copy)],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "GPU held by two jobs at once: 1 time(s)" in done.stdout
    assert any(f"{a} (timing) and {b} (timing)" in done.stdout
               for a, b in (("s1", "s2"), ("s2", "s1"))), done.stdout
