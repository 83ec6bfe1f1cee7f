"""Run one job's command and always leave a result JSON: a failed run is a result row, not a
crashed pipeline.

    python -m pipeline.guard --out RESULT.json [--timeout-s N] [--grace-s N]
                             [--expect FILE ...] [--run NAME] [--fork-slot N]
                             [--repeats R] [--gpu-locks DIR --host-gpus IDS [--gpus K]
                             [--device-lock]] -- CMD ARGS...

CMD runs in its own process group; its stdout/stderr stream through to the guard's (the job
log). With --fork-slot N, a `<python> -m workloads ARGS` command is forked by the pipeline's
fork server N (pipeline/forkserver.py) when the pipeline names one (PROFBENCH_FORKSERVER):
a fresh process with the modules already imported, in a session of its own, exactly as
signalled, timed and judged as a started one; when no server can serve it, it is started as
a process. RESULT.json ends up with a ``status``:

* the command's own (it wrote RESULT.json with a ``status``: ok | oom | unsupported | error),
  kept as written plus ``returncode``, ``elapsed_s`` and ``guard_unix`` (when the command
  started and ended, Unix times: the job's timeline in benchmarks/job_overhead.py);
* ``timeout``: it ran past --timeout-s; the whole group got SIGTERM, then SIGKILL after
  --grace-s;
* ``oom``: it was SIGKILLed (the kernel's OOM killer), exited 3 (the workloads' OOM code) or
  its output ends with an out-of-memory message;
* ``unsupported``: it exited 4 (the workloads' code) without writing a status;
* ``error``: anything else, with the last lines of its output as ``message``; also when it
  succeeded but an --expect file is missing, empty, or (``*.sqlite``) not a complete nsys
  export.

With --repeats R the command runs R times, one after another (a run's timing processes as one
job: Snakemake's start and the gap between jobs are paid once per run, not per process):
repeat i has ``{repeat}`` in --out, --fork-slot and CMD replaced by i, and gets its own
RESULT.json, timeout and process (forked by server i). A repeat that ends ``oom``,
``unsupported`` or ``timeout`` ends the run: the same run fails the same way again (it does
not fit, this machine cannot run it, or it would wait out the limit once more), so each
later repeat's RESULT.json says ``skipped`` and why, and no process starts for it.

With --gpu-locks, the job takes whole GPUs of its own first (pipeline/gpus.py): K of the
host's GPUs (--host-gpus, comma-separated CUDA_VISIBLE_DEVICES entries, or ``cpu``), K being
--gpus, else the --ranks of a ``-m pipeline.launch`` command, else 1; it waits while they are
held by other jobs and keeps them until it exits. CMD gets them as CUDA_VISIBLE_DEVICES (with
--device-lock also their device lock, PROFBENCH_DEVICE_LOCK, for a capture), its fork slot N
becomes that of its GPU's server, and RESULT.json records them (``assigned_gpus``).

A command that fails the way nsys does when it loses its own agent while a session starts
(exit 1 or 0 within seconds, no record written, "Connection to Agent lost" or "End of file") is
started once more before it is judged: nothing of the run existed yet. One that goes on after
saying so (under torchrun, that rank's nsys exited 0 and the other ranks wait for it) is
stopped first.

Exit status: 0 whenever RESULT.json was written (the status is the result); 2 for usage
errors; 128+N when the guard itself got signal N (SIGINT/SIGTERM/SIGHUP): the signal goes to
the command's group, and no RESULT.json is left, so Snakemake sees an incomplete job and
reruns it. RESULT.json is written atomically (temporary file + rename).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pipeline import bytecode, forkserver, gpus, launch
from workloads import startgate
from workloads.contract import EXIT_CODES
from workloads.proctree import alive, descendants

DEFAULT_GRACE_S = 10.0
# The longest a job waits for a fork server that is still importing torch & co. before it
# starts a process instead (within its own --timeout-s).
SERVER_WAIT_S = 300.0
TAIL_LINES = 200  # kept from the command's output, to classify the failure
MESSAGE_LINES = 12  # of those, how many go into an error's message
# The workloads' exit codes for a result they could not produce.
EXIT_OOM, EXIT_UNSUPPORTED = EXIT_CODES["oom"], EXIT_CODES["unsupported"]
# How a failure says "out of memory": Python, glibc, PyTorch (CPU and CUDA), C++, and how
# nsys or a shell reports a target killed by SIGKILL (the kernel's OOM killer).
OOM_OUTPUT = re.compile(
    r"out of memory|can(?:no|')t allocate memory|MemoryError|std::bad_alloc"
    r"|\bKilled\b|signal 9\b|SIGKILL",
    re.IGNORECASE,
)
# Nsight Systems (2024.2 here) now and then loses its own agent, or cannot reach it, while a
# session starts on a busy machine (several captures at once): it exits 1 (or 0) before the
# workload ran, saying one of these; within a fraction of a second on a quiet machine, after
# 10 s on a saturated 2-core one. Nothing of the run exists yet, so the guard starts the
# command again (up to START_RETRIES times).
NSYS_START_FAILURE = re.compile(
    r"Connection to Agent lost|^End of file$|Local Endpoint is not available")
START_FAILURE_MAX_S = 30.0
START_RETRIES = 2
# A rank's nsys that lost its agent may exit 0: torchrun then takes that rank for done and its
# peers wait for it in init_process_group until their collective timeout (10 min). A command
# still running this long after saying so is stopped, and started again like the others.
START_FAILURE_STOP_S = 3.0
POLL_S = 0.5  # how often the guard looks at a running command's output for that
KILL_WAIT_S = 5.0  # how long a stopped command's processes may take to die of SIGKILL
WATCH_S = 0.02  # how often the guard looks for a repeat's record, to start the next one
START_RETRY_PAUSE_S = 1.0  # times the attempt: let the other session's start-up pass
TORCHRUN_START_S = 15.0  # torchrun's agent imports torch and starts the ranks first
# torchrun's report of a failed job: its own exception, then fields such as "  rank : 0
# (...)"; and its agent's log lines ("W1124 12:42:06.293000 14877 .../elastic/...").
TORCHRUN_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
TORCHRUN_LOG = re.compile(r"^[IWE]\d{4} [\d:.]+ \d+ \S*torch/distributed/elastic/")
TORCHRUN_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(\S.*?)\s*$")
# Tables every nsys SQLite export has (the markers a complete export has).
NSYS_EXPORT_TABLES = ("StringIds", "TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT")
SQLITE_MAGIC = b"SQLite format 3\x00"


# --repeats: the placeholder each repeat's index replaces, and the statuses after which the
# run's later repeats are not started (they are written as SKIPPED records).
REPEAT = "{repeat}"
FINAL_STATUSES = ("oom", "unsupported", "timeout")
SKIPPED = "skipped"


class Interrupted(Exception):
    """The guard itself received a stop signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class Outcome:
    """How the command ended."""

    returncode: int
    elapsed_s: float  # from its start (its timeout's clock)
    timed_out: bool
    started_unix: float  # when the command was started
    tail: collections.deque[str] = field(default_factory=collections.deque)
    # a repeat started while the previous one exited: when its gate opened (its share of the
    # job's timeline starts here, where the previous repeat's ended)
    gate_unix: float | None = None
    # stopped by the guard: nsys had lost its agent while starting (START_FAILURE_STOP_S)
    stopped_at_start: bool = False

    @property
    def signal_name(self) -> str | None:
        """The signal that killed the command (directly, or a shell's 128+N), if any."""
        if self.returncode < 0:
            return _signal_name(-self.returncode)
        if self.returncode > 128 and self.returncode - 128 < signal.NSIG:
            return _signal_name(self.returncode - 128)
        return None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# --- running the command ----------------------------------------------------------------------


