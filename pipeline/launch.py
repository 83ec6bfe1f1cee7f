"""One distributed run: N ranks under torchrun, or an ``unsupported`` result (exit 4) when
this machine has fewer than N GPUs (CPU: cores) for them.

    python -m pipeline.launch --ranks N --device {auto,cpu,cuda} --out RESULT.json -- CMD ...

Every rank runs CMD, on a GPU of the job's (``LOCAL_RANK``; the guard or Slurm set
CUDA_VISIBLE_DEVICES) or as a gloo process on the CPU. NCCL keeps NVLink multicast off unless
the host says otherwise (NCCL_ENV). A rank > 0 that failed on its own (its
``RESULT.json.rank<r>``) gives the run its status when rank 0 only saw the others stop.
Standard library only: it starts before torch is imported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline import gpus
from workloads.contract import EXIT_CODES

EXIT_UNSUPPORTED = EXIT_CODES["unsupported"]
# NVLink SHARP / multicast off for NCCL, torch symmetric memory and NVSHMEM.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
# How a rank reports being stopped because another rank failed (workloads/__main__.py).
# (SIGTERM from torchrun, or its collective broken by the failed peer).
STOPPED = re.compile(r"terminated by signal|SIGTERM|SIGKILL|Connection closed by peer"
                     r"|Connection reset|Broken pipe|communicator was aborted", re.IGNORECASE)


def visible_gpus() -> int:
    """GPUs CUDA would see: NVML's, limited by CUDA_VISIBLE_DEVICES."""
    listed, visible = len(gpus.nvml_gpus()), os.environ.get(gpus.ENV)
    return listed if visible is None else min(listed, len(gpus.visible_entries(visible)))


def ranks_in(cmd: list[str]) -> int | None:
    """The --ranks of a ``<python> -m pipeline.launch`` command (the GPUs its job takes), or
    None for any other command."""
    if cmd[1:3] != ["-m", "pipeline.launch"]:
        return None
    for i, arg in enumerate(cmd[3:], start=3):
        if arg == "--":
            break
        value = cmd[i + 1] if arg == "--ranks" and i + 1 < len(cmd) else (
            arg.removeprefix("--ranks=") if arg.startswith("--ranks=") else None)
        if value is not None:
            return int(value) if value.isdigit() else None  # launch itself rejects it
    return None


def placement(device: str, ranks: int) -> tuple[str, str | None]:
    """(device type, why it cannot run) for `ranks` processes of a run asking for `device`."""
    found = visible_gpus() if device in ("auto", "cuda") else 0
    if device == "cuda" or (device == "auto" and found > 0):
        if found < ranks:
            return "cuda", f"{ranks} ranks need {ranks} GPUs; this machine has {found} visible"
        return "cuda", None
    cores = len(os.sched_getaffinity(0))
    if cores < ranks:
        return "cpu", (f"{ranks} gloo ranks need {ranks} CPU cores (one each); this machine "
                       f"has {cores}")
    return "cpu", None


def torchrun_command(ranks: int, cmd: list[str]) -> list[str]:
    """torchrun on one node, a free rendezvous port of its own (--standalone)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(ranks), "--no-python", *cmd]


def launch_env() -> dict[str, str]:
    env = dict(os.environ)
    for name, value in NCCL_ENV.items():
        env.setdefault(name, value)
    return env


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def merge_rank_failures(out: Path) -> dict[str, Any] | None:
    """Rank 0's record, with the status of the first rank > 0 that failed on its own when rank
    0 did not succeed or only saw the others stop; the ranks' files are removed."""
    record, others = _read(out), {}
    for path in out.parent.glob(f"{out.name}.rank*"):
        suffix = path.name.removeprefix(f"{out.name}.rank")
        if suffix.isdigit() and (other := _read(path)) is not None:
            others[int(suffix)] = other
        path.unlink(missing_ok=True)
    if record is not None and not only_stopped(record):
        return record  # rank 0 succeeded, or failed on its own
    for rank, other in sorted(others.items()):
        if other.get("status") not in (None, "ok") and not only_stopped(other):
            merged = {**(record or other), "status": other["status"],
                      "message": f"rank {rank}: {other.get('message') or ''}"}
            out.write_text(json.dumps(merged, indent=2) + "\n")
            return merged
    return record


def only_stopped(record: dict[str, Any]) -> bool:
    """A failed record that only says the rank was stopped (another rank failed first)."""
    return record.get("status") == "error" and bool(STOPPED.search(str(record.get("message"))))


def unsupported(out: Path, why: str) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"status": "unsupported", "message": why}, indent=2) + "\n")
    print(f"launch: unsupported: {why}", file=sys.stderr)
    return EXIT_UNSUPPORTED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.launch", description=__doc__)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--out", type=Path, required=True, help="rank 0's result JSON")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS... (every rank)")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd or args.ranks < 1:
        parser.error("need --ranks >= 1 and a command after --")
    _, why = placement(args.device, args.ranks)
    if why:
        return unsupported(args.out, why)
    for path in args.out.parent.glob(f"{args.out.name}.rank*"):
        path.unlink()  # a previous attempt's
    code = subprocess.call(torchrun_command(args.ranks, cmd), env=launch_env())
    merge_rank_failures(args.out)
    return code


if __name__ == "__main__":
    sys.exit(main())
