"""One distributed run: N ranks under torchrun (docs/distributed.md), or an ``unsupported``
result (exit 4) when this machine has fewer than N GPUs (CPU: cores) for them. A rank > 0
that failed on its own (``RESULT.json.rank<r>``) gives the run its status when rank 0 only saw
the others stop. Standard library only: it starts before torch is imported.

    python -m pipeline.launch --ranks N --device {auto,cpu,cuda} --out RESULT.json -- CMD ...
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline import gpus
from workloads.contract import EXIT_CODES
from workloads.jsonfile import read_whole, write_whole

# NVLink SHARP / multicast off for NCCL, torch symmetric memory and NVSHMEM.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
# How a rank reports being stopped because another rank failed (workloads/__main__.py).
# (SIGTERM from torchrun, or its collective broken by the failed peer).
STOPPED = re.compile(r"terminated by signal|SIGTERM|SIGKILL|Connection closed by peer"
                     r"|Connection reset|Broken pipe|communicator was aborted", re.IGNORECASE)


def why_not_here(device: str, ranks: int) -> str | None:
    """Why `ranks` processes of a run asking for `device` cannot run on this machine, or None.
    CUDA would see NVML's GPUs, limited by CUDA_VISIBLE_DEVICES."""
    found = 0
    if device != "cpu":
        found, visible = len(gpus.nvml_gpus()), os.environ.get(gpus.ENV)
        if visible is not None:
            found = min(found, len(gpus.visible_entries(visible)))
    if device == "cuda" or found:
        return None if found >= ranks else (f"{ranks} ranks need {ranks} GPUs; this machine "
                                            f"has {found} visible")
    cores = len(os.sched_getaffinity(0))
    return None if cores >= ranks else (f"{ranks} gloo ranks need {ranks} CPU cores (one "
                                        f"each); this machine has {cores}")


def merge_rank_failures(out: Path) -> dict[str, Any] | None:
    """Rank 0's record, with the status of the first rank > 0 that failed on its own when rank
    0 did not succeed or only saw the others stop; the ranks' files are removed."""
    record, others = read_whole(out), {}
    for path in out.parent.glob(f"{out.name}.rank*"):
        suffix = path.name.removeprefix(f"{out.name}.rank")
        if suffix.isdigit() and (other := read_whole(path)) is not None:
            others[int(suffix)] = other
        path.unlink(missing_ok=True)
    if record is not None and not only_stopped(record):
        return record  # rank 0 succeeded, or failed on its own
    for rank, other in sorted(others.items()):
        if other.get("status") not in (None, "ok") and not only_stopped(other):
            merged = {**(record or other), "status": other["status"],
                      "message": f"rank {rank}: {other.get('message') or ''}"}
            write_whole(out, merged)
            return merged
    return record


def only_stopped(record: dict[str, Any]) -> bool:
    """A failed record that only says the rank was stopped (another rank failed first)."""
    return record.get("status") == "error" and bool(STOPPED.search(str(record.get("message"))))


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
    if why := why_not_here(args.device, args.ranks):
        write_whole(args.out, {"status": "unsupported", "message": why})
        print(f"launch: unsupported: {why}", file=sys.stderr)
        return EXIT_CODES["unsupported"]
    for path in args.out.parent.glob(f"{args.out.name}.rank*"):
        path.unlink()  # a previous attempt's
    # torchrun on one node, with a free rendezvous port of its own (--standalone)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                "--nproc-per-node", str(args.ranks), "--no-python", *cmd]
    code = subprocess.call(torchrun, env={**NCCL_ENV, **os.environ})
    merge_rank_failures(args.out)
    return code


if __name__ == "__main__":
    sys.exit(main())
