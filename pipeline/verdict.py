"""A command's result from how it ended: its own record's status, else what its exit and its
last lines say (timeout, oom, unsupported, error), with the failed rank's own lines first for
a distributed run (torchrun's closing report would fill the message by itself)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pipeline.process import Outcome
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
    report = lines[end:]
    cause = report[next((i for i, line in enumerate(report) if "Root Cause" in line), 0):]
    fields = dict(m.groups() for line in cause if (m := TORCHRUN_FIELD.match(line)))
    before = [line for line in lines[:start] if not TORCHRUN_LOG.match(line)]
    if "rank" not in fields:
        return "\n".join(before[-MESSAGE_LINES:])
    rank, code = fields["rank"].split()[0], fields.get("exitcode", "?").split()[0]
    return "\n".join([*before[-(MESSAGE_LINES - 1):],
                      f"torchrun: rank {rank} failed first (exit code {code})"])


def how_it_ended(outcome: Outcome) -> str:
    name = outcome.signal_name
    if outcome.returncode < 0:
        return f"killed by {name}"
    return f"exited with code {outcome.returncode}" + (f" ({name})" if name else "")


def classify(outcome: Outcome) -> dict[str, Any]:
    """The status of a command that left none of its own."""
    if outcome.returncode == 0:
        return {"status": "ok"}
    if outcome.signal_name == "SIGKILL":
        return {"status": "oom", "message": "killed by SIGKILL (the kernel's OOM killer)"}
    if outcome.returncode == EXIT_OOM:
        return {"status": "oom", "message": f"exited with code {EXIT_OOM} (out of memory)"}
    said = next((line.strip() for line in reversed(outcome.tail) if OOM_OUTPUT.search(line)),
                None)
    if said:
        return {"status": "oom", "message": said}
    how, output = how_it_ended(outcome), last_lines(outcome.tail)
    if outcome.returncode == EXIT_UNSUPPORTED:
        return {"status": "unsupported", "message": f"{how}: {output}"}
    return {"status": "error", "message": f"{how}; last output:\n{output}" if output else how}


def judge(outcome: Outcome, own: dict[str, Any] | None, timeout_s: float | None
          ) -> dict[str, Any]:
    """The result: a timeout first, then the command's own status, else what its exit says;
    with the exit code, elapsed time and when it ran (``guard_unix``)."""
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
        result["signal"] = outcome.signal_name
    return result
