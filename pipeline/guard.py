"""Run one GPU job's command and always leave a result JSON: a failed run is a result row
(docs/reliability.md).

    python -m pipeline.guard --out RESULT.json [--timeout-s N] [--grace-s N] [--run NAME]
        [--expect FILE ...] [--repeats R] [--fork]
        [--gpu-locks DIR --host-gpus IDS [--gpus K] [--device-lock]] -- CMD ARGS...

CMD runs as a process group of its own (pipeline/process.py) or, with --fork, is forked by
the warm parent of its repeat index on its GPU (pipeline/warm.py: those named in
PROFBENCH_FORKSERVER, logging to PROFBENCH_FORKSERVER_LOGS; rules/common.smk sets both).
--repeats R runs CMD R times, one after another, {repeat} in --out and CMD becoming the
index; a repeat ending oom,
unsupported or timeout ends the run, the later ones are `skipped` records. --gpu-locks: the
job first takes K (1) whole GPUs (pipeline/gpus.py) and gives them to CMD as CUDA_VISIBLE_DEVICES.
Exit 0 once RESULT.json is written, 2 for usage errors, 128+N on signal N: the command's group
is stopped and no result is left, so Snakemake reruns the job.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pipeline import bytecode, gpus, process, verdict, warm
from pipeline.outcome import first_line
from workloads import devicelock
from workloads.jsonfile import read_whole, write_whole

SERVER_WAIT_S = 300.0  # at most, for a warm parent still preloading (within --timeout-s)
REPEAT = "{repeat}"
FINAL_STATUSES = ("oom", "unsupported", "timeout")  # the run fails the same way again
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """A signal to the guard (args: its number)."""


def say(message: str) -> None:
    print(f"guard: {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipeline.guard", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--timeout-s", type=float)
    p.add_argument("--grace-s", type=float, default=10.0)
    p.add_argument("--expect", nargs="+", type=Path, default=[], metavar="FILE")
    p.add_argument("--run")
    p.add_argument("--repeats", type=int, metavar="R")
    p.add_argument("--fork", action="store_true")
    p.add_argument("--gpu-locks", type=Path, metavar="DIR")
    p.add_argument("--host-gpus", metavar="IDS")
    p.add_argument("--gpus", type=int, default=1, metavar="K")
    p.add_argument("--device-lock", action="store_true")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    args.cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    for bad, why in [
        (not args.cmd, "no command given (put it after --)"),
        (args.repeats is not None and args.repeats < 1,
         f"--repeats must be at least 1, not {args.repeats}"),
        (args.repeats and REPEAT not in str(args.out),
         f"--repeats needs {REPEAT} in --out (each repeat writes its own)"),
        (args.repeats is None and any(REPEAT in a for a in [str(args.out), *args.cmd]),
         f"{REPEAT} is only replaced with --repeats")]:
        if bad:
            p.error(why)
    return args


def take_gpus(args: argparse.Namespace) -> gpus.Held | None:
    """The job's GPUs, in this process's environment: what it starts inherits them."""
    if args.gpu_locks is None:
        return None
    host = args.host_gpus.split(",")
    held = gpus.take(args.gpu_locks, host, args.gpus, owner=args.run or str(args.out))
    os.environ.update(held.env())
    if args.device_lock:
        os.environ[devicelock.ENV_DEVICE_LOCK] = str(held.device_lock())
    say(f"took GPU {held.indices} of {len(host)} {held.env() or '(the CPU slot)'} after "
        f"{held.waited_s:.2f} s")
    return held


def slot_of(args: argparse.Namespace, repeat: int, held: gpus.Held | None) -> int | None:
    """The warm parent of a repeat: one per repeat index and GPU; None without one."""
    if not args.fork or warm.ENV_NAME not in os.environ:
        return None
    return repeat + warm.SLOTS_PER_GPU * (held.indices[0] if held is not None else 0)


def start(args: argparse.Namespace, cmd: list[str], slot: int | None) -> process.Running:
    """The command forked by its warm parent when one can, else started as a process."""
    if slot is not None:
        wait = min(SERVER_WAIT_S, args.timeout_s or SERVER_WAIT_S)
        try:
            child, out, err = warm.spawn(dict(os.environ), slot, warm.workload_argv(cmd),
                                         time.monotonic() + wait)
            say(f"forked by fork server {slot} (pid {child.pid})")
            return process.Running(child, out, err)
        except warm.Unavailable as e:
            say(f"not forked ({e}); starting a process")
    return process.start(cmd)


def run_once(args: argparse.Namespace, out: Path, cmd: list[str], slot: int | None,
             current: list[process.Running]) -> dict[str, Any]:
    """Run the command and judge it; again (up to verdict.START_RETRIES times) after one of
    nsys's transients of a busy machine (verdict.transient)."""
    for attempt in range(verdict.START_RETRIES + 1):
        try:
            current[:] = [start(args, cmd, slot)]
        except OSError as e:  # not found, not executable: still a result
            return {"status": "error", "message": f"cannot run {cmd[0]}: {e.strerror or e}",
                    "returncode": None, "elapsed_s": 0.0}
        outcome = current[0].wait(args.timeout_s, args.grace_s, verdict.lost_agent_watch())
        current.clear()
        own = read_whole(out)
        result = verdict.judge(outcome, own, args.timeout_s)
        problem = (verdict.check_expected(args.expect, Path(cmd[0]).name)
                   if result["status"] == "ok" else None)
        missed = verdict.missed_capture(args.expect) if problem else None
        met = verdict.transient(outcome, own, missed)
        if met is None or attempt == verdict.START_RETRIES:
            break
        say(f"{met}; starting the command again")
        clear_attempt(out, args.expect, attempt)
    if problem:
        result.update(status="error", message=problem)
    if attempt:
        result["starts"] = attempt + 1
    return result


