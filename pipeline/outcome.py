"""What the pipeline does with a run that did not succeed: its record stays, its capture and
statistics become labelled empty files, so every downstream job still has its inputs.

    python -m pipeline.outcome ok RESULT.json                      # exit 0 iff status ok
    python -m pipeline.outcome placeholders RESULT.json FILE ...   # empty FILEs unless ok
    python -m pipeline.outcome failed-stats RESULT.json OUTDIR REPORT ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OK = "ok"


def status_of(result: Path) -> tuple[str, str]:
    """(status, message) of a guarded job's result record; a missing record is an error."""
    try:
        record = json.loads(result.read_text())
    except (OSError, ValueError) as exc:
        return "error", f"no readable result record {result}: {exc}"
    return str(record.get("status", OK)), str(record.get("message") or "")


def write_placeholders(result: Path, files: list[Path]) -> bool:
    """Empty the capture files of a failed run (a partial export must never be read)."""
    status, _ = status_of(result)
    if status == OK:
        return False
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    return True


def write_failed_stats(result: Path, outdir: Path, reports: list[str]) -> None:
    """Header-less empty CSVs and a metrics.json carrying the run's status and message."""
    from analysis.reports import HEADERS

    status, message = status_of(result)
    outdir.mkdir(parents=True, exist_ok=True)
    for report in reports:
        header = ",".join(f'"{h}"' if "," in h else h for h in HEADERS.get(report, []))
        (outdir / f"{report}.csv").write_text(header + "\n" if header else "")
    metrics = {"status": status, "message": message}
    (outdir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.outcome", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    ok = sub.add_parser("ok", help="exit 0 when RESULT's status is ok, else 1")
    ok.add_argument("result", type=Path)
    ph = sub.add_parser("placeholders", help="empty FILEs unless RESULT's status is ok")
    ph.add_argument("result", type=Path)
    ph.add_argument("files", type=Path, nargs="+")
    fs = sub.add_parser("failed-stats", help="empty report CSVs + metrics.json with status")
    fs.add_argument("result", type=Path)
    fs.add_argument("outdir", type=Path)
    fs.add_argument("reports", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "ok":
        return 0 if status_of(args.result)[0] == OK else 1
    if args.command == "placeholders":
        if write_placeholders(args.result, args.files):
            print(f"{args.result}: status {status_of(args.result)[0]}; capture files left empty")
    else:
        write_failed_stats(args.result, args.outdir, args.reports)
    return 0


if __name__ == "__main__":
    sys.exit(main())
