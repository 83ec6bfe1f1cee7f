"""Run one GPU job's command and always leave a result JSON: a failed run is a result row.

    python -m pipeline.guard --out RESULT.json [--timeout-s N] [--grace-s N] [--run NAME]
        [--expect FILE ...] [--repeats R] [--fork-slot N [--fork-server NAME] [--fork-logs DIR]]
        [--gpu-locks DIR --host-gpus IDS [--gpus K] [--device-lock]] -- CMD ARGS...

CMD runs as a process group of its own (pipeline/process.py) or, with --fork-slot, is forked
by that slot's warm parent (pipeline/warm.py; --fork-server defaults to PROFBENCH_FORKSERVER,
set by rules/common.smk); either way it is stopped, timed and judged alike
(pipeline/verdict.py, pipeline/capture.py). --repeats R runs it R times, one after another,
{repeat} in --out, --fork-slot and CMD becoming the index; a repeat ending oom, unsupported
or timeout ends the run, the later ones are `skipped` records. --gpu-locks: the job first
takes K whole GPUs (pipeline/gpus.py) and gives them to CMD as CUDA_VISIBLE_DEVICES.
Exit 0 once RESULT.json is written (atomically), 2 for usage errors, 128+N on signal N: the
command's group is stopped and no result is left, so Snakemake reruns the job.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pipeline import bytecode, capture, gpus, launch, process, verdict, warm
from workloads import devicelock
from workloads.jsonfile import write_whole

DEFAULT_GRACE_S = 10.0
SERVER_WAIT_S = 300.0  # at most, for a warm parent still preloading (within --timeout-s)
REPEAT = "{repeat}"
FINAL_STATUSES = ("oom", "unsupported", "timeout")  # the run fails the same way again
SKIPPED = "skipped"


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipeline.guard", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--timeout-s", type=float)
    p.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S)
    p.add_argument("--expect", nargs="+", type=Path, default=[], metavar="FILE")
    p.add_argument("--run")
    p.add_argument("--repeats", type=int, metavar="R")
    p.add_argument("--fork-server", metavar="NAME", default=os.environ.get(warm.ENV_NAME))
    p.add_argument("--fork-slot", metavar="N")
    p.add_argument("--fork-logs", type=Path, metavar="DIR", default=os.environ.get(warm.ENV_LOGS))
    p.add_argument("--gpu-locks", type=Path, metavar="DIR")
    p.add_argument("--host-gpus", metavar="IDS")
    p.add_argument("--gpus", type=int, metavar="K")
    p.add_argument("--device-lock", action="store_true")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    args.cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not args.cmd:
        p.error("no command given (put it after --)")
    if args.timeout_s is not None and args.timeout_s <= 0:
        p.error(f"--timeout-s must be positive, not {args.timeout_s:g}")
    if (args.gpu_locks is None) != (not args.host_gpus):
        p.error("--gpu-locks and --host-gpus go together")
    if args.gpus is not None and args.gpus < 1:
        p.error(f"--gpus must be at least 1, not {args.gpus}")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be at least 1, not {args.repeats}")
    if args.repeats is not None and REPEAT not in str(args.out):
        p.error(f"--repeats needs {REPEAT} in --out (each repeat writes its own)")
    if args.repeats is None and any(REPEAT in a for a in [str(args.out), args.fork_slot or "",
                                                          *args.cmd]):
        p.error(f"{REPEAT} is only replaced with --repeats")
    if args.fork_slot is not None and not args.fork_slot.replace(REPEAT, "0").isdigit():
        p.error(f"--fork-slot must be a number (or {REPEAT}), not {args.fork_slot!r}")
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
    print(f"guard: took {what} after {held.waited_s:.2f} s", file=sys.stderr, flush=True)
    return held


def slot_of(args: argparse.Namespace, repeat: int, held: gpus.Held | None) -> int | None:
    """The warm parent of a repeat: its slot on the job's GPU; None without one."""
    if args.fork_server is None or args.fork_slot is None:
        return None
    slot = int(args.fork_slot.replace(REPEAT, str(repeat)))
    return held.fork_slot(slot) if held is not None else slot


def start(args: argparse.Namespace, cmd: list[str], slot: int | None) -> process.Running:
    """The command forked by its warm parent when one can, else started as a process."""
    if slot is not None:
        try:
            child, out, err = parents(args).spawn(slot, warm.workload_argv(cmd),
                                                  dict(os.environ), server_deadline(args))
            print(f"guard: forked by fork server {slot} (pid {child.pid})", file=sys.stderr,
                  flush=True)
            return process.Running(child, out, err)
        except warm.Unavailable as e:
            print(f"guard: not forked ({e}); starting a process", file=sys.stderr, flush=True)
    return process.start(cmd)


