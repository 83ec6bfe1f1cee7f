"""What a capture needs beyond any command: nsys losing its own agent while a session starts
is started again, and a capture counts only when its export is a complete nsys SQLite file.

Nsight Systems (2024.2) now and then loses its agent, or cannot reach it, on a busy machine:
it exits 1 (or 0) before the workload ran, saying one of NSYS_START_FAILURE. Nothing of the
run exists yet, so the guard starts the command again, up to START_RETRIES times. Under
torchrun (one nsys per rank) the window also covers torchrun's start-up, and a rank stopped
because its peer's nsys failed may have recorded only that; a command still running
START_FAILURE_STOP_S after saying so (a rank's nsys exited 0 and its peers wait for it) is
stopped first.
"""

from __future__ import annotations

import re
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline import launch
from pipeline.process import Outcome, Running
from pipeline.verdict import torchrun_report_at

NSYS_START_FAILURE = re.compile(
    r"Connection to Agent lost|^End of file$|Local Endpoint is not available")
START_FAILURE_MAX_S = 30.0  # within a second on a quiet machine, 10 s on a saturated one
TORCHRUN_START_S = 15.0  # torchrun's agent imports torch and starts the ranks first
START_FAILURE_STOP_S = 3.0
START_RETRIES = 2
START_RETRY_PAUSE_S = 1.0  # times the attempt: let the other session's start-up pass
NSYS_EXPORT_TABLES = ("StringIds", "TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT")
SQLITE_MAGIC = b"SQLite format 3\x00"


def _said_lost_agent(lines: list[str]) -> bool:
    return any(NSYS_START_FAILURE.search(line.strip()) for line in lines)


def lost_agent_watch() -> Callable[[Running], bool]:
    """For Running.wait: True once the command said nsys lost its agent at start and still
    runs START_FAILURE_STOP_S later."""
    seen: list[float] = []

    def watch(running: Running) -> bool:
        age = time.monotonic() - running.start
        if not seen and age <= START_FAILURE_MAX_S + TORCHRUN_START_S \
                and _said_lost_agent(list(running.tail)):  # a copy: the pumps append
            seen.append(time.monotonic())
        stop = bool(seen) and time.monotonic() - seen[0] >= START_FAILURE_STOP_S
        if stop:
            print("guard: nsys lost its agent while starting and the command goes on "
                  "(the other ranks wait for that one): stopping it", file=sys.stderr, flush=True)
        return stop

    return watch


def failed_to_start(outcome: Outcome, own: dict[str, Any] | None) -> bool:
    """nsys lost its agent while the session started: nothing of the run was recorded."""
    if outcome.stopped:
        return own is None or launch.only_stopped(own)
    under_torchrun = torchrun_report_at(list(outcome.tail)) is not None
    window = START_FAILURE_MAX_S + (TORCHRUN_START_S if under_torchrun else 0.0)
    nothing_recorded = own is None or (under_torchrun and launch.only_stopped(own))
    return (outcome.returncode in (0, 1) and not outcome.timed_out and nothing_recorded
            and outcome.elapsed_s < window and _said_lost_agent(list(outcome.tail)))


def _sqlite_truncation(path: Path) -> str | None:
    """A bad header, or a file shorter than its header's page count (valid when its
    version-valid-for number equals the change counter: SQLite file format, 1.3.7)."""
    with path.open("rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return "is not an SQLite database"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages, size = int.from_bytes(header[28:32], "big"), path.stat().st_size
    if header[24:28] == header[92:96] and pages and size < pages * page_size:
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
    """Why the files a successful command must leave are not all there and sound, or None."""
    for path in paths:
        if not path.exists():
            return f"{producer} produced no {path.name} ({path})"
        if path.stat().st_size == 0:
            return f"{producer} produced an empty {path.name} ({path})"
        if path.suffix == ".sqlite" and (problem := check_nsys_export(path)):
            return problem
    return None
