"""Runs that did not end ``ok``: their record stays, their capture and statistics become
labelled empty files (every downstream job still has its inputs), and the pipeline names them
at its end (``onsuccess``); ``fail_on: error`` makes them an exit 1.

    python -m pipeline.outcome ok RESULT.json                      # exit 0 iff status ok
    python -m pipeline.outcome placeholders RESULT.json FILE ...   # empty FILEs unless ok
    python -m pipeline.outcome failed-stats RESULT.json OUTDIR REPORT ...
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from workloads.jsonfile import read_whole

OK = "ok"
MESSAGE_CHARS = 160


def status_of(result: Path) -> tuple[str, str]:
    """(status, message) of a guarded job's result record; a missing record is an error."""
    if (record := read_whole(result)) is None:
        return "error", f"no readable result record {result}"
    return str(record.get("status", OK)), str(record.get("message") or "")


def write_placeholders(result: Path, files: list[Path]) -> None:
    """Empty the capture files of a failed run (a partial export must never be read)."""
    if (status := status_of(result)[0]) == OK:
        return
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    print(f"{result}: status {status}; capture files left empty")


def write_failed_stats(result: Path, outdir: Path, reports: list[str]) -> None:
    """Header-only CSVs and a metrics.json carrying the run's status and message."""
    from analysis.reports import HEADERS

    status, message = status_of(result)
    outdir.mkdir(parents=True, exist_ok=True)
    for report in reports:
        header = ",".join(f'"{h}"' if "," in h else h for h in HEADERS.get(report, []))
        (outdir / f"{report}.csv").write_text(header + "\n" if header else "")
    metrics = {"status": status, "message": message}
    (outdir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def first_line(message: str) -> str:
    line = next((s.strip() for s in message.splitlines() if s.strip()), "(no message)")
    return line if len(line) <= MESSAGE_CHARS else line[:MESSAGE_CHARS - 1] + "…"


def end_of_run(results: Path, fail_on: str) -> tuple[str, str | None]:
    """The console block naming each run of summary.csv that did not end ok (its status,
    message's first line and the job log with the rest: its capture's for `capture_*`, else
    its timing job's), "" if none; and the error to stop with under ``fail_on: error``."""
    summary = results / "summary.csv"
    text = summary.read_text() if summary.is_file() else ""
    rows = list(csv.DictReader(text.splitlines(keepends=True)))
    failed = [r for r in rows if (r.get("status") or OK) != OK]
    if not failed:
        return "", None
    consequence = ("fail_on: error: the workflow exits 1" if fail_on == "error" else
                   "kept as results; fail_on: error makes that an exit 1")
    width = max(len(r["run"]) for r in failed)
    lines = [f"profbench: {len(failed)} of {len(rows)} runs did not end ok (summary.csv; "
             f"{consequence}):"]
    for r in failed:
        job = "profile" if r["status"].startswith("capture_") else "time_run"
        lines += [f"  {r['run']:<{width}}  {r['status']}: {first_line(r.get('message') or '')}",
                  f"  {'':<{width}}  log: {results / 'logs' / job / (r['run'] + '.log')}"]
    stop = (f"{len(failed)} run(s) did not end ok ({', '.join(r['run'] for r in failed)}) and "
            "the config says fail_on: error; their results are kept")
    return "\n".join(lines), stop if fail_on == "error" else None


def main(argv: list[str]) -> int:
    command, result, *rest = argv if len(argv) >= 2 else ["usage", ""]
    if command == "ok" and not rest:
        return 0 if status_of(Path(result))[0] == OK else 1
    if command == "placeholders" and rest:
        write_placeholders(Path(result), [Path(f) for f in rest])
    elif command == "failed-stats" and len(rest) >= 2:
        write_failed_stats(Path(result), Path(rest[0]), rest[1:])
    else:
        sys.exit(f"usage: {__doc__.split(chr(10) * 2)[1].strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
