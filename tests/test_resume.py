"""Interruption: the smoke pipeline killed with a real signal while a profile job runs (SIGINT,
then SIGKILL on the resumed run), then started again, finishes the matrix without redoing
finished runs, and ends where an uninterrupted run ends (same rows, same NVTX counts). No
half-written capture is kept."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO, SMOKE_CONFIG, private_tmpdir, snakemake

from pipeline.verdict import check_nsys_export

pytestmark = pytest.mark.slow

RESULTS = "results/smoke"
START_TIMEOUT_S = 600
# Part of the smoke matrix, to keep the test short: two captured runs (the first finished
# before the pipeline starts, the other captured when the signal comes), a timed-only and an
# unsupported one, and the attention comparison.
SELECT = "select=[attention_*]"
SELECTED = r"attention_"
FIRST_RUN = "attention_naive"
# the capture both signals come in: the unsupported run's capture may come and go first
CAPTURED_RUN = "attention_sdpa"


def _group_commands(pgid: int) -> list[str]:
    """Command lines of the live processes in one process group (zombies, already dead and
    waiting for init to reap them, do not count)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, ProcessLookupError, IndexError):
            continue
    return found


def _profiling_now(workdir: Path, run: str = CAPTURED_RUN) -> bool:
    """The run's capture job is running: Snakemake has marked its outputs incomplete (the
    nsys process itself runs in the guard's process group of its own)."""
    return _marked_incomplete(workdir, workdir / RESULTS / run / "times.json")


def _marked_incomplete(workdir: Path, path: Path) -> bool:
    """Snakemake marks each output of a running job in .snakemake/incomplete/ (named by the
    base64 of its path in the working directory) and unmarks it once the job has ended."""
    key = base64.urlsafe_b64encode(str(path.relative_to(workdir)).encode()).decode()
    return (workdir / ".snakemake" / "incomplete" / key).exists()


def _finished_runs(workdir: Path) -> list[str]:
    """Runs whose capture was analysed completely: the run_stats job ended, not merely wrote
    metrics.json (its last file; Snakemake still checks the outputs after that, and a job
    interrupted there is redone)."""
    return sorted(p.parent.parent.name for p in (workdir / RESULTS).glob("*/stats/metrics.json")
                  if not _marked_incomplete(workdir, p))


def _start_pipeline(workdir: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": private_tmpdir(workdir),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
           "--directory", str(workdir), "--cores", "2", "--configfile", str(SMOKE_CONFIG),
           "--config", SELECT]
    # its own session: the signal reaches Snakemake and all its jobs, as Ctrl-C or a
    # scheduler's kill of the job would
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _finish_one_run(workdir: Path) -> None:
    """One run finished, as for a user who asked for one target first."""
    workdir.mkdir()
    snakemake(workdir, "--cores", "2", "--configfile", str(SMOKE_CONFIG), "--config", SELECT,
              "--", f"{RESULTS}/{FIRST_RUN}/stats/metrics.json")
    assert _finished_runs(workdir) == [FIRST_RUN]


def _interrupt_during_a_capture(workdir: Path, signum: int) -> dict[str, int]:
    """With one run finished, start the whole pipeline, send `signum` to it while a profile
    job is capturing, and return the finished files' mtimes at that moment. Finishing the run
    beforehand makes the moment certain: Snakemake may otherwise run every capture before the
    first analysis ends."""
    assert _finished_runs(workdir) == [FIRST_RUN]
    log = workdir / f"{signal.Signals(signum).name}.log"
    proc = _start_pipeline(workdir, log)
    results = workdir / RESULTS
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while not (_finished_runs(workdir) and _profiling_now(workdir)):
            assert proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "no profile job seen running"
            time.sleep(0.2)
        # a finished run's files, less any a job running now is writing (its timing twin)
        finished = {str(p): p.stat().st_mtime_ns for run in _finished_runs(workdir)
                    for p in (results / run).rglob("*")
                    if p.is_file() and not _marked_incomplete(workdir, p)}
        os.killpg(proc.pid, signum)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # SIGKILL leaves nothing running either: the whole group is gone
    deadline = time.monotonic() + 30
    while _group_commands(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _group_commands(proc.pid)
    return finished


def _nvtx_counts(results: Path, run: str) -> dict[str, int]:
    nvtx = pd.read_csv(results / run / "stats" / "nvtx_sum.csv")
    return dict(zip(nvtx["Range"], nvtx["Instances"], strict=True))


def test_killed_pipeline_resumes_without_recomputing(
    tmp_path: Path, request: pytest.FixtureRequest, nsys: str
) -> None:
    """Killed twice during the same capture, as a user's run may be: with SIGINT (Ctrl-C),
    resumed, then with SIGKILL (a node lost), resumed again to the end."""
    workdir = tmp_path / "work"
    _finish_one_run(workdir)
    finished: dict[str, int] = {}
    for signum in (signal.SIGINT, signal.SIGKILL):
        now_finished = _interrupt_during_a_capture(workdir, signum)
        assert now_finished, "some runs had finished before the signal"
        for path, mtime in finished.items():  # what the last resume found finished
            assert now_finished.get(path) == mtime, f"recomputed: {path}"
        finished = now_finished
        # A killed Snakemake leaves its lock behind: the documented resume is unlock + rerun.
        snakemake(workdir, "--unlock", "--configfile", str(SMOKE_CONFIG), "--config", SELECT)
    snakemake(workdir, "--cores", "2", "--configfile", str(SMOKE_CONFIG), "--config", SELECT)

    # the uninterrupted run, asked for only now: another worker may still be making it
    smoke_workdir: Path = request.getfixturevalue("smoke_workdir")
    results, reference = workdir / RESULTS, smoke_workdir / RESULTS
    for path, mtime in finished.items():
        assert Path(path).stat().st_mtime_ns == mtime, f"recomputed: {path}"
    summary = pd.read_csv(results / "summary.csv").set_index("run").sort_index()
    expected = pd.read_csv(reference / "summary.csv").set_index("run").sort_index()
    expected = expected[expected.index.str.match(SELECTED)]
    assert len(summary) == 4 and list(summary.index) == list(expected.index)
    assert summary["status"].to_dict() == expected["status"].to_dict()
    captured = expected.index[expected["status"].eq("ok") & expected["step_ms_traced"].notna()]
    assert len(captured) > 0
    for run in captured:
        assert check_nsys_export(results / run / "profile.sqlite") is None, run
        assert _nvtx_counts(results, run) == _nvtx_counts(reference, run), run
