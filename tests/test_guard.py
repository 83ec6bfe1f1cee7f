"""pipeline.guard with real child processes, real signals and real nsys exports."""

from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workloads.proctree import alive

REPO = Path(__file__).resolve().parent.parent
NSYS_EXPORT = REPO / "tests/fixtures/h100/attention_naive_b32_s100_e256.sqlite"
PY = sys.executable


def guard(out: Path, *cmd: str, opts: tuple[str, ...] = (), timeout: float = 60
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "pipeline.guard", "--out", str(out), *opts, "--", *cmd],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False,
    )


def result(out: Path) -> dict:
    return json.loads(out.read_text())



def wait_for(path: Path, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def test_ok_command_streams_output_and_records_elapsed_time(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = guard(out, PY, "-c", "import sys; print('to stdout'); print('to stderr', "
                 "file=sys.stderr)", opts=("--run", "r1"))
    assert done.returncode == 0, done.stderr
    assert "to stdout" in done.stdout and "to stderr" in done.stderr
    r = result(out)
    assert r["status"] == "ok" and r["returncode"] == 0 and r["run"] == "r1"
    assert r["elapsed_s"] >= 0
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"], "a temporary file was left"


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    """The child ignores SIGTERM and has a grandchild: both are gone after the grace period."""
    out, pids = tmp_path / "r.json", tmp_path / "pids"
    script = f"trap '' TERM; sleep 300 & echo $$ $! > {pids}; wait"
    start = time.monotonic()
    done = guard(out, "bash", "-c", script, opts=("--timeout-s", "2", "--grace-s", "1"))
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 20
    r = result(out)
    assert r["status"] == "timeout"
    assert r["message"] == "exceeded timeout_min=0.0333333 (2 s)"
    assert not any(alive(int(p)) for p in pids.read_text().split())


def test_child_that_raises_is_an_error_with_its_last_lines(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = guard(out, PY, "-c", "raise RuntimeError('shape mismatch in layer 3')")
    assert done.returncode == 0, done.stderr
    r = result(out)
    assert r["status"] == "error" and r["returncode"] == 1
    assert r["message"].startswith("exited with code 1")
    assert "RuntimeError: shape mismatch in layer 3" in r["message"]


def test_sigkilled_child_is_oom(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = guard(out, PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert done.returncode == 0, done.stderr
    r = result(out)
    assert r["status"] == "oom" and r["signal"] == "SIGKILL" and r["returncode"] == -9


def test_out_of_memory_message_is_oom(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    guard(out, PY, "-c", "b = bytearray(1 << 60)")  # a real MemoryError
    r = result(out)
    assert r["status"] == "oom" and "MemoryError" in r["message"]


def test_own_status_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = (f"import json, sys; json.dump({{'status': 'unsupported', 'message': 'bf16 needs "
            f"a GPU', 'steps': 3}}, open({str(out)!r}, 'w')); sys.exit(4)")
    guard(out, PY, "-c", code)
    r = result(out)
    assert r == {"status": "unsupported", "message": "bf16 needs a GPU", "steps": 3,
                 "returncode": 4, "elapsed_s": r["elapsed_s"], "guard_unix": r["guard_unix"]}
    # when the command started and ended, for the job's timeline (benchmarks/job_overhead.py)
    assert r["guard_unix"]["ended"] - r["guard_unix"]["started"] == pytest.approx(
        r["elapsed_s"], abs=0.002)


def test_stale_result_of_an_earlier_run_is_not_kept(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"status": "ok"}))
    guard(out, "false")
    assert result(out)["status"] == "error"


def test_reported_ok_but_wrapper_failed_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    guard(out, "bash", "-c", f"echo '{{\"status\": \"ok\"}}' > {out}; echo export failed; "
          "exit 1")
    r = result(out)
    assert r["status"] == "error" and "export failed" in r["message"]


def test_missing_expected_export_names_it(tmp_path: Path) -> None:
    out, sqlite = tmp_path / "r.json", tmp_path / "profile.sqlite"
    fake_nsys = tmp_path / "nsys"
    fake_nsys.write_text("#!/bin/sh\nexit 0\n")
    fake_nsys.chmod(0o755)
    guard(out, str(fake_nsys), opts=("--expect", str(sqlite)))
    r = result(out)
    assert r["status"] == "error"
    assert r["message"].startswith("nsys produced no profile.sqlite")


@pytest.mark.parametrize("damage", ["truncated", "not_sqlite", "not_nsys", "empty"])
def test_damaged_export_is_an_error_naming_it(tmp_path: Path, damage: str) -> None:
    out, sqlite = tmp_path / "r.json", tmp_path / "profile.sqlite"
    if damage == "truncated":
        data = NSYS_EXPORT.read_bytes()
        sqlite.write_bytes(data[: len(data) // 2])
        expected = "profile.sqlite is truncated"
    elif damage == "not_sqlite":
        sqlite.write_text("Generating SQLite file ...\n")
        expected = "profile.sqlite is not an SQLite database"
    elif damage == "not_nsys":
        with sqlite3.connect(sqlite) as con:
            con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
        expected = "profile.sqlite: export lacks table TARGET_INFO_SESSION_START_TIME"
    else:
        sqlite.touch()
        expected = "true produced an empty profile.sqlite"
    guard(out, "true", opts=("--expect", str(sqlite)))
    r = result(out)
    assert r["status"] == "error", r
    assert r["message"].startswith(expected), r["message"]


def test_real_nsys_export_passes(tmp_path: Path) -> None:
    out, sqlite = tmp_path / "r.json", tmp_path / "profile.sqlite"
    shutil.copy(NSYS_EXPORT, sqlite)
    guard(out, "true", opts=("--expect", str(sqlite), str(REPO / "pyproject.toml")))
    assert result(out)["status"] == "ok"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_guard_stops_group_and_writes_no_result(tmp_path: Path, signum: int) -> None:
    out, pids = tmp_path / "r.json", tmp_path / "pids"
    # The child writes its own (partial) result first: it must not survive the interruption.
    script = (f"echo '{{\"status\": \"ok\"}}' > {out}; sleep 300 & echo $$ $! > {pids}; wait")
    proc = subprocess.Popen([PY, "-m", "pipeline.guard", "--out", str(out), "--grace-s", "2",
                             "--", "bash", "-c", script], cwd=REPO, stderr=subprocess.PIPE,
                            text=True)
    children = [int(p) for p in wait_for(pids).split()]
    assert all(alive(p) for p in children)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum, stderr
    assert "no result was written" in stderr
    assert not out.exists()
    assert not any(alive(p) for p in children)


def test_usage_error_exits_non_zero_without_result(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = subprocess.run([PY, "-m", "pipeline.guard", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "no command given" in done.stderr
    assert not out.exists()


def test_command_that_cannot_start_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = guard(out, str(tmp_path / "no-such-program"))
    assert done.returncode == 0
    assert result(out)["message"] == (f"cannot run {tmp_path / 'no-such-program'}: "
                                      "No such file or directory")


def test_reader_that_goes_away_does_not_block_the_command(tmp_path: Path) -> None:
    """Output keeps draining when the guard's own stdout is closed (e.g. `| head`)."""
    out = tmp_path / "r.json"
    proc = subprocess.Popen([PY, "-m", "pipeline.guard", "--out", str(out), "--", PY, "-c",
                             "for i in range(200000): print('line', i)"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0
    assert result(out)["status"] == "ok"