def _pump(source: IO[bytes], sink: IO[bytes], tail: collections.deque[str]) -> threading.Thread:
    """Copy a child's pipe to our own stream as it comes, keeping its last lines."""

    def copy() -> None:
        sink_open = True
        for line in iter(source.readline, b""):
            tail.append(line.decode("utf-8", "replace").rstrip("\n"))
            if sink_open:
                try:
                    sink.write(line)
                    sink.flush()
                except OSError:  # our reader went away: keep draining, or the child blocks
                    sink_open = False
        source.close()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


# A started process or a forked child (forkserver.Child): both lead their own process group.
Proc = subprocess.Popen[bytes] | forkserver.Child


# Set when the guard adopts its command's orphans (a started command, not a forked one).
_ADOPTING: list[bool] = []


def _signal_group(proc: Proc, signum: int) -> None:
    """`signum` to the command's group and to every process below the command (and, for a
    started command, its orphans the guard adopted): torchrun starts each rank in a session
    of its own, outside the command's group."""
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass  # the group is already gone
    roots = {proc.pid, os.getpid()} if _ADOPTING else {proc.pid}
    for pid in descendants(roots):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _adopt_orphans() -> None:
    """Be the subreaper of the command's tree: a process whose parent dies (a rank whose
    torchrun was killed) is re-parented to the guard, so the guard still finds and stops it.
    Only for a command the guard starts itself: a guard that asks a fork server may start
    that server as its own child, which outlives the job and must never be stopped."""
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0:  # CHILD_SUBREAPER
            _ADOPTING.append(True)
    except (OSError, AttributeError):
        pass  # not Linux: the command's tree below it is all the guard stops


