"""pipeline.guard with real child processes, real signals and real nsys exports."""

from __future__ import annotations

import json
import os
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
        expected = "profile.sqlite: not a readable SQLite database (database disk"
    elif damage == "not_sqlite":
        sqlite.write_text("Generating SQLite file ...\n")
        expected = "profile.sqlite: not a readable SQLite database (file is not a database)"
    elif damage == "not_nsys":
        with sqlite3.connect(sqlite) as con:
            con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
        expected = "profile.sqlite: export lacks table TARGET_INFO_SESSION_START_TIME"
    else:
        sqlite.touch()
        expected = "nsys produced an empty profile.sqlite"  # a capture is nsys's
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


# --- a run's repeats in one job (--repeats) ----------------------------------------------------

# Records its pid and its repeat index (from the substituted argument), then exits with the
# code the test asks for that repeat (0: ok, 4: unsupported, 1: an error).
REPEAT_SCRIPT = ("import json, os, sys, time; out, code = sys.argv[1], CODE; "
                 "print('repeat', sys.argv[2], 'pid', os.getpid()); "
                 "json.dump({'pid': os.getpid(), 'arg': sys.argv[2], 'at': time.time()}, "
                 "open(out, 'w')) if code == 0 else None; sys.exit(code)")


def repeats(tmp_path: Path, n: int, codes: str, *opts: str) -> subprocess.CompletedProcess[str]:
    """The guard running REPEAT_SCRIPT n times; `codes` the exit code of each repeat by index
    (a repeat past its end exits 0)."""
    out = tmp_path / "r{repeat}.json"
    script = REPEAT_SCRIPT.replace("CODE", f"([{codes}] + [0] * 9)[int(sys.argv[2])]")
    return guard(out, PY, "-c", script, str(out), "{repeat}",
                 opts=("--run", "cell", "--repeats", str(n), *opts))


def test_repeats_run_one_after_another_each_its_own_process(tmp_path: Path) -> None:
    done = repeats(tmp_path, 3, "0, 0, 0")
    assert done.returncode == 0, done.stderr
    records = [result(tmp_path / f"r{i}.json") for i in range(3)]
    assert [r["status"] for r in records] == ["ok"] * 3
    assert [r["arg"] for r in records] == ["0", "1", "2"]  # {repeat} replaced in CMD
    assert len({r["pid"] for r in records}) == 3 and all(r["run"] == "cell" for r in records)
    spans = [(r["guard_unix"]["started"], r["guard_unix"]["ended"]) for r in records]
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["r0.json", "r1.json", "r2.json"]
    assert "repeat 0 pid" in done.stdout and "repeat 2 pid" in done.stdout


def test_unsupported_repeat_ends_the_run_and_the_rest_are_skipped(tmp_path: Path) -> None:
    done = repeats(tmp_path, 3, "4")
    assert done.returncode == 0, done.stderr
    first, *rest = (result(tmp_path / f"r{i}.json") for i in range(3))
    assert first["status"] == "unsupported" and first["returncode"] == 4
    for i, r in enumerate(rest, start=1):
        assert r["status"] == "skipped" and r["repeat"] == i and r["run"] == "cell"
        assert r["skipped_after"] == {"repeat": 0, "status": "unsupported"}
        assert r["message"].startswith("not run: repeat 0 ended unsupported")
    assert "repeat 1 pid" not in done.stdout  # no process started for a skipped repeat


def test_an_error_does_not_end_the_run(tmp_path: Path) -> None:
    """An error may be transient: the next repeats still run."""
    done = repeats(tmp_path, 3, "0, 1")
    assert done.returncode == 0, done.stderr
    assert [result(tmp_path / f"r{i}.json")["status"] for i in range(3)] == ["ok", "error", "ok"]


def test_a_timeout_ends_the_run(tmp_path: Path) -> None:
    out = tmp_path / "r{repeat}.json"
    done = guard(out, PY, "-c", "import time; time.sleep(60)", "{repeat}",
                 opts=("--repeats", "2", "--timeout-s", "1", "--grace-s", "1"))
    assert done.returncode == 0, done.stderr
    assert result(tmp_path / "r0.json")["status"] == "timeout"
    assert result(tmp_path / "r1.json")["skipped_after"] == {"repeat": 0, "status": "timeout"}


