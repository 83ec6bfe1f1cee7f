"""All-reduce bandwidth of this machine: the yardstick for a distributed run's collectives.

    torchrun --standalone --nproc-per-node N -m workloads.commbench --out allreduce.json
    (the pipeline: python -m pipeline.launch --ranks N --out X -- python -m workloads.commbench)

For each message size (1 KiB to 1 GiB on GPUs, doubling, as nccl-tests' ``-b 1K -e 1G -f 2``;
1 KiB to 16 MiB, x4, with gloo on a CPU) the ranks all-reduce (sum) a float32 tensor of that
many bytes, ``warmup`` times unmeasured and ``repeats`` times measured; each repeat is timed on
every rank (CUDA events on a GPU) and its time is the slowest rank's, as nccl-tests reports
the maximum over ranks. Per size: the median time and, with nccl-tests' definitions
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):

* algorithm bandwidth ``algbw = bytes / time``;
* bus bandwidth ``busbw = algbw * 2 (n - 1) / n`` for all-reduce (each rank sends and
  receives 2 (n-1)/n of the data in a ring), comparable with the link's peak whatever n.

Rank 0 writes the JSON: ``sizes[]`` with ``bytes``, ``time_us``, ``algbw_gbps``,
``busbw_gbps``, and ``peak_busbw_gbps`` (the largest busbw of the sweep).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workloads.provenance import provenance

# (smallest, largest, factor) bytes and (warm-up, measured) repeats per backend
SWEEP = {"nccl": (1 << 10, 1 << 30, 2), "gloo": (1 << 10, 16 << 20, 4)}
REPEATS = {"nccl": (5, 20), "gloo": (2, 5)}


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor of a collective on `ranks` ranks."""
    if ranks < 2:
        return 0.0
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    return 1.0


def sizes(backend: str, max_bytes: int | None = None) -> list[int]:
    low, high, factor = SWEEP[backend]
    high = min(high, max_bytes) if max_bytes else high
    out, size = [], low
    while size <= high:
        out.append(size)
        size *= factor
    return out


def time_allreduce(tensor: torch.Tensor, warmup: int, repeats: int) -> list[float]:
    """Seconds of each measured all-reduce, the slowest rank's."""
    cuda = tensor.is_cuda
    for _ in range(warmup):
        dist.all_reduce(tensor)
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        dist.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(tensor)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            dist.all_reduce(tensor)
            seconds = time.perf_counter() - t0
        slowest = torch.tensor([seconds], dtype=torch.float64, device=tensor.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times.append(float(slowest))
    return times


def sweep(device: torch.device, backend: str, max_bytes: int | None) -> list[dict[str, Any]]:
    warmup, repeats = REPEATS[backend]
    n = dist.get_world_size()
    rows = []
    for nbytes in sizes(backend, max_bytes):
        tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        seconds = statistics.median(time_allreduce(tensor, warmup, repeats))
        algbw = nbytes / seconds / 1e9
        rows.append({"bytes": nbytes, "time_us": seconds * 1e6, "algbw_gbps": algbw,
                     "busbw_gbps": algbw * bus_factor("all_reduce", n), "repeats": repeats})
        del tensor
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.commbench", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--max-bytes", type=int, default=None, help="cap the sweep's largest")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    kwargs: dict[str, Any] = {"timeout": timedelta(minutes=10)}
    if cuda:
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group(backend, **kwargs)
    try:
        rows = sweep(device, backend, args.max_bytes)
    finally:
        rank, world = dist.get_rank(), dist.get_world_size()
        dist.destroy_process_group()
    if rank == 0:
        result = {
            "op": "all_reduce", "ranks": world, "backend": backend, "device": device.type,
            "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "bus_factor": bus_factor("all_reduce", world), "sizes": rows,
            "peak_busbw_gbps": max(r["busbw_gbps"] for r in rows),
            "provenance": provenance(),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"all_reduce on {world} ranks ({backend}): peak bus bandwidth "
              f"{result['peak_busbw_gbps']:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
