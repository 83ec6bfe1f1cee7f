"""The runs that did not end ``ok``, named at the end of a pipeline run (``onsuccess``): each
run of summary.csv with its status, its message's first line and the log with the rest; and
``fail_on: error``, which makes them an exit 1.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

OK = "ok"
# the config's `fail_on` (schemas/config.schema.yaml): what makes the workflow exit non-zero
FAIL_ON = ("never", "error")
MESSAGE_CHARS = 160


@dataclass(frozen=True)
class Failure:
    run: str
    status: str
    message: str
    log: Path


def failed_runs(results: Path) -> tuple[int, list[Failure]]:
    """(runs in summary.csv, those whose status is not ok); (0, []) without a summary."""
    summary = results / "summary.csv"
    if not summary.is_file():
        return 0, []
    with open(summary, newline="") as f:
        rows = list(csv.DictReader(f))
    failed = [Failure(r["run"], r["status"], first_line(r.get("message") or ""),
                      failure_log(results, r["run"], r["status"]))
              for r in rows if (r.get("status") or OK) != OK]
    return len(rows), failed


def first_line(message: str) -> str:
    line = next((s.strip() for s in message.splitlines() if s.strip()), "(no message)")
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 1] + "…"


def failure_log(results: Path, run: str, status: str) -> Path:
    """The job log with the run's traceback: its capture's for a capture that failed
    (`capture_<status>`), else its timing job's (rules/profile.smk)."""
    job = "profile" if status.startswith("capture_") else "time_run"
    return results / "logs" / job / f"{run}.log"


def failure_block(total: int, failed: list[Failure], fail_on: str) -> str:
    """The console block; "" when every run ended ok."""
    if not failed:
        return ""
    consequence = ("fail_on: error: the workflow exits 1" if fail_on == "error" else
                   "kept as results; fail_on: error makes that an exit 1")
    width = max(len(f.run) for f in failed)
    lines = [f"profbench: {len(failed)} of {total} runs did not end ok (summary.csv; "
             f"{consequence}):"]
    for f in failed:
        lines.append(f"  {f.run:<{width}}  {f.status}: {f.message}")
        lines.append(f"  {'':<{width}}  log: {f.log}")
    return "\n".join(lines)


def end_of_run(results: Path, fail_on: str) -> tuple[str, str | None]:
    """(the block to print, the error to stop with under ``fail_on: error`` or None)."""
    total, failed = failed_runs(results)
    block = failure_block(total, failed, fail_on)
    if fail_on == "error" and failed:
        return block, (f"{len(failed)} run(s) did not end ok ({', '.join(f.run for f in failed)})"
                       " and the config says fail_on: error; their results are kept")
    return block, None
