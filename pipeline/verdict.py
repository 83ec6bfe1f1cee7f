"""A command's result from how it ended (docs/reliability.md), and what a capture adds: nsys
losing its agent while a session starts (a transient of Nsight Systems on a busy machine: it
exits 1 or 0 before the workload ran, so the guard starts the command again), and an export
counts only as an nsys SQLite file the analysis can open (analysis/reading/database.py).
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.launch import only_stopped
from pipeline.process import Running
from workloads.contract import EXIT_CODES

MESSAGE_LINES = 12  # of the output's last lines, how many an error's message keeps
EXIT_OOM, EXIT_UNSUPPORTED = EXIT_CODES["oom"], EXIT_CODES["unsupported"]
# Out of memory as Python, glibc, PyTorch, C++ say it, and a target killed by SIGKILL.
OOM_OUTPUT = re.compile(r"out of memory|can(?:no|')t allocate memory|MemoryError|std::bad_alloc"
                        r"|\bKilled\b|signal 9\b|SIGKILL", re.IGNORECASE)
# torchrun's report of a failed job, its fields ("  rank : 0 (...)") and its agent's log lines.
TORCHRUN_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
TORCHRUN_LOG = re.compile(r"^[IWE]\d{4} [\d:.]+ \d+ \S*torch/distributed/elastic/")
TORCHRUN_FIELD = re.compile(r"^\s*(rank|exitcode)\s*:\s*(\S.*?)\s*$")
NSYS_CAPTURES = (".sqlite", ".nsys-rep")  # what an nsys capture leaves
NSYS_START_FAILURE = re.compile(
    r"Connection to Agent lost|^End of file$|Local Endpoint is not available")
START_FAILURE_MAX_S = 30.0  # within a second on a quiet machine, 10 s on a saturated one
TORCHRUN_START_S = 15.0  # torchrun's agent imports torch and starts the ranks first
# A command still running this long after saying so is stopped, then started again.
START_FAILURE_STOP_S = 3.0
START_RETRIES = 2
START_RETRY_PAUSE_S = 1.0  # times the attempt: let the other session's start-up pass


def torchrun_report_at(lines: Sequence[str]) -> int | None:
    """Where torchrun's report of a failed job starts in the output, if anywhere."""
    return next((i for i in range(len(lines) - 1, -1, -1)
                 if lines[i].startswith(TORCHRUN_FAILED)), None)


def last_lines(tail: Sequence[str]) -> str:
    """The output's last lines; of torchrun's report, only which rank failed first."""
    lines = [line.rstrip() for line in tail if line.strip()]
    end = torchrun_report_at(lines)
    if end is None:
        return "\n".join(lines[-MESSAGE_LINES:])
    start = next((i for i in range(end, -1, -1) if lines[i].startswith("Traceback (most")), end)
    cause = lines[end:]
    cause = cause[next((i for i, line in enumerate(cause) if "Root Cause" in line), 0):]
    fields = dict(m.groups() for line in cause if (m := TORCHRUN_FIELD.match(line)))
    before = [line for line in lines[:start] if not TORCHRUN_LOG.match(line)]
    if "rank" not in fields:
        return "\n".join(before[-MESSAGE_LINES:])
    rank, code = fields["rank"].split()[0], fields.get("exitcode", "?").split()[0]
    return "\n".join([*before[-(MESSAGE_LINES - 1):],
                      f"torchrun: rank {rank} failed first (exit code {code})"])


def signal_name(returncode: int) -> str | None:
    """The signal that killed a command (directly, or a shell's 128+N), if any."""
    code = -returncode if returncode < 0 else returncode - 128
    if 0 < code < signal.NSIG:
        try:
            return signal.Signals(code).name
        except ValueError:
            return f"signal {code}"
    return None


def how_it_ended(outcome: Running) -> str:
    name = signal_name(outcome.returncode)
    if outcome.returncode < 0:
        return f"killed by {name}"
    return f"exited with code {outcome.returncode}" + (f" ({name})" if name else "")


def classify(outcome: Running) -> dict[str, Any]:
    """The status of a command that left none of its own."""
    if outcome.returncode == 0:
        return {"status": "ok"}
    if signal_name(outcome.returncode) == "SIGKILL":
        return {"status": "oom", "message": "killed by SIGKILL (the kernel's OOM killer)"}
    if outcome.returncode == EXIT_OOM:
        return {"status": "oom", "message": f"exited with code {EXIT_OOM} (out of memory)"}
    if said := next((s.strip() for s in reversed(outcome.tail) if OOM_OUTPUT.search(s)), None):
        return {"status": "oom", "message": said}
    how, output = how_it_ended(outcome), last_lines(outcome.tail)
    if outcome.returncode == EXIT_UNSUPPORTED:
        return {"status": "unsupported", "message": f"{how}: {output}"}
    return {"status": "error", "message": f"{how}; last output:\n{output}" if output else how}


