"""Whole GPUs for the GPU jobs of one machine (docs/timing.md, "Whole GPUs per job"): the
host's GPUs (``CUDA_VISIBLE_DEVICES``' entries when set, so ``0,1,2,3`` is a 4-GPU host even
without one, else NVML's; without any, one slot, the CPU), and which job holds which: a
``flock`` per GPU, held until its guard exits (also when killed); taking is all or nothing,
under a lock on the folder.

    python -m pipeline.gpus count    # GPU jobs this host runs side by side (1 without a GPU)
"""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CPU = "cpu"  # the one slot of a host without a GPU
ENV = "CUDA_VISIBLE_DEVICES"
POLL_S = 0.05  # between tries while every fitting set of GPUs is held (a cap above the host's)


def visible_entries(value: str) -> list[str]:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value names, as CUDA reads it: up to the first
    empty or negative entry (``-1`` and ``""`` hide every GPU)."""
    entries = [entry.strip() for entry in value.split(",")]
    ends = [i for i, entry in enumerate(entries) if not entry or entry.startswith("-")]
    return entries[:ends[0] if ends else None]


def nvml_gpus() -> list[str]:
    """The UUIDs of this machine's GPUs, in NVML's order (`nvidia-smi -L`), or none."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return re.findall(r"^GPU \d+:.*\(UUID: (\S+?)\)", out, re.M)


def slots(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The GPUs the pipeline hands out, as CUDA_VISIBLE_DEVICES entries, or the CPU's one slot
    where there are none."""
    value = environ.get(ENV)
    return (visible_entries(value) if value is not None else nvml_gpus()) or [CPU]


def lock_folder(workdir: Path, hostname: str) -> Path:
    """The lock files of one host's GPUs, in Snakemake's folder of the working directory
    (which jobs in the image see as well; per host, for a folder several machines share)."""
    return workdir / ".snakemake" / "profbench" / f"gpus-{hostname}"


def _file_name(gpu: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", gpu)


@dataclass
class Held:
    """GPUs one job holds: entries, places among the host's GPUs, lock files' descriptors."""

    gpus: list[str]
    indices: list[int]
    folder: Path
    fds: list[int] = field(repr=False)
    waited_s: float = 0.0
    taken_unix: float = field(default_factory=time.time)  # held from then until released

    def env(self) -> dict[str, str]:
        """The command's CUDA_VISIBLE_DEVICES (for the CPU slot, the environment's stays)."""
        return {} if self.gpus == [CPU] else {ENV: ",".join(self.gpus)}

    def device_lock(self) -> Path:
        """The device lock of the job's first GPU (workloads/devicelock.py)."""
        return self.folder / f"{_file_name(self.gpus[0])}.device"

    def record(self, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
        """What the job's result says about its GPUs."""
        return {"gpus": list(self.gpus), "indices": list(self.indices),
                "cuda_visible_devices": environ.get(ENV), "waited_s": round(self.waited_s, 3),
                "taken_unix": round(self.taken_unix, 3)}


def _lock(path: Path, wait: bool) -> int | None:
    """A descriptor holding `path`'s flock, or None if another holds it (and not `wait`)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def try_take(folder: Path, gpus: list[str], count: int, owner: str = "") -> Held | None:
    """The first `count` of `gpus` that no other job holds, or None (keeping nothing)."""
    folder.mkdir(parents=True, exist_ok=True)
    choosing = _lock(folder / ".choose", wait=True)  # one job picks at a time
    try:
        got = [(i, gpu, fd) for i, gpu in enumerate(gpus)
               if (fd := _lock(folder / f"{_file_name(gpu)}.lock", wait=False)) is not None]
    finally:
        os.close(choosing)  # type: ignore[arg-type]
    keep, free = (got[:count], got[count:]) if len(got) >= count else ([], got)
    for _, _, fd in free:
        os.close(fd)
    for _, _, fd in keep:  # who holds it, for a person looking (the lock is the flock)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {owner}\n".encode(), 0)
    return Held([g for _, g, _ in keep], [i for i, _, _ in keep], folder,
                [fd for _, _, fd in keep]) if keep else None


def take(folder: Path, gpus: list[str], count: int, owner: str = "") -> Held:
    """`count` GPUs of `gpus` (at most all of them), waiting until that many are free. With
    Snakemake's `gpu` at most the host's count they are free at once; a larger cap makes the
    jobs beyond it wait here, never share."""
    start = time.monotonic()
    while (held := try_take(folder, gpus, max(1, min(count, len(gpus))), owner)) is None:
        time.sleep(POLL_S)
    held.waited_s = time.monotonic() - start
    return held


if __name__ == "__main__":
    if sys.argv[1:] != ["count"]:
        sys.exit(f"usage: python -m pipeline.gpus count\n{__doc__}")
    print(len(slots()))