def _stop_group(proc: Proc, signum: int, grace_s: float) -> None:
    """`signum` to the whole group, then SIGKILL to what is left after the grace period."""
    _signal_group(proc, signum)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc, signal.SIGKILL)
    proc.wait()
    _wait_until_gone(proc)


def _wait_until_gone(proc: Proc) -> None:
    """SIGKILL takes effect asynchronously: wait until nothing below the command (and, for a
    started command, none of its orphans the guard adopted) still runs, at most KILL_WAIT_S,
    so that a stopped guard leaves nothing of its command behind when it exits."""
    roots = {proc.pid, os.getpid()} if _ADOPTING else {proc.pid}
    deadline = time.monotonic() + KILL_WAIT_S
    while any(alive(pid) for pid in descendants(roots)) and time.monotonic() < deadline:
        time.sleep(0.05)


def _drain(proc: Proc, pumps: list[threading.Thread]) -> None:
    """Wait for the output to end; processes of the group that outlive the command and hold
    its pipes open are killed, or the guard would wait for them forever."""
    for pump in pumps:
        pump.join(timeout=5)
    if any(p.is_alive() for p in pumps):
        _signal_group(proc, signal.SIGKILL)
        for pump in pumps:
            pump.join()


@dataclass
class Started:
    """A command started and not yet waited for: its process, output pumps and clocks."""

    proc: Proc
    pumps: list[threading.Thread]
    tail: collections.deque[str]
    start: float  # time.monotonic(): the timeout's clock
    started_unix: float
    gate_unix: float | None = None  # a repeat started early: when the guard opened its gate


