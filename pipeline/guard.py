"""Run one GPU job's command and always leave a result JSON: a failed run is a result row
(docs/reliability.md).

    python -m pipeline.guard --out RESULT.json [--timeout-s N] [--grace-s N] [--run NAME]
        [--expect FILE ...] [--repeats R] [--fork-slot N]
        [--gpu-locks DIR --host-gpus IDS [--gpus K] [--device-lock]] -- CMD ARGS...

CMD runs as a process group of its own (pipeline/process.py) or, with --fork-slot, is forked
by that slot's warm parent (pipeline/warm.py: those named in PROFBENCH_FORKSERVER, logging to
PROFBENCH_FORKSERVER_LOGS; rules/common.smk sets both). --repeats R runs CMD R times, one after
another, {repeat} in --out, --fork-slot and CMD becoming the index; a repeat ending oom,
unsupported or timeout ends the run, the later ones are `skipped` records. --gpu-locks: the
job first takes K whole GPUs (pipeline/gpus.py) and gives them to CMD as CUDA_VISIBLE_DEVICES.
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

from pipeline import bytecode, gpus, launch, process, verdict, warm
from workloads import devicelock
from workloads.jsonfile import write_whole

SERVER_WAIT_S = 300.0  # at most, for a warm parent still preloading (within --timeout-s)
REPEAT = "{repeat}"
FINAL_STATUSES = ("oom", "unsupported", "timeout")  # the run fails the same way again
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


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
    p.add_argument("--fork-slot", metavar="N")
    p.add_argument("--gpu-locks", type=Path, metavar="DIR")
    p.add_argument("--host-gpus", metavar="IDS")
    p.add_argument("--gpus", type=int, metavar="K")
    p.add_argument("--device-lock", action="store_true")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    args.cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    for bad, why in [
        (not args.cmd, "no command given (put it after --)"),
        ((args.gpu_locks is None) != (not args.host_gpus),
         "--gpu-locks and --host-gpus go together"),
        (args.repeats is not None and args.repeats < 1,
         f"--repeats must be at least 1, not {args.repeats}"),
        (args.repeats and REPEAT not in str(args.out),
         f"--repeats needs {REPEAT} in --out (each repeat writes its own)"),
        (args.repeats is None and any(REPEAT in a for a in [str(args.out), args.fork_slot or "",
                                                            *args.cmd]),
         f"{REPEAT} is only replaced with --repeats"),
        (not (args.fork_slot or "0").replace(REPEAT, "0").isdigit(),
         f"--fork-slot must be a number (or {REPEAT}), not {args.fork_slot!r}")]:
        if bad:
            p.error(why)
    return args


def take_gpus(args: argparse.Namespace) -> gpus.Held | None:
    """The job's GPUs, in this process's environment: what it starts inherits them."""
    if args.gpu_locks is None:
        return None
    host = args.host_gpus.split(",")
    held = gpus.take(args.gpu_locks, host, args.gpus or launch.ranks_in(args.cmd) or 1,
                     owner=args.run or str(args.out))
    os.environ.update(held.env())
    if args.device_lock:
        os.environ[devicelock.ENV_DEVICE_LOCK] = str(held.device_lock())
    what = ("the CPU's slot (no GPU)" if held.gpus == [gpus.CPU] else
            f"GPU {', '.join(map(str, held.indices))} of {len(host)}, "
            f"CUDA_VISIBLE_DEVICES={held.env()[gpus.ENV]}")
    say(f"took {what} after {held.waited_s:.2f} s")
    return held


def slot_of(args: argparse.Namespace, repeat: int, held: gpus.Held | None) -> int | None:
    """The warm parent of a repeat: its slot on the job's GPU; None without one."""
    if warm.ENV_NAME not in os.environ or args.fork_slot is None:
        return None
    slot = int(args.fork_slot.replace(REPEAT, str(repeat)))
    return held.fork_slot(slot) if held is not None else slot


def start(args: argparse.Namespace, cmd: list[str], slot: int | None) -> process.Running:
    """The command forked by its warm parent when one can, else started as a process."""
    if slot is not None:
        logs, env = os.environ.get(warm.ENV_LOGS), dict(os.environ)
        parents = warm.Parents(env[warm.ENV_NAME], logs and Path(logs), env.get(warm.ENV_PRELOAD))
        wait = min(SERVER_WAIT_S, args.timeout_s or SERVER_WAIT_S)
        try:
            child, out, err = parents.spawn(slot, warm.workload_argv(cmd), env,
                                            time.monotonic() + wait)
            say(f"forked by fork server {slot} (pid {child.pid})")
            return process.Running(child, out, err)
        except warm.Unavailable as e:
            say(f"not forked ({e}); starting a process")
    return process.start(cmd)


def run_once(args: argparse.Namespace, out: Path, cmd: list[str], slot: int | None,
             current: list[process.Running]) -> dict[str, Any]:
    """Run the command (again after nsys lost its agent at start) and judge it."""
    for attempt in range(verdict.START_RETRIES + 1):
        try:
            current[:] = [start(args, cmd, slot)]
        except OSError as e:  # not found, not executable: still a result
            return {"status": "error", "message": f"cannot run {cmd[0]}: {e.strerror or e}",
                    "returncode": None, "elapsed_s": 0.0}
        outcome = current[0].wait(args.timeout_s, args.grace_s, verdict.lost_agent_watch())
        current.clear()
        own = launch.read_record(out)
        if attempt == verdict.START_RETRIES or not verdict.failed_to_start(outcome, own):
            break
        say("nsys lost its agent while starting (a known transient of nsys); starting the "
            "command again")
        out.unlink(missing_ok=True)  # a stopped rank's record is not the next attempt's
        time.sleep(verdict.START_RETRY_PAUSE_S * (attempt + 1))
    result = verdict.judge(outcome, own, args.timeout_s)
    if result["status"] == "ok" and (
            problem := verdict.check_expected(args.expect, Path(cmd[0]).name)):
        result.update(status="error", message=problem)
    return result


def skipped(repeat: int, after: int, ended: dict[str, Any]) -> dict[str, Any]:
    why = str(ended.get("message") or "").strip().splitlines()
    return {"status": "skipped", "repeat": repeat,
            "skipped_after": {"repeat": after, "status": ended["status"]},
            "message": f"not run: repeat {after} ended {ended['status']}"
                       + (f" ({why[0]})" if why else "")}


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
    held, out, repeats = None, args.out, args.repeats or 1
    try:
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
            running.stop(stop.signum, args.grace_s)
        out.unlink(missing_ok=True)  # an interrupted run has no result
        say(f"interrupted by {stop}; the command's process group was stopped and no result "
            "was written")
        return 128 + stop.signum
    finally:
        if held is not None:
            held.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
