"""Distributed GPT training: one process per rank, launched by ``torchrun`` (docs/distributed.md).

* the process group comes from torchrun's environment (``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR/PORT``): NCCL on CUDA (rank r on ``cuda:LOCAL_RANK``), gloo
  on the CPU;
* ``--parallel ddp`` wraps the GPT in ``DistributedDataParallel`` (``bucket_cap_mb``);
  ``--parallel fsdp`` shards every block and then the root with FSDP2's ``fully_shard``
  (``reshard_after_forward``), before the optimizer is built;
* each explicit collective (DDP's bucket all-reduce in a comm hook, FSDP2's all-gather and
  reduce-scatter through its custom-comm hooks) is an NVTX start/end range
  ``comm <op> <bytes>B``, opened when the collective is issued and closed when its future
  completes: on gloo that is the communication itself (it runs on gloo's threads); on NCCL it
  is only the launch, and the ``nccl`` kernels are the communication;
* in a capture on the CPU (``PROFBENCH_OP_RANGES=1``, set by the distributed profile rule),
  one range per operator (``aten::mm, op_id = N``: the op capture's dispatch-mode ranges,
  workloads/op_ranges.py): the compute side of the CPU timeline (analysis/metrics/ranks.py);
* the record: rank 0 writes the run's JSON (the schema of every run, with
  ``tokens_per_s`` over all ranks) plus every rank's step times (gathered after the measured
  steps, so the straggler spread is known untraced too); ranks > 0 write ``<out>.rank<r>``,
  which the launcher (pipeline/launch.py) reads when a rank failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import nvtx
import torch
import torch.distributed as dist
from torch import nn

from workloads.op_ranges import op_ranges as op_range_context
from workloads.status import Unsupported

PARALLEL_MODES = ("none", "ddp", "fsdp")
# The options of a distributed run (left out of a one-process run's record and its hash).
ARGS = ("parallel", "gpus", "bucket_cap_mb", "reshard_after_forward")
# NVTX range name of one collective: op and message size (the analysis parses it back).
COMM_RANGE = "comm {op} {nbytes}B"
# Set by the profile rule of distributed runs: operator ranges on the CPU (the compute side).
OP_RANGES_ENV = "PROFBENCH_OP_RANGES"
# A rank that waits longer than this for the others fails instead of hanging the job.
COLLECTIVE_TIMEOUT = timedelta(minutes=10)


def is_distributed(args: argparse.Namespace) -> bool:
    return getattr(args, "parallel", "none") != "none"


def rank_env() -> tuple[int, int, int]:
    """(rank, local rank, world size) from torchrun's environment."""
    missing = [k for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if k not in os.environ]
    if missing:
        raise ValueError(
            f"--parallel needs torchrun's environment ({', '.join(missing)} unset): launch with "
            "`torchrun --standalone --nproc-per-node N -m workloads gpt ...`"
        )
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])