def start_command(cmd: list[str], timeout_s: float | None, running: list[Proc],
                  fork_slot: int | None = None, env: dict[str, str] | None = None) -> Started:
    """Start `cmd` in its own process group, its output streaming through; the process is
    put in `running`, so a signal handler can stop its group. With `fork_slot`, the fork
    server of that slot forks it when it can (the time spent waiting for a server that is
    still starting counts against the timeout). `env`: its environment instead of ours."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    start, started_unix = time.monotonic(), round(time.time(), 3)
    proc, stdout, stderr = _launch(cmd, fork_slot, timeout_s, start, env)
    running.append(proc)
    pumps = [_pump(stdout, sys.stdout.buffer, tail), _pump(stderr, sys.stderr.buffer, tail)]
    return Started(proc, pumps, tail, start, started_unix)


def wait_command(started: Started, timeout_s: float | None, grace_s: float,
                 running: list[Proc], watch: Callable[[], bool] | None = None) -> Outcome:
    """Wait for a started command to end, killing it on timeout. `watch` is called every
    WATCH_S while it runs, until it returns True."""
    proc = started.proc
    timed_out = stopped_at_start = False
    lost_agent_seen: float | None = None
    next_look = started.start  # at the output, for a lost agent: every POLL_S
    deadline = None if timeout_s is None else started.start + timeout_s
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        poll = WATCH_S if watch is not None else POLL_S
        step = poll if left is None else min(poll, left)
        try:
            proc.wait(timeout=step)
            break
        except subprocess.TimeoutExpired:
            if left is not None and left <= step:
                timed_out = True
                _stop_group(proc, signal.SIGTERM, grace_s)
                break
            if watch is not None and watch():
                watch = None
            if lost_agent_seen is None and time.monotonic() >= next_look:
                next_look = time.monotonic() + POLL_S
                if lost_agent_at_start(started):
                    lost_agent_seen = time.monotonic()
            if lost_agent_seen and time.monotonic() - lost_agent_seen >= START_FAILURE_STOP_S:
                print("guard: nsys lost its agent while starting and the command goes on "
                      "(the other ranks wait for that one): stopping it", file=sys.stderr)
                stopped_at_start = True
                _stop_group(proc, signal.SIGTERM, grace_s)
                break
    _drain(proc, started.pumps)
    running.remove(proc)
    lost = getattr(proc, "lost", None)
    if lost:
        started.tail.append(f"guard: {lost}")
    return Outcome(proc.returncode, round(time.monotonic() - started.start, 3), timed_out,
                   started.started_unix, started.tail, started.gate_unix, stopped_at_start)


def lost_agent_at_start(started: Started) -> bool:
    """The running command said that nsys lost its agent, while its session was starting."""
    if time.monotonic() - started.start > START_FAILURE_MAX_S + TORCHRUN_START_S:
        return False
    # a copy first: the output pumps append to the tail while the guard reads it
    return any(NSYS_START_FAILURE.search(line.strip()) for line in list(started.tail))


def _launch(cmd: list[str], fork_slot: int | None, timeout_s: float | None,
            start: float, env: dict[str, str] | None = None
            ) -> tuple[Proc, IO[bytes], IO[bytes]]:
    """The running command and its stdout/stderr: forked by the server when it can, else a
    process of its own."""
    if fork_slot is not None and os.environ.get(forkserver.ENV_NAME):
        try:
            return _fork(cmd, fork_slot, timeout_s, start, env)
        except forkserver.Unavailable as e:
            print(f"guard: not forked ({e}); starting a process", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    return proc, proc.stdout, proc.stderr


def _fork(cmd: list[str], slot: int, timeout_s: float | None, start: float,
          env: dict[str, str] | None = None) -> tuple[forkserver.Child, IO[bytes], IO[bytes]]:
    argv = forkserver.workload_argv(cmd)
    wait_s = SERVER_WAIT_S if timeout_s is None else min(SERVER_WAIT_S, timeout_s)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    stdin = _stdin_fd()
    try:
        child = forkserver.spawn(slot, argv, (stdin, out_w, err_w), deadline=start + wait_s,
                                 env=env)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        for fd in (out_w, err_w):
            os.close(fd)
        if stdin != 0:
            os.close(stdin)
    print(f"guard: forked by fork server {slot} (pid {child.pid})", file=sys.stderr, flush=True)
    return child, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")


def _stdin_fd() -> int:
    """Our stdin for the child, as a started process would inherit it (/dev/null if closed)."""
    try:
        os.fstat(0)
    except OSError:
        return os.open(os.devnull, os.O_RDONLY)
    return 0


# --- judging the outcome ----------------------------------------------------------------------


def _read_own_result(path: Path) -> dict[str, Any] | None:
    """The command's own record, if it wrote a complete JSON object (with or without a
    ``status``: a record without one, e.g. calibrate's, is judged by the exit code)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _last_lines(tail: collections.deque[str]) -> str:
    lines = [line.rstrip() for line in tail if line.strip()]
    lines, root_cause = _without_torchrun_report(lines)
    if root_cause:
        return "\n".join([*lines[-(MESSAGE_LINES - 1):], root_cause])
    return "\n".join(lines[-MESSAGE_LINES:])


def _torchrun_report_at(lines: Sequence[str]) -> int | None:
    """Where torchrun's report of a failed job starts in the output (its ChildFailedError)."""
    return next((i for i in range(len(lines) - 1, -1, -1)
                 if lines[i].startswith(TORCHRUN_FAILED)), None)


def _without_torchrun_report(lines: list[str]) -> tuple[list[str], str | None]:
    """The lines before torchrun's closing report of a failed job, and the report's root
    cause in one line. The report (torchrun's own traceback ending in ChildFailedError, then
    the failures and their "Root Cause") and its agent's log lines fill a message by
    themselves and hide the failed rank's own error, printed before them."""
    end = _torchrun_report_at(lines)
    if end is None:
        return lines, None
    start = next((i for i in range(end, -1, -1) if lines[i].startswith("Traceback (most")),
                 end)
    report = lines[end:]
    cause = report[next((i for i, line in enumerate(report) if "Root Cause" in line), 0):]
    fields = dict(m.groups() for line in cause if (m := TORCHRUN_FIELD.match(line)))
    before = [line for line in lines[:start] if not TORCHRUN_LOG.match(line)]
    if "rank" not in fields:
        return before, None
    rank, exitcode = fields["rank"].split()[0], fields.get("exitcode", "?").split()[0]
    return before, f"torchrun: rank {rank} failed first (exit code {exitcode})"


def _how_it_ended(outcome: Outcome) -> str:
    name = outcome.signal_name
    if outcome.returncode < 0:
        return f"killed by {name}"
    return f"exited with code {outcome.returncode}" + (f" ({name})" if name else "")