def judge(outcome: Running, own: dict[str, Any] | None, timeout_s: float | None
          ) -> dict[str, Any]:
    """The result, with the exit code, elapsed time and when it ran (``guard_unix``)."""
    if outcome.timed_out:
        result = {**(own or {}), "status": "timeout",
                  "message": f"exceeded timeout_min={timeout_s / 60:g} ({timeout_s:g} s)"}
    elif own is not None and isinstance(own.get("status"), str):
        result = dict(own)
        if own["status"] == "ok" and outcome.returncode != 0:  # the wrapper (nsys) failed after
            result.update(status="error",
                          message=f"{how_it_ended(outcome)} after the run reported ok; "
                                  f"last output:\n{last_lines(outcome.tail)}")
    else:
        result = {**(own or {}), **classify(outcome)}
    result.update(returncode=outcome.returncode, elapsed_s=outcome.elapsed_s,
                  guard_unix={"started": outcome.started_unix,
                              "ended": round(outcome.started_unix + outcome.elapsed_s, 3)})
    if outcome.returncode < 0:
        result["signal"] = signal_name(outcome.returncode)
    return result


def _said_lost_agent(lines: Sequence[str]) -> bool:
    return any(NSYS_START_FAILURE.search(line.strip()) for line in list(lines))  # a copy


def lost_agent_watch() -> Callable[[Running], bool]:
    """For Running.wait: True once the command said nsys lost its agent at start and still
    runs START_FAILURE_STOP_S later (a rank's nsys exited 0 and its peers wait for it)."""
    seen: list[float] = []

    def watch(running: Running) -> bool:
        early = time.monotonic() - running.start <= START_FAILURE_MAX_S + TORCHRUN_START_S
        if not seen and early and _said_lost_agent(running.tail):
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] >= START_FAILURE_STOP_S

    return watch


def failed_to_start(outcome: Running, own: dict[str, Any] | None) -> bool:
    """nsys lost its agent while the session started: nothing of the run was recorded (under
    torchrun, a rank stopped because its peer's nsys failed may have recorded only that)."""
    if outcome.stopped:
        return own is None or only_stopped(own)
    under_torchrun = torchrun_report_at(list(outcome.tail)) is not None
    window = START_FAILURE_MAX_S + (TORCHRUN_START_S if under_torchrun else 0.0)
    nothing_recorded = own is None or (under_torchrun and only_stopped(own))
    return (outcome.returncode in (0, 1) and not outcome.timed_out and nothing_recorded
            and outcome.elapsed_s < window and _said_lost_agent(outcome.tail))


def transient(outcome: Running, own: dict[str, Any] | None, missed: Path | None) -> str | None:
    """The transient of nsys on a busy machine that the attempt met, if any, after which the
    command starts again: nsys lost its agent at start, or the run ended ok without the
    capture `missed`."""
    if failed_to_start(outcome, own):
        went_on = "; it went on (its peers wait for it): stopping it" if outcome.stopped else ""
        return f"nsys lost its agent while starting (a known transient of nsys){went_on}"
    if missed is not None:
        return (f"the run ended ok but nsys left no {missed.name} (a transient of nsys on a "
                "busy machine)")
    return None


def check_nsys_export(path: Path) -> str | None:
    """Why `path` is not an nsys SQLite export the analysis can open, or None. (SQLite finds a
    file shorter than its header says: "database disk image is malformed".)"""
    from analysis.reading.database import NSYS_MARKERS, ExportError, connect

    try:
        con, tables = connect(path)
    except ExportError as e:
        return f"{path.name}: {e.reason}"
    con.close()
    missing = [table for table in NSYS_MARKERS if table not in tables]
    return f"{path.name}: export lacks table {missing[0]}" if missing else None


def missed_capture(paths: list[Path]) -> Path | None:
    """The first nsys capture among `paths` that is not there. A run that ended ok without it
    met a transient of nsys on a busy machine (one rank of eight capturing beside a pipeline
    on CI's 2 cores left none, its nsys exiting 0), unless its range never opens: then every
    attempt misses it, and the last is the result."""
    return next((p for p in paths if p.suffix in NSYS_CAPTURES and not p.exists()), None)


def check_expected(paths: list[Path], producer: str) -> str | None:
    """Why the files a successful command must leave are not all there and sound, or None."""
    for path in paths:
        who = "nsys" if path.suffix in NSYS_CAPTURES else producer  # torchrun's: python
        if not path.exists():
            return f"{who} produced no {path.name} ({path})"
        if path.stat().st_size == 0:
            return f"{who} produced an empty {path.name} ({path})"
        if path.suffix == ".sqlite" and (problem := check_nsys_export(path)):
            return problem
    return None