def test_signal_during_a_later_repeat_leaves_that_repeat_without_result(tmp_path: Path) -> None:
    out, started = tmp_path / "r{repeat}.json", tmp_path / "started1"
    script = (f"import sys, time; sys.argv[1] == '1' and open({str(started)!r}, 'w')"
              ".write('x'); time.sleep(0 if sys.argv[1] == '0' else 300)")
    proc = subprocess.Popen([PY, "-m", "pipeline.guard", "--out", str(out), "--repeats", "3",
                             "--grace-s", "2", "--", PY, "-c", script, "{repeat}"],
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    wait_for(started)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert result(tmp_path / "r0.json")["status"] == "ok"
    assert not (tmp_path / "r1.json").exists() and not (tmp_path / "r2.json").exists()


# Each workload process lingers this long after writing its record (an atexit handler from a
# sitecustomize on its path), as a GPU process does while it tears down its CUDA context.
LINGER_S = 1.5


def test_a_repeat_that_ends_the_run_starts_no_next_one(tmp_path: Path) -> None:
    """A record that ends the run (unsupported: cuDNN attention on the CPU): the later repeat
    is a skipped record, and no process ran for it."""
    out = tmp_path / "r{repeat}.json"
    done = guard(out, PY, "-m", "workloads", "attention_core", "--batch", "1", "--heads", "2",
                 "--seq", "16", "--head_dim", "8", "--sdpa_backend", "cudnn", "--device", "cpu",
                 "--out", str(out), opts=("--repeats", "2"))
    assert done.returncode == 0, done.stderr
    first, second = (result(tmp_path / f"r{i}.json") for i in range(2))
    assert first["status"] == "unsupported", first
    assert second["status"] == "skipped" and "guard_unix" not in second
    assert done.stdout.count("attention_core: unsupported") == 1, done.stdout
    assert "repeat 1 of 2" not in done.stderr  # no process started for it


def test_captures_started_together_take_turns_at_the_device_lock(tmp_path: Path) -> None:
    """Two workload processes started at once with one device lock (two captures side by
    side): the second takes the lock, and builds, only once the first process has exited."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import atexit, time\natexit.register(time.sleep, {LINGER_S})\n")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}",
           "PROFBENCH_DEVICE_LOCK": str(tmp_path / "locks" / "gpu.lock")}
    outs = [tmp_path / f"c{i}.json" for i in range(2)]
    procs = [subprocess.Popen(
        [PY, "-m", "pipeline.guard", "--out", str(out), "--", PY, "-m", "workloads", "sleep",
         "--step_ms", "1", "--warmup", "1", "--steps", "2", "--device", "cpu", "--out",
         str(out)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for out in outs]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    first, second = sorted((result(out) for out in outs),
                           key=lambda r: r["process"]["timeline_unix"]["device"])
    assert [first["status"], second["status"]] == ["ok", "ok"]
    # both started before either took the lock: they did start side by side
    assert max(r["guard_unix"]["started"] for r in (first, second)) \
        < first["process"]["timeline_unix"]["written"]
    marks = second["process"]["timeline_unix"]
    # the first held it until its process ended (it lingered LINGER_S after its record)
    assert marks["device"] >= first["process"]["timeline_unix"]["written"] + LINGER_S * 0.8
    assert marks["device"] >= first["guard_unix"]["ended"] - 0.05
    assert marks["built"] >= marks["vacated"] >= marks["device"]
    assert second["process"]["device_wait_s"] >= LINGER_S * 0.8


@pytest.mark.parametrize(("opts", "says"), [
    (("--repeats", "2"), "--repeats needs {repeat} in --out"),
    (("--repeats", "0"), "--repeats must be at least 1"),
    (("--", "echo", "{repeat}"), "{repeat} is only replaced with --repeats"),
])
def test_repeat_usage_errors_name_the_option(tmp_path: Path, opts: tuple[str, ...],
                                             says: str) -> None:
    done = guard(tmp_path / "r.json", "true", opts=opts)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())