def _oom_evidence(outcome: Outcome) -> str | None:
    """Why the failed command looks like it ran out of memory, or None."""
    if outcome.signal_name == "SIGKILL":
        return "killed by SIGKILL (the kernel's OOM killer)"
    if outcome.returncode == EXIT_OOM:
        return f"exited with code {EXIT_OOM} (out of memory)"
    for line in reversed(outcome.tail):
        if OOM_OUTPUT.search(line):
            return line.strip()
    return None


def classify_failure(outcome: Outcome) -> dict[str, Any]:
    """The result of a command that left no status of its own."""
    if outcome.returncode == 0:
        return {"status": "ok"}
    oom = _oom_evidence(outcome)
    if oom:
        return {"status": "oom", "message": oom}
    how = _how_it_ended(outcome)
    if outcome.returncode == EXIT_UNSUPPORTED:
        return {"status": "unsupported", "message": f"{how}: {_last_lines(outcome.tail)}"}
    output = _last_lines(outcome.tail)
    return {"status": "error", "message": f"{how}; last output:\n{output}" if output else how}


def _timeout_result(timeout_s: float) -> dict[str, Any]:
    return {"status": "timeout",
            "message": f"exceeded timeout_min={timeout_s / 60:g} ({timeout_s:g} s)"}


def judge(outcome: Outcome, own: dict[str, Any] | None, timeout_s: float | None) -> dict[str, Any]:
    """The result: timeout first, then the command's own status, else what its exit says."""
    if outcome.timed_out:
        assert timeout_s is not None
        result = {**(own or {}), **_timeout_result(timeout_s)}
    elif own is not None and isinstance(own.get("status"), str):
        result = dict(own)
        if own["status"] == "ok" and outcome.returncode != 0:
            # The workload finished but the wrapper around it (nsys) failed afterwards.
            output = _last_lines(outcome.tail)
            result.update(status="error",
                          message=f"{_how_it_ended(outcome)} after the run reported ok; "
                                  f"last output:\n{output}")
    else:  # no status of its own: the exit says; keep whatever the record holds
        result = {**(own or {}), **classify_failure(outcome)}
    ended = round(outcome.started_unix + outcome.elapsed_s, 3)
    if outcome.gate_unix is None:
        timeline = {"started": outcome.started_unix, "ended": ended}
    else:  # started early: its share of the job begins when its gate opened
        timeline = {"launched": outcome.started_unix, "started": outcome.gate_unix,
                    "ended": ended}
    result.update(returncode=outcome.returncode, elapsed_s=outcome.elapsed_s,
                  guard_unix=timeline)
    if outcome.signal_name and outcome.returncode < 0:
        result["signal"] = outcome.signal_name
    return result


# --- expected files ---------------------------------------------------------------------------


