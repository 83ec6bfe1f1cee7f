"""The largest batch that fits: galloping, then bisecting, on real out-of-memory results, each
batch in its own process (a process that ran out of memory leaves nothing behind for the next).

    python -m workloads.maxbatch --bound 256 --out maxbatch.json -- gpt --size small --mode train

Everything after ``--`` is a ``python -m workloads`` command line without ``--batch``. The
search runs the workload at ``--start`` (default 1), then up in steps of 1, 2, 4, ... (from 1:
batch 1, 2, 4, 8, ...) while batches fit, until one ends ``oom`` or the bound is reached (down
in the same steps while they run out of memory), then bisects between the largest batch that
fit and the smallest that did not. So it ends with a batch that fits and, one up, a batch that
ran out of memory: both are rows of the result, as every batch tried is (status, message, peak
memory, step time). A start at the answer costs two processes. A batch that fails otherwise
(an error, unsupported) ends the search: that is no answer about memory.

The result JSON: ``status`` (``ok`` with a batch; ``oom`` when batch 1 did not fit; ``error``)
and ``message``, ``batch`` (the largest that fit; null without one), ``bound``, ``start``,
``limited_by`` (``oom`` or ``bound``), ``oom_batch`` (the smallest batch above it that ran out
of memory), ``peak_memory_bytes`` and ``median_ms`` at that batch, and ``tried``: one row per
batch in the order run. Exit status as ``python -m workloads``: 0 when a batch was found, 3
when batch 1 did not fit, 1 otherwise. A pipeline run with ``batch: max`` runs this search
(rule max_batch) and its processes read the batch from the result (``--batch_from``).
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

from workloads.contract import EXIT_CODES

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
    """Galloping from ``start`` (steps of 1, 2, 4, ...: from 1 that is doubling), up while
    batches fit and down while they run out of memory, then bisecting between the largest
    batch that fit and the smallest that did not; ``run(batch)`` gives each batch's row."""
    tried: list[dict[str, Any]] = []

    def attempt(batch: int) -> str:
        tried.append(run(batch))
        return tried[-1]["status"]

    # fits: the largest batch known to fit (0: none); fails: the smallest that ran out of
    # memory (None: none yet)
    fits, fails, batch, step = 0, None, min(start, bound), 1
    while True:  # galloping
        status = attempt(batch)
        if status not in (OK, OOM):
            return result(tried, bound, start, None, f"batch {batch}: {status}")
        if status == OK:
            fits = batch
            if fails is not None or batch >= bound:
                break
            batch = min(batch + step, bound)
        else:
            fails = batch
            if fits or batch == 1:
                break
            batch = max(batch - step, 1)
        step *= 2
    while fails is not None and fails - fits > 1:  # bisecting
        middle = (fits + fails) // 2
        status = attempt(middle)
        if status == OK:
            fits = middle
        elif status == OOM:
            fails = middle
        else:
            return result(tried, bound, start, None, f"batch {middle}: {status}")
    return result(tried, bound, start, fits or None, OOM if fails is not None else "bound")


def most_processes(bound: int) -> int:
    """At most how many processes a search up to ``bound`` runs (from any start): the
    galloping's and the bisection's, each at most the bound's bits, and the first."""
    return 2 * bound.bit_length() + 1


def result(tried: list[dict[str, Any]], bound: int, start: int, batch: int | None,
           limited_by: str) -> dict[str, Any]:
    """The search's record: the batch found, the first batch up that ran out of memory, every
    row; ``status`` ok with a batch, else why there is none (``oom``: batch 1 did not fit)."""
    at = next((r for r in tried if r["batch"] == batch and r["status"] == OK), {})
    above = [r["batch"] for r in tried if r["status"] == OOM and r["batch"] > (batch or 0)]
    if batch is not None:
        status, message = OK, ""
    elif limited_by == OOM:
        first = next((r for r in tried if r["batch"] == 1), {})
        status, message = OOM, f"batch 1 ran out of memory: {first.get('message') or ''}"
    else:
        last = tried[-1] if tried else {}
        status = "error"
        message = f"the search stopped at {limited_by}: {last.get('message') or ''}".rstrip(": ")
    return {
        "status": status,
        "message": message,
        "batch": batch,
        "bound": bound,
        "start": start,
        "limited_by": limited_by,
        "oom_batch": min(above) if above else None,
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
    p.add_argument("--start", type=int, default=1,
                   help="the first batch (default 1; near the answer, fewer processes)")
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
    return EXIT_CODES[found["status"]]


def found(path: Path) -> dict[str, Any]:
    """What a run with ``batch: max`` takes from its search's result (or from the guard's
    record when the search itself failed: a timeout, a crash): the batch (None without one),
    the search's status and message, the bound, the first batch up that ran out of memory."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        record = {"status": "error", "message": f"no readable search result {path}: {err}"}
    status = str(record.get("status") or "error")
    batch = record.get("batch") if status == OK else None
    message = "" if batch is not None else str(record.get("message") or "").strip()
    return {
        "batch": batch, "status": OK if batch is not None else status, "message": message,
        "bound": record.get("bound"), "start": record.get("start"),
        "limited_by": record.get("limited_by"), "oom_batch": record.get("oom_batch"),
        "processes": len(record.get("tried") or []), "search": str(path),
    }


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