def clear_attempt(out: Path, expect: list[Path], attempt: int) -> None:
    """Remove what a failed attempt left (its record, the captures some ranks made: the next
    attempt's must not be mixed with them), then pause to let the busy moment pass."""
    for path in [out, *expect]:
        path.unlink(missing_ok=True)
    time.sleep(verdict.START_RETRY_PAUSE_S * (attempt + 1))


def skipped(repeat: int, after: int, ended: dict[str, Any]) -> dict[str, Any]:
    return {"status": "skipped", "repeat": repeat,
            "skipped_after": {"repeat": after, "status": ended["status"]},
            "message": f"not run: repeat {after} ended {ended['status']} "
                       f"({first_line(str(ended.get('message') or ''))})"}


def interrupted(signum: int, _frame: object) -> None:
    for other in SIGNALS:
        signal.signal(other, signal.SIG_IGN)  # once: the stop that follows must finish
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for signum in SIGNALS:
        signal.signal(signum, interrupted)
    if note := bytecode.keep_bytecode(os.environ):  # before a warm parent starts in this env
        say(note)
    if warm.ENV_NAME not in os.environ:
        process.adopt_orphans()
    current: list[process.Running] = []
    out, repeats = args.out, args.repeats or 1
    try:  # the GPUs' locks are held until this process exits
        held = take_gpus(args)  # first: nothing of the job runs before it has its GPUs
        ended: tuple[int, dict[str, Any]] | None = None
        for repeat in range(repeats):
            out = Path(str(args.out).replace(REPEAT, str(repeat)))
            if ended is not None:
                result = skipped(repeat, *ended)
            else:
                if args.repeats:
                    say(f"repeat {repeat} of {repeats}")
                out.unlink(missing_ok=True)  # a stale result must not pass for this run's
                result = run_once(args, out, [a.replace(REPEAT, str(repeat)) for a in args.cmd],
                                  slot_of(args, repeat, held), current)
            if args.run:
                result.setdefault("run", args.run)
            if held is not None:
                result["assigned_gpus"] = held.record()
            write_whole(out, result)
            how = (result["message"] if ended is not None else
                   f"{result['status']} (exit {result['returncode']}, {result['elapsed_s']} s)")
            say(f"{args.run or args.cmd[0]}{f' r{repeat}' if args.repeats else ''}: {how}")
            if args.repeats and ended is None and result["status"] in FINAL_STATUSES:
                ended = (repeat, result)
    except Interrupted as stop:
        for running in current:
            running.stop(stop.args[0], args.grace_s)
        out.unlink(missing_ok=True)  # an interrupted run has no result
        say(f"interrupted by {signal.Signals(stop.args[0]).name}; the command's process group "
            "was stopped and no result was written")
        return 128 + stop.args[0]
    return 0


if __name__ == "__main__":
    sys.exit(main())