def rank_device(device: torch.device) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` on CUDA, the CPU otherwise."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", rank_env()[1])


def rank_out(out: Path | None) -> Path | None:
    """Where this rank writes its record: ``out`` on rank 0, ``<out>.rank<r>`` elsewhere."""
    rank = rank_env()[0]
    if out is None or rank == 0:
        return out
    return out.with_name(f"{out.name}.rank{rank}")


@dataclass
class CommLog:
    """Every collective this rank issued: (op, bytes) -> count, for the record."""

    counts: Counter = field(default_factory=Counter)
    measuring: bool = False

    def opened(self, op: str, nbytes: int) -> Any:
        if self.measuring:
            self.counts[(op, nbytes)] += 1
        return nvtx.start_range(COMM_RANGE.format(op=op, nbytes=nbytes))

    def record(self, steps: int) -> list[dict[str, Any]]:
        return [{"op": op, "bytes": nbytes, "per_step": count / steps}
                for (op, nbytes), count in sorted(self.counts.items())]


def _closing(range_id: Any) -> Callable[[torch.futures.Future], Any]:
    def close(fut: torch.futures.Future) -> Any:
        nvtx.end_range(range_id)
        return fut.value()

    return close


def ddp_allreduce_hook(log: CommLog) -> Callable[[Any, dist.GradBucket], torch.futures.Future]:
    """DDP's default all-reduce (average of the bucket), inside a ``comm all_reduce`` range."""

    # No annotations: DDP checks them against dist.GradBucket, and here they are strings.
    def hook(state, bucket):  # noqa: ANN001, ANN202
        tensor = bucket.buffer()
        range_id = log.opened("all_reduce", tensor.numel() * tensor.element_size())
        tensor.div_(dist.get_world_size())
        fut = dist.all_reduce(tensor, async_op=True).get_future()
        return fut.then(_closing(range_id)).then(lambda f: f.value()[0])

    return hook


def _fsdp_comms(log: CommLog) -> tuple[Any, Any] | None:
    """FSDP2's default all-gather and reduce-scatter, each call inside a comm range; None on a
    torch without FSDP2's custom-comm hooks."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
            DefaultAllGather,
            DefaultReduceScatter,
        )
    except ImportError:
        return None

    def traced(op: str, issue: Callable[..., Any], output: torch.Tensor,
               input_tensor: torch.Tensor, async_op: bool) -> Any:
        # bytes on the wire per rank: the gathered output / the scattered input
        full = output if op == "all_gather" else input_tensor
        range_id = log.opened(op, full.numel() * full.element_size())
        work = issue()
        try:
            future = work.get_future() if async_op and work is not None else None
        except RuntimeError:  # a Work without a future: the range covers the issue only
            future = None
        if future is not None:
            future.then(_closing(range_id))
        else:
            nvtx.end_range(range_id)
        return work

    class AllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):  # noqa: ANN001
            return traced("all_gather", lambda: super(AllGather, self).__call__(
                output_tensor, input_tensor, group, async_op), output_tensor, input_tensor,
                async_op)

    class ReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):  # noqa: ANN001
            return traced("reduce_scatter", lambda: super(ReduceScatter, self).__call__(
                output_tensor, input_tensor, group, op, async_op), output_tensor, input_tensor,
                async_op)

    return AllGather(), ReduceScatter()


@dataclass
class DistributedRun:
    """One rank of a distributed run: its process group, model wrapping and record."""

    args: argparse.Namespace
    device: torch.device
    rank: int
    local_rank: int
    world_size: int
    backend: str
    log: CommLog = field(default_factory=CommLog)
    fsdp_comm_ranges: bool = False

    def wrap(self, model: nn.Module) -> nn.Module:
        """The model as DDP or FSDP2 sees it (called before the optimizer is built)."""
        if self.args.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            # The rotary tables are constant buffers: no broadcast before each forward
            # (torch 2.13 deprecates the argument; 2.11 on the GPU hosts has no successor).
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                ddp = DDP(model, device_ids=ids, bucket_cap_mb=self.args.bucket_cap_mb,
                          broadcast_buffers=False)
            ddp.register_comm_hook(None, ddp_allreduce_hook(self.log))
            return ddp
        from torch.distributed.fsdp import fully_shard

        reshard = self.args.reshard_after_forward
        shards = [fully_shard(layer, reshard_after_forward=reshard) for layer in model.layers]
        root = fully_shard(model, reshard_after_forward=reshard)
        comms = _fsdp_comms(self.log)
        if comms is not None and hasattr(root, "set_custom_all_gather"):
            for module in (*shards, root):
                module.set_custom_all_gather(comms[0])
                module.set_custom_reduce_scatter(comms[1])
            self.fsdp_comm_ranges = True
        return root

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Around the warm-up and measured steps: operator ranges in a CPU capture."""
        op_ranges = self.device.type == "cpu" and os.environ.get(OP_RANGES_ENV) == "1"
        # the op capture's ranges (workloads/op_ranges.py: a dispatch mode on a CPU build)
        with op_range_context("on", self.device) if op_ranges else contextlib.nullcontext():
            yield

    def complete(self, result: dict[str, Any], tokens_per_rank: int) -> None:
        """Gather every rank's step times; throughput over all ranks (a collective: every
        rank calls it after its measured steps)."""
        steps = result["step_ms"]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, steps)
        tokens = tokens_per_rank * self.world_size
        mean_s = result["mean_ms"] / 1e3
        result.update(
            rank_step_ms=gathered,
            tokens_per_step=tokens,
            tokens_per_step_per_rank=tokens_per_rank,
            tokens_per_s=tokens / mean_s,
            collectives=self.log.record(len(steps)),
            distributed=self.describe(),
        )

    def describe(self) -> dict[str, Any]:
        return {"parallel": self.args.parallel, "world_size": self.world_size,
                "rank": self.rank, "backend": self.backend,
                "nccl": ".".join(map(str, torch.cuda.nccl.version()))
                if self.backend == "nccl" else None,
                "comm_ranges": self.args.parallel == "ddp" or self.fsdp_comm_ranges}

    def close(self) -> None:
        """Leave the process group once every rank is done with its collectives.

        A gloo rank that exits while its peer still reads the last collective's messages
        can break that collective on the peer ("Connection closed by peer"; CI once saw rank
        0 exit 1 without a record after rank 1 had finished). The barrier keeps every rank
        until all have completed `complete`'s gather; an error in the barrier or the teardown
        after that (a peer already gone) loses nothing, so it is a warning."""
        if not dist.is_initialized():
            return
        try:
            dist.barrier()
            dist.destroy_process_group()
        except RuntimeError as err:  # torch's DistError included
            print(f"warning: leaving the process group: {err}", file=sys.stderr)


def check_supported(args: argparse.Namespace) -> None:
    """Settings the distributed step does not take, as an ``unsupported`` result."""
    if args.mode != "train":
        raise Unsupported(f"--parallel {args.parallel} runs the train step only (mode train)")
    if args.compile == "reduce-overhead":
        raise Unsupported("--compile reduce-overhead (CUDA graphs) cannot capture DDP/FSDP "
                          "collectives; use compile default or off")
    if args.optimizer == "adamw_master":
        raise Unsupported("optimizer adamw_master rewrites the parameters DDP/FSDP hold; use "
                          "adamw_foreach or adamw_fused")


def start(args: argparse.Namespace, device: torch.device) -> DistributedRun:
    """Join the process group of this torchrun job (the workload's first collective)."""
    check_supported(args)
    rank, local_rank, world = rank_env()
    if world != args.gpus:
        raise ValueError(f"--gpus {args.gpus} but torchrun started {world} processes")
    if device.type == "cuda":
        if torch.cuda.device_count() <= local_rank:
            raise Unsupported(f"{world} ranks need {world} GPUs; "
                              f"{torch.cuda.device_count()} visible")
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"timeout": COLLECTIVE_TIMEOUT}
    if backend == "nccl":
        kwargs["device_id"] = device
    dist.init_process_group(backend, **kwargs)
    return DistributedRun(args, device, rank, local_rank, world, backend)
