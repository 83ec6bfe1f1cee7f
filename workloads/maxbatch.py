"""The largest batch that fits: doubling, then bisecting, on real out-of-memory results, each
batch in its own process (a process that ran out of memory leaves nothing behind for the next).

    python -m workloads.maxbatch --bound 256 --out maxbatch.json -- gpt --size small --mode train

Everything after ``--`` is a ``python -m workloads`` command line without ``--batch``. The
search runs the workload at batch 1, 2, 4, ... until a batch ends ``oom`` (or the bound is
reached), then bisects between the largest batch that fit and the smallest that did not, so
it ends with a batch that fits and, one up, a batch that ran out of memory: both are rows of
the result, as every batch tried is (status, message, peak memory, step time). A batch that
fails otherwise (an error, unsupported) ends the search: that is no answer about memory.

The result JSON: ``batch`` (the largest that fit; null when batch 1 did not), ``bound``,
``limited_by`` (``oom`` or ``bound``), ``peak_memory_bytes`` and ``median_ms`` at that batch,
and ``tried``: one row per batch in the order run. Exit status 0 when a batch was found.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

OK, OOM = "ok", "oom"
ROW_KEYS = ("status", "message", "peak_memory_bytes", "peak_reserved_bytes", "median_ms")


def probe(command: list[str], batch: int, timeout_s: float) -> dict[str, Any]:
    """One process of the workload at ``batch``: its record's status, peak and step time."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        cmd = [
            sys.executable,
            "-m",
            "workloads",
            *command,
            "--batch",
            str(batch),
            "--out",
            str(out),
        ]
        try:
            subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return {"batch": batch, "status": "timeout", "message": f"over {timeout_s:.0f} s"}
        if not out.is_file():
            return {"batch": batch, "status": "error", "message": "the process wrote no record"}
        record = json.loads(out.read_text())
    row = {"batch": batch, **{k: record.get(k) for k in ROW_KEYS}}
    row["message"] = (row["message"] or "").splitlines()[0] if row["message"] else ""
    return row


def search(run: Callable[[int], dict[str, Any]], bound: int, start: int = 1) -> dict[str, Any]:
    """Doubling from ``start``, then bisecting, with ``run(batch)`` giving each batch's row."""
    tried: list[dict[str, Any]] = []

    def attempt(batch: int) -> str:
        tried.append(run(batch))
        return tried[-1]["status"]

    fits, fails, batch = None, None, min(start, bound)
    while True:  # doubling
        status = attempt(batch)
        if status == OK:
            fits = batch
            if batch >= bound:
                break
            batch = min(batch * 2, bound)
        elif status == OOM:
            fails = batch
            break
        else:
            return result(tried, bound, None, f"batch {batch}: {status}")
    while fails is not None and fits is not None and fails - fits > 1:  # bisecting
        middle = (fits + fails) // 2
        status = attempt(middle)
        if status == OK:
            fits = middle
        elif status == OOM:
            fails = middle
        else:
            return result(tried, bound, None, f"batch {middle}: {status}")
    return result(tried, bound, fits, OOM if fails is not None else "bound")


def result(
    tried: list[dict[str, Any]], bound: int, batch: int | None, limited_by: str
) -> dict[str, Any]:
    at = next((r for r in tried if r["batch"] == batch and r["status"] == OK), {})
    return {
        "batch": batch,
        "bound": bound,
        "limited_by": limited_by,
        "peak_memory_bytes": at.get("peak_memory_bytes"),
        "median_ms": at.get("median_ms"),
        "tried": tried,
    }


def said(row: dict[str, Any]) -> dict[str, Any]:
    """Print a batch's row as soon as it is known (a search can take many minutes)."""
    peak = row.get("peak_memory_bytes")
    print(
        f"batch {row['batch']}: {row['status']}"
        + (f", peak {peak / 2**30:.2f} GiB" if peak else "")
        + (f", {row['median_ms']:.2f} ms" if row.get("median_ms") else ""),
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print(
            "usage: python -m workloads.maxbatch [--bound N] [--out F] -- WORKLOAD ARGS...",
            file=sys.stderr,
        )
        return 2
    cut = argv.index("--")
    p = argparse.ArgumentParser(
        prog="python -m workloads.maxbatch", description=__doc__.split("\n")[0]
    )
    p.add_argument("--bound", type=int, required=True, help="the largest batch to try")
    p.add_argument("--start", type=int, default=1, help="the first batch (default 1)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per batch")
    p.add_argument("--out", type=Path, default=None, help="the result JSON")
    args = p.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if any(a in ("--batch", "--out") for a in command):
        p.error("the workload's command line takes no --batch or --out (the search sets them)")
    if args.bound < 1 or args.start < 1:
        p.error("--bound and --start must be >= 1")
    found = search(lambda b: said(probe(command, b, args.timeout_s)), args.bound, args.start)
    found["command"] = shlex.join(command)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(found, indent=2) + "\n")
    print(f"largest batch that fits: {found['batch']} (limited by {found['limited_by']})")
    return 0 if found["batch"] is not None else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