def _sqlite_truncation(path: Path) -> str | None:
    """A problem with the SQLite header or the file's length, or None. The header's page count
    is valid when its version-valid-for number equals the change counter (SQLite file format,
    section 1.3.7): a file shorter than that many pages was cut off."""
    with path.open("rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return "is not an SQLite database"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    counter_valid = header[24:28] == header[92:96]
    size = path.stat().st_size
    if counter_valid and pages and size < pages * page_size:
        return f"is truncated ({size} of {pages * page_size} bytes)"
    return None


def check_nsys_export(path: Path) -> str | None:
    """Why `path` is not a complete nsys SQLite export, or None."""
    problem = _sqlite_truncation(path)
    if problem:
        return f"{path.name} {problem}"
    try:
        con = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
            for table in NSYS_EXPORT_TABLES:
                if table not in tables:
                    return f"{path.name}: export lacks table {table}"
                con.execute(f"SELECT * FROM {table} LIMIT 1").fetchall()
        finally:
            con.close()
    except sqlite3.Error as e:
        return f"{path.name} is not a readable SQLite database ({e})"
    return None


def check_expected(paths: list[Path], producer: str) -> str | None:
    """Why the expected outputs are not all there and sound, or None."""
    for path in paths:
        if not path.exists():
            return f"{producer} produced no {path.name} ({path})"
        if path.stat().st_size == 0:
            return f"{producer} produced an empty {path.name} ({path})"
        if path.suffix == ".sqlite":
            problem = check_nsys_export(path)
            if problem:
                return problem
    return None


# --- writing the result -----------------------------------------------------------------------


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to a temporary file next to `path`, then rename it into place: a reader
    sees the old file, no file, or the complete new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- command line -----------------------------------------------------------------------------


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.guard",
        description="Run CMD and always write RESULT.json with its status.",
    )
    parser.add_argument("--out", required=True, type=Path, help="the result JSON")
    parser.add_argument("--timeout-s", type=float, help="stop CMD after this many seconds")
    parser.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S,
                        help="between SIGTERM and SIGKILL (default %(default)s)")
    parser.add_argument("--expect", nargs="+", type=Path, default=[], metavar="FILE",
                        help="files a successful CMD must leave (non-empty; nsys exports)")
    parser.add_argument("--run", help="the run's name, recorded in the result")
    parser.add_argument("--fork-slot", metavar="N",
                        help="let fork server N (PROFBENCH_FORKSERVER) fork a `python -m "
                             "workloads` CMD; without a server CMD starts as a process")
    parser.add_argument("--repeats", type=int, metavar="R",
                        help=f"run CMD R times, one after another; {REPEAT} in --out, "
                             "--fork-slot and CMD becomes the repeat's index")
    parser.add_argument("--gpu-locks", type=Path, metavar="DIR",
                        help="take whole GPUs of the host (--host-gpus) under the locks in DIR")
    parser.add_argument("--host-gpus", metavar="IDS",
                        help="the host's GPUs, comma-separated CUDA_VISIBLE_DEVICES entries "
                             f"(or {gpus.CPU})")
    parser.add_argument("--gpus", type=int, metavar="K",
                        help="GPUs the job takes (default: the --ranks of a pipeline.launch "
                             "CMD, else 1)")
    parser.add_argument("--device-lock", action="store_true",
                        help="give CMD its GPU's device lock (PROFBENCH_DEVICE_LOCK)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    if args.cmd[:1] == ["--"]:
        args.cmd = args.cmd[1:]
    if not args.cmd:
        parser.error("no command given (put it after --)")
    if args.timeout_s is not None and args.timeout_s <= 0:
        parser.error(f"--timeout-s must be positive, not {args.timeout_s:g}")
    if (args.gpu_locks is None) != (not args.host_gpus):
        parser.error("--gpu-locks and --host-gpus go together")
    if args.gpus is not None and args.gpus < 1:
        parser.error(f"--gpus must be at least 1, not {args.gpus}")
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error(f"--repeats must be at least 1, not {args.repeats}")
        if REPEAT not in str(args.out):
            parser.error(f"--repeats needs {REPEAT} in --out (each repeat writes its own)")
    elif any(REPEAT in a for a in [str(args.out), args.fork_slot or "", *args.cmd]):
        parser.error(f"{REPEAT} is only replaced with --repeats")
    try:
        [_slot(args.fork_slot, i) for i in range(args.repeats or 1)]
    except ValueError:
        parser.error(f"--fork-slot must be a number (or {REPEAT}), not {args.fork_slot!r}")
    args.held = None  # the GPUs the job holds, once taken (take_gpus)
    return args


def take_gpus(args: argparse.Namespace) -> gpus.Held | None:
    """The job's whole GPUs (--gpu-locks), put in this process's environment so that
    everything it starts (a process, a fork server's child, torchrun's ranks) has them."""
    if args.gpu_locks is None:
        return None
    host = args.host_gpus.split(",")
    count = args.gpus or launch.ranks_in(args.cmd) or 1
    held = gpus.take(args.gpu_locks, host, count, owner=args.run or str(args.out))
    os.environ.update(held.env())
    if args.device_lock:
        os.environ[startgate.ENV_DEVICE_LOCK] = str(held.device_lock())
    what = ("the CPU's slot (no GPU)" if held.gpus == [gpus.CPU] else
            f"GPU {', '.join(map(str, held.indices))} of {len(host)}, "
            f"CUDA_VISIBLE_DEVICES={held.env()[gpus.ENV]}")
    print(f"guard: took {what} after {held.waited_s:.2f} s", file=sys.stderr, flush=True)
    return held


def _slot(fork_slot: str | None, repeat: int, held: gpus.Held | None = None) -> int | None:
    """The fork server of a repeat: its slot, on the server of the job's GPU."""
    if fork_slot is None:
        return None
    slot = int(fork_slot.replace(REPEAT, str(repeat)))
    return held.fork_slot(slot) if held is not None else slot


def repeat_args(args: argparse.Namespace, repeat: int) -> argparse.Namespace:
    """The arguments of one repeat: its index in place of {repeat} (--out, --fork-slot, CMD)."""
    held = getattr(args, "held", None)
    if args.repeats is None:
        return argparse.Namespace(**{**vars(args), "fork_slot": _slot(args.fork_slot, 0, held)})
    put = str(repeat)
    return argparse.Namespace(**{
        **vars(args), "out": Path(str(args.out).replace(REPEAT, put)),
        "fork_slot": _slot(args.fork_slot, repeat, held),
        "cmd": [a.replace(REPEAT, put) for a in args.cmd]})


def skipped_result(repeat: int, after: int, ended: dict[str, Any]) -> dict[str, Any]:
    """The record of a repeat not started because repeat `after` ended the run."""
    why = str(ended.get("message") or "").strip().splitlines()
    return {"status": SKIPPED, "repeat": repeat,
            "skipped_after": {"repeat": after, "status": ended["status"]},
            "message": f"not run: repeat {after} ended {ended['status']}"
                       + (f" ({why[0]})" if why else "")}


def _install_stop_handlers() -> None:
    """SIGINT/SIGTERM/SIGHUP raise Interrupted once; repeats wait for the first to finish."""
    received: list[int] = []

    def handle(signum: int, _frame: object) -> None:
        if not received:
            received.append(signum)
            raise Interrupted(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, handle)


def failed_to_start(outcome: Outcome, own: dict[str, Any] | None) -> bool:
    """nsys lost its agent while the session started: a quick exit (1, or 0: nsys has also
    exited 0 after "Connection to Agent lost"), no record of the run.
    Under torchrun (one nsys per rank), torchrun's own start-up comes first, and a rank that
    only saw its peer's nsys fail, stopped by torchrun, may have recorded just that."""
    if outcome.stopped_at_start:
        return own is None or launch.only_stopped(own)
    under_torchrun = _torchrun_report_at(outcome.tail) is not None
    window = START_FAILURE_MAX_S + (TORCHRUN_START_S if under_torchrun else 0.0)
    nothing_recorded = own is None or (under_torchrun and launch.only_stopped(own))
    return (outcome.returncode in (0, 1) and not outcome.timed_out and nothing_recorded
            and outcome.elapsed_s < window
            and any(NSYS_START_FAILURE.search(line.strip()) for line in outcome.tail))


def guarded_result(args: argparse.Namespace, running: list[Proc],
                   started: Started | None = None,
                   watch: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Run the command (again after a start-up failure of nsys) and judge it. `started`: the
    command already started (a repeat started early); `watch`: see wait_command."""
    for attempt in range(START_RETRIES + 1):
        try:
            if started is None:
                started = start_command(args.cmd, args.timeout_s, running, args.fork_slot)
            outcome = wait_command(started, args.timeout_s, args.grace_s, running, watch)
        except OSError as e:  # not found, not executable: still a result
            return {"status": "error", "message": f"cannot run {args.cmd[0]}: {e.strerror or e}",
                    "returncode": None, "elapsed_s": 0.0}
        started = None
        own = _read_own_result(args.out)
        if attempt == START_RETRIES or not failed_to_start(outcome, own):
            break
        print("guard: nsys lost its agent while starting (a known transient of nsys); "
              "starting the command again", file=sys.stderr)
        args.out.unlink(missing_ok=True)  # a stopped rank's record is not the next attempt's
        time.sleep(START_RETRY_PAUSE_S * (attempt + 1))
    result = judge(outcome, own, args.timeout_s)
    if result["status"] == "ok":
        problem = check_expected(args.expect, Path(args.cmd[0]).name)
        if problem:
            result.update(status="error", message=problem)
    return result


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    running: list[Proc] = []
    _install_stop_handlers()
    note = bytecode.keep_bytecode(os.environ)  # before a fork server starts in this env
    if note:
        print(f"guard: {note}", file=sys.stderr, flush=True)
    if args.fork_slot is None:
        _adopt_orphans()
    one = repeat_args(args, 0)
    early: EarlyStart | None = None
    try:
        args.held = take_gpus(args)  # first: nothing of the job runs before it has its GPUs
        if args.fork_slot is not None and args.repeats is not None:
            start_fork_servers(args)
        ended: tuple[int, dict[str, Any]] | None = None  # the repeat that ended the run
        for repeat in range(args.repeats or 1):
            one = repeat_args(args, repeat)
            if ended is not None:
                write_result(one, skipped_result(repeat, *ended), repeat)
                continue
            if args.repeats is not None:
                print(f"guard: repeat {repeat} of {args.repeats}", file=sys.stderr, flush=True)
            gated, started = early, early.started if early is not None else None
            if started is None:
                one.out.unlink(missing_ok=True)  # a stale result must not pass for this run's
            early = (EarlyStart(repeat_args(args, repeat + 1), one.out, running)
                     if args.repeats is not None and repeat + 1 < args.repeats
                     and startgate.honours_gate(args.cmd) else None)
            result = write_result(one, guarded_result(one, running, started,
                                                      early.watch if early else None),
                                  None if args.repeats is None else repeat)
            if gated is not None:
                gated.close()
            if args.repeats is not None and result["status"] in FINAL_STATUSES:
                ended = (repeat, result)
                if early is not None:
                    early.cancel(args.grace_s)
            elif early is not None:
                early.open()
    except Interrupted as stop:
        for proc in running:
            _stop_group(proc, stop.signum, args.grace_s)
        one.out.unlink(missing_ok=True)  # an interrupted run has no result
        print(f"guard: interrupted by {stop}; the command's process group was stopped and "
              f"no result was written", file=sys.stderr)
        return 128 + stop.signum
    finally:
        if early is not None:
            early.close()
        if args.held is not None:
            args.held.release()
    return 0


class EarlyStart:
    """The next repeat, started while the current one exits (workloads/startgate.py): once
    the current repeat has written its record (its measurement is over, and it did not end
    the run), the next one starts with a closed start gate. It creates its CUDA context and
    waits; the guard opens the gate after reaping the current repeat, and it measures then."""

    def __init__(self, args: argparse.Namespace, previous_out: Path,
                 running: list[Proc]) -> None:
        self.args, self.previous_out, self.running = args, previous_out, running
        self.gate = args.out.with_name(f".{args.out.name}.gate")
        self.started: Started | None = None

    def watch(self) -> bool:
        """Start the repeat if the current one's record is there; True once decided."""
        own = _read_own_result(self.previous_out)
        if own is None:
            return False
        if own.get("status") in FINAL_STATUSES:
            return True  # the run ends here: no next repeat
        self.args.out.unlink(missing_ok=True)
        self.gate.unlink(missing_ok=True)
        env = {**os.environ, startgate.ENV_GATE: startgate.gate_value(self.gate, os.getpid())}
        try:
            self.started = start_command(self.args.cmd, self.args.timeout_s, self.running,
                                         self.args.fork_slot, env)
        except OSError:
            return True  # started at its turn instead, where the error becomes its result
        print(f"guard: {self.args.out.name} started while the previous repeat exits (it waits "
              "at its start gate)", file=sys.stderr, flush=True)
        return True

    def open(self) -> None:
        """The current repeat is reaped: let the next one go on."""
        if self.started is not None:
            startgate.open_gate(self.gate)
            self.started.gate_unix = round(time.time(), 3)

    def cancel(self, grace_s: float) -> None:
        """The run ended: stop the repeat waiting at its gate (it has run nothing)."""
        if self.started is not None:
            _stop_group(self.started.proc, signal.SIGKILL, grace_s)
            _drain(self.started.proc, self.started.pumps)
            self.running.remove(self.started.proc)
            self.started = None

    def close(self) -> None:
        self.gate.unlink(missing_ok=True)


def start_fork_servers(args: argparse.Namespace) -> None:
    """The servers of all the run's repeats, started together before the first repeat (one
    after another, each waiting for its first repeat, they cost a preload each)."""
    start = time.monotonic()
    wait_s = SERVER_WAIT_S if args.timeout_s is None else min(SERVER_WAIT_S, args.timeout_s)
    started = forkserver.start_servers(
        [_slot(args.fork_slot, i, args.held) for i in range(args.repeats)], start + wait_s)
    if started:
        print(f"guard: started fork servers {', '.join(map(str, started))} together "
              f"({time.monotonic() - start:.2f} s)", file=sys.stderr, flush=True)


def write_result(args: argparse.Namespace, result: dict[str, Any],
                 repeat: int | None = None) -> dict[str, Any]:
    """Write one command's (or skipped repeat's) result, named after its run, and say so."""
    if args.run:
        result.setdefault("run", args.run)
    if args.held is not None:
        result["assigned_gpus"] = args.held.record()
    write_atomically(args.out, result)
    how = (result["message"] if result["status"] == SKIPPED
           else f"{result['status']} (exit {result['returncode']}, {result['elapsed_s']} s)")
    which = "" if repeat is None else f" r{repeat}"
    print(f"guard: {args.run or args.cmd[0]}{which}: {how}", file=sys.stderr, flush=True)
    return result


if __name__ == "__main__":
    sys.exit(main())
