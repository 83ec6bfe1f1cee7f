"""Run one job's command so that its outcome is always a result record, never a crash.

    python -m pipeline.guard --out RESULT.json [--timeout-s N] [--expect FILE ...] -- CMD ...

* The command runs in its own process group; its output goes to the guard's (the job log).
* Past ``--timeout-s`` the whole group gets SIGTERM, then SIGKILL: status ``timeout``.
* If the command left a RESULT.json with a ``status`` (the workloads always write one), it is
  kept, with ``returncode`` and ``elapsed_s`` added. Otherwise the guard writes one: ``oom``
  when the process was SIGKILLed (the kernel's OOM killer) or its output says it ran out of
  memory, else ``error`` with the end of its output.
* ``--expect``: after a successful command each file must exist and be non-empty, and a
  ``.sqlite`` file must be an nsys export with its core tables; else status ``error`` naming
  what is missing (the capture itself failed although the workload ran).
* The guard exits 0 whenever it wrote a result: the status is the result. If the guard itself
  is interrupted (SIGINT/SIGTERM: the user stopped the workflow), it stops the command, writes
  nothing and exits non-zero, so Snakemake marks the job incomplete and reruns it.
* RESULT.json is written atomically (temporary file + rename): a half-written record is never
  taken as complete.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

KILL_GRACE_S = 10
OUTPUT_TAIL_LINES = 30
OOM_MARKERS = ("out of memory", "can't allocate memory", "memoryerror", "cannot allocate memory")
# An nsys export that can be analysed has at least these tables.
EXPORT_TABLES = ("StringIds", "TARGET_INFO_SESSION_START_TIME")


class Interrupted(Exception):
    """The guard itself was asked to stop."""


def run_guarded(cmd: list[str], timeout_s: float | None) -> tuple[int | None, str, float, bool]:
    """(returncode, output tail, elapsed seconds, timed out); output is echoed as it comes."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    tail: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
    reader = threading.Thread(target=_pump, args=(proc, tail), daemon=True)
    reader.start()
    stop = _forward_signals(proc)
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
    reader.join(timeout=5)
    if stop["signal"] is not None:
        raise Interrupted(stop["signal"])
    return proc.returncode, "".join(tail), time.monotonic() - start, timed_out


def _pump(proc: subprocess.Popen, tail: deque[str]) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace")
        sys.stdout.write(line)
        sys.stdout.flush()
        tail.append(line)


def _forward_signals(proc: subprocess.Popen) -> dict[str, int | None]:
    """SIGINT/SIGTERM to the guard stop the command's whole group."""
    state: dict[str, int | None] = {"signal": None}

    def handler(signum: int, _frame: object) -> None:
        state["signal"] = signum
        _kill_group(proc)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    return state


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def classify_failure(returncode: int | None, tail: str) -> tuple[str, str]:
    """(status, message) of a command that wrote no result of its own."""
    lowered = tail.lower()
    if returncode == -signal.SIGKILL or any(m in lowered for m in OOM_MARKERS):
        reason = "killed by SIGKILL (out of memory?)" if returncode == -signal.SIGKILL else ""
        return "oom", (reason + "\n" + tail).strip()[-2000:]
    how = f"signal {-returncode}" if returncode is not None and returncode < 0 else \
        f"exit code {returncode}"
    return "error", f"command failed ({how}) without a result:\n{tail}"[-2000:]


def missing_expected(paths: list[Path]) -> str | None:
    """Why the expected outputs are not usable, or None."""
    for path in paths:
        if not path.is_file() or path.stat().st_size == 0:
            return f"expected output {path} was not produced (see the log above)"
        if path.suffix == ".sqlite":
            problem = _export_problem(path)
            if problem:
                return problem
    return None


def _export_problem(path: Path) -> str | None:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as exc:
        return f"{path} is not a readable SQLite export: {exc}"
    lacking = [t for t in EXPORT_TABLES if t not in tables]
    return f"{path} lacks table(s) {', '.join(lacking)}: not a complete nsys export" \
        if lacking else None


def read_record(path: Path, returncode: int | None) -> dict[str, Any] | None:
    """The command's own record; one without a status counts as ok only if it exited 0."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    if "status" not in record:
        if returncode != 0:
            return None
        record["status"] = "ok"
    return record


def write_atomically(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def guard(out: Path, cmd: list[str], timeout_s: float | None, expect: list[Path],
          run: str | None = None) -> dict[str, Any]:
    """Run ``cmd`` and leave its result record at ``out``; return the record."""
    # A stale record from an earlier attempt must not pass for this one's.
    out.unlink(missing_ok=True)
    returncode, tail, elapsed, timed_out = run_guarded(cmd, timeout_s)
    record = read_record(out, returncode)
    if timed_out:
        record = {**(record or {}), "status": "timeout",
                  "message": f"exceeded the time limit of {timeout_s:.0f} s (timeout_min)"}
    elif record is None:
        status, message = classify_failure(returncode, tail)
        record = {"status": status, "message": message}
    elif record["status"] == "ok":
        problem = missing_expected(expect) if returncode == 0 else \
            f"exit code {returncode} after an ok record"
        if problem:
            record.update(status="error", message=problem)
    record.update(returncode=returncode, elapsed_s=round(elapsed, 3))
    if run is not None:
        record.setdefault("run", run)
    write_atomically(out, record)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.guard", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the job's result record")
    parser.add_argument("--timeout-s", type=float, default=None)
    parser.add_argument("--expect", type=Path, action="append", default=[])
    parser.add_argument("--run", default=None, help="run name, recorded in the result")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given (put it after --)")
    try:
        record = guard(args.out, cmd, args.timeout_s, args.expect, args.run)
    except Interrupted as stop:
        print(f"guard: interrupted by signal {stop.args[0]}; no result written", file=sys.stderr)
        return 128 + int(stop.args[0])
    print(f"guard: {args.out}: status {record['status']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