def parents(args: argparse.Namespace) -> warm.Parents:
    return warm.Parents(args.fork_server, args.fork_logs, os.environ.get(warm.ENV_PRELOAD))


def server_deadline(args: argparse.Namespace) -> float:
    return time.monotonic() + min(SERVER_WAIT_S, args.timeout_s or SERVER_WAIT_S)


def read_record(path: Path) -> dict[str, Any] | None:
    """The command's own record, if it wrote a complete JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_once(args: argparse.Namespace, out: Path, cmd: list[str], slot: int | None,
             current: list[process.Running]) -> dict[str, Any]:
    """Run the command (again after nsys lost its agent at start) and judge it."""
    for attempt in range(capture.START_RETRIES + 1):
        try:
            current[:] = [start(args, cmd, slot)]
        except OSError as e:  # not found, not executable: still a result
            return {"status": "error", "message": f"cannot run {cmd[0]}: {e.strerror or e}",
                    "returncode": None, "elapsed_s": 0.0}
        outcome = current[0].wait(args.timeout_s, args.grace_s, capture.lost_agent_watch())
        current.clear()
        own = read_record(out)
        if attempt == capture.START_RETRIES or not capture.failed_to_start(outcome, own):
            break
        print("guard: nsys lost its agent while starting (a known transient of nsys); "
              "starting the command again", file=sys.stderr, flush=True)
        out.unlink(missing_ok=True)  # a stopped rank's record is not the next attempt's
        time.sleep(capture.START_RETRY_PAUSE_S * (attempt + 1))
    result = verdict.judge(outcome, own, args.timeout_s)
    if result["status"] == "ok":
        problem = capture.check_expected(args.expect, Path(cmd[0]).name)
        if problem:
            result.update(status="error", message=problem)
    return result


def skipped(repeat: int, after: int, ended: dict[str, Any]) -> dict[str, Any]:
    why = str(ended.get("message") or "").strip().splitlines()
    return {"status": SKIPPED, "repeat": repeat,
            "skipped_after": {"repeat": after, "status": ended["status"]},
            "message": f"not run: repeat {after} ended {ended['status']}"
                       + (f" ({why[0]})" if why else "")}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)

    def interrupted(signum: int, _frame: object) -> None:
        for signum_ in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum_, signal.SIG_IGN)  # once: the stop below must finish
        raise Interrupted(signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)
    note = bytecode.keep_bytecode(os.environ)  # before a warm parent starts in this env
    if note:
        print(f"guard: {note}", file=sys.stderr, flush=True)
    if args.fork_server is None:
        process.adopt_orphans()
    current: list[process.Running] = []
    held, out, repeats = None, args.out, args.repeats or 1
    try:
        held = take_gpus(args)  # first: nothing of the job runs before it has its GPUs
        if args.repeats and slot_of(args, 0, held) is not None:
            begun = time.monotonic()
            started = parents(args).start([slot_of(args, i, held) for i in range(repeats)],
                                          server_deadline(args))
            if started:
                print(f"guard: started fork servers {', '.join(map(str, started))} together "
                      f"({time.monotonic() - begun:.2f} s)", file=sys.stderr, flush=True)
        ended: tuple[int, dict[str, Any]] | None = None
        for repeat in range(repeats):
            put = str(repeat)
            out = Path(str(args.out).replace(REPEAT, put))
            if ended is not None:
                result = skipped(repeat, *ended)
            else:
                if args.repeats:
                    print(f"guard: repeat {repeat} of {repeats}", file=sys.stderr, flush=True)
                out.unlink(missing_ok=True)  # a stale result must not pass for this run's
                result = run_once(args, out, [a.replace(REPEAT, put) for a in args.cmd],
                                  slot_of(args, repeat, held), current)
            if args.run:
                result.setdefault("run", args.run)
            if held is not None:
                result["assigned_gpus"] = held.record()
            write_whole(out, result)
            how = (result["message"] if result["status"] == SKIPPED else
                   f"{result['status']} (exit {result['returncode']}, {result['elapsed_s']} s)")
            which = f" r{repeat}" if args.repeats else ""
            print(f"guard: {args.run or args.cmd[0]}{which}: {how}", file=sys.stderr, flush=True)
            if args.repeats and ended is None and result["status"] in FINAL_STATUSES:
                ended = (repeat, result)
    except Interrupted as stop:
        for running in current:
            running.stop(stop.signum, args.grace_s)
        out.unlink(missing_ok=True)  # an interrupted run has no result
        print(f"guard: interrupted by {stop}; the command's process group was stopped and "
              "no result was written", file=sys.stderr)
        return 128 + stop.signum
    finally:
        if held is not None:
            held.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
