"""Distributed GPT training: one process per rank, launched by ``torchrun`` (docs/distributed.md).

* the process group comes from torchrun's environment (``RANK``, ``LOCAL_RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR/PORT``): NCCL on CUDA (rank r on ``cuda:LOCAL_RANK``), gloo
  on the CPU;
* ``--parallel ddp`` wraps the GPT in ``DistributedDataParallel`` (``bucket_cap_mb``);
  ``--parallel fsdp`` shards every block and then the root with FSDP2's ``fully_shard``
  (``reshard_after_forward``), before the optimizer is built;
* DDP on NCCL reduces its buckets with its built-in C++ all-reduce: a Python comm hook, even
  PyTorch's own ``allreduce_hook``, made the 2.7B step 20-25% slower and twice as variable on
  H200s (benchmarks/distributed_bisect.py; the C++ hook's reason to exist, pytorch#46348).
  The record lists the buckets in the order DDP reduces them (``distributed.buckets``), which
  is the order of the ``nccl`` all-reduce kernels in each step of a capture: the analysis
  takes each kernel's message size from it;
* every other explicit collective (DDP's bucket all-reduce on gloo, in a comm hook; FSDP2's
  all-gather and reduce-scatter through its custom-comm hooks) is an NVTX start/end range
  ``comm <op> <bytes>B``, opened when the collective is issued and closed when its future
  completes: on gloo that is the communication itself (it runs on gloo's threads); on NCCL it
  is only the launch, and the ``nccl`` kernels are the communication;
* in a capture on the CPU (``PROFBENCH_OP_RANGES=1``, set by the distributed profile rule),
  one range per operator (``aten::mm, op_id = N``: the op capture's dispatch-mode ranges,
  workloads/op_ranges.py): the compute side of the CPU timeline (analysis/metrics/ranks.py);
* per measured step, each rank's *arrival*: the time from the step's start to where its
  collectives begin (CUDA events on a GPU, the host clock on a CPU), untraced: the rank that
  arrives last is the one the others wait for. FSDP: its first collective; DDP: the end of
  its forward (its all-reduces follow in backward, after the same work on every rank);
* ``--comm skip``: no communication, the same compute, the untraced bound the synchronized
  step is compared with: DDP skips gradient synchronization as ``no_sync()`` does; FSDP2's
  collectives are replaced by their local results;
* ``--straggle_ms`` (a test knob): rank ``--straggle_rank`` sleeps that long where it arrives
  (above) in every step, a straggler of known size;
* the record: rank 0 writes the run's JSON (the schema of every run, with
  ``tokens_per_s`` over all ranks) plus every rank's step times and arrivals (gathered after
  the measured steps, so stragglers are known untraced too); ranks > 0 write
  ``<out>.rank<r>``, which the launcher (pipeline/launch.py) reads when a rank failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
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
ARGS = ("parallel", "gpus", "bucket_cap_mb", "reshard_after_forward", "comm", "straggle_ms",
        "straggle_rank")
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


@dataclass(frozen=True)
class Knobs:
    """The run's communication and straggler settings (workloads/models/gpt.py), at their
    defaults for a workload whose options lack them."""

    comm: str = "on"
    straggle_ms: float = 0.0
    straggle_rank: int = 0

    @classmethod
    def of(cls, args: argparse.Namespace) -> Knobs:
        return cls(**{k: getattr(args, k) for k in cls.__dataclass_fields__ if hasattr(args, k)})


@dataclass
class Arrivals:
    """Per measured step, the time from the step's start to its first collective: when this
    rank reaches the collectives, the moment its peers start waiting for it (or it for them).
    CUDA events on the current stream on a GPU (where the device gets there: the host runs
    ahead), the host clock on a CPU."""

    cuda: bool = False
    start: Any = None
    pairs: list[tuple[Any, Any]] = field(default_factory=list)

    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def started(self) -> None:
        self.start = self._mark()

    def arrived(self) -> None:
        self.pairs.append((self.start, self._mark()))

    def ms(self) -> list[float]:
        """Each measured step's arrival (ms); read after the steps' synchronization."""
        if self.cuda:
            return [start.elapsed_time(end) for start, end in self.pairs]
        return [(end - start) * 1e3 for start, end in self.pairs]


@dataclass
class CommLog:
    """Every collective this rank issued through a comm range: (op, bytes) -> count, for the
    record, and the steps' arrivals. With ``skip`` (``--comm skip``) the collectives are not
    issued. With a ``delay_s`` (the straggler knob), the rank waits that long where it
    arrives in each step: at its first collective, or (``arrive_at_collective`` false: DDP)
    where :meth:`arrive` is called."""

    counts: Counter = field(default_factory=Counter)
    measuring: bool = False
    skip: bool = False
    arrivals: Arrivals = field(default_factory=Arrivals)
    delay_s: float = 0.0
    arrive_at_collective: bool = True
    pending: bool = False  # the step's arrival is still to come

    def step_started(self) -> None:
        self.pending = True
        if self.measuring:
            self.arrivals.started()

    def arrive(self) -> None:
        """The step reached its collectives: the straggler's delay, then the arrival mark
        (none without collectives)."""
        if self.pending and not self.skip:
            self.pending = False
            self._straggle()
            if self.measuring:
                self.arrivals.arrived()

    def opened(self, op: str, nbytes: int) -> Any:
        if self.arrive_at_collective:
            self.arrive()
        if self.measuring:
            self.counts[(op, nbytes)] += 1
        return nvtx.start_range(COMM_RANGE.format(op=op, nbytes=nbytes))

    def _straggle(self) -> None:
        """The straggler's delay, where its peers wait for it: before its collectives, after
        the same work as theirs (done side by side with theirs, so a busy machine slows both
        alike). On a GPU the host first waits for its queued work: the device then idles
        exactly ``delay_s`` before the collectives."""
        if self.delay_s > 0:
            if self.arrivals.cuda:
                torch.cuda.synchronize()
            time.sleep(self.delay_s)

    def record(self, steps: int) -> list[dict[str, Any]]:
        return [{"op": op, "bytes": nbytes, "per_step": count / steps}
                for (op, nbytes), count in sorted(self.counts.items())]


def _closing(range_id: Any) -> Callable[[torch.futures.Future], Any]:
    def close(fut: torch.futures.Future) -> Any:
        nvtx.end_range(range_id)
        return fut.value()

    return close


def ddp_allreduce_hook(log: CommLog) -> Callable[[Any, dist.GradBucket], torch.futures.Future]:
    """DDP's all-reduce on gloo (sum, then the average), inside a ``comm all_reduce`` range:
    on a CPU the ranges are the communication (analysis/metrics/ranks.py)."""

    def finished(range_id: Any) -> Callable[[torch.futures.Future], torch.Tensor]:
        def close(fut: torch.futures.Future) -> torch.Tensor:
            nvtx.end_range(range_id)
            return fut.value()[0].div_(dist.get_world_size())

        return close

    # No annotations: DDP checks them against dist.GradBucket, and here they are strings.
    def hook(state, bucket):  # noqa: ANN001, ANN202
        tensor = bucket.buffer()
        range_id = log.opened("all_reduce", tensor.numel() * tensor.element_size())
        return dist.all_reduce(tensor, async_op=True).get_future().then(finished(range_id))

    return hook


def ddp_buckets(ddp: nn.Module) -> list[int]:
    """Bytes of each DDP gradient bucket, in the order DDP all-reduces them (bucket index:
    DDP starts bucket i's all-reduce only after bucket i-1's). Read after the second step,
    when DDP has rebuilt its buckets in the order the gradients became ready."""
    return [b.buffer().numel() * b.buffer().element_size()
            for b in sorted(ddp.reducer._get_zeros_like_grad_buckets(), key=lambda b: b.index())]


def local_all_gather(output: torch.Tensor, input_tensor: torch.Tensor,
                     group: dist.ProcessGroup) -> None:
    """An all-gather without communication: this rank's shard copied into every other rank's
    slot, the bytes the all-gather writes (the step then computes on copies of one shard: the
    same shapes and work, other values)."""
    slots = output.view(group.size(), -1)
    for r in range(group.size()):
        if r != group.rank():  # FSDP2 copies the shard into its own slot before the call
            slots[r].copy_(input_tensor)


def local_reduce_scatter(output: torch.Tensor, input_tensor: torch.Tensor,
                         group: dist.ProcessGroup, op: Any) -> None:
    """A reduce-scatter without communication: this rank's chunk of its own gradients, the
    result when every rank's gradients are equal (the same batch on every rank): the chunk for
    an average, ``world`` times it for a sum."""
    output.copy_(input_tensor.view(group.size(), -1)[group.rank()])
    if op != dist.ReduceOp.AVG:
        output.mul_(group.size())


def fsdp_comm_hooks() -> bool:
    """Whether this torch has FSDP2's custom-comm hooks (what ``comm: skip`` replaces)."""
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import (  # noqa: F401
            DefaultAllGather,
            DefaultReduceScatter,
        )
    except ImportError:
        return False
    return hasattr(FSDPModule, "set_custom_all_gather")


def _fsdp_comms(log: CommLog) -> tuple[Any, Any] | None:
    """FSDP2's default all-gather and reduce-scatter, each call inside a comm range (with
    ``log.skip``, their local results); None on a torch without FSDP2's custom-comm hooks."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
            DefaultAllGather,
            DefaultReduceScatter,
        )
    except ImportError:
        return None

    def traced(op: str, issue: Callable[..., Any], local: Callable[[], None],
               output: torch.Tensor, input_tensor: torch.Tensor, async_op: bool) -> Any:
        if log.skip:
            local()
            return None  # nothing to wait for: FSDP2 then waits on its stream's event only
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
                output_tensor, input_tensor, group, async_op),
                lambda: local_all_gather(output_tensor, input_tensor, group),
                output_tensor, input_tensor, async_op)

    class ReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):  # noqa: ANN001
            return traced("reduce_scatter", lambda: super(ReduceScatter, self).__call__(
                output_tensor, input_tensor, group, op, async_op),
                lambda: local_reduce_scatter(output_tensor, input_tensor, group, op),
                output_tensor, input_tensor, async_op)

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
    ddp: nn.Module | None = None  # the DDP module (its buckets go in the record)

    def wrap(self, model: nn.Module, layers: str = "layers.*",
             broadcast_buffers: bool = False) -> nn.Module:
        """The model as DDP or FSDP2 sees it (called before the optimizer is built).

        ``layers``: ``|``-separated globs of the module paths that are layers (the workload's
        structure, workloads/models/parts.py; the GPT's ``layers.*`` by default): FSDP2
        shards each layer, then the root with the rest. ``broadcast_buffers``: DDP sends
        rank 0's buffers to every rank before each forward, needed where a forward changes
        them (BatchNorm's running statistics); the GPT's rotary tables are constant."""
        if self.args.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            # torch 2.13 deprecates the argument; 2.11 on the GPU hosts has no successor
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                ddp = DDP(model, device_ids=ids, bucket_cap_mb=self.args.bucket_cap_mb,
                          broadcast_buffers=broadcast_buffers)
            if self.log.skip:  # no_sync() for good: no bucket copies, no all-reduce
                ddp.require_backward_grad_sync = False
            elif self.backend != "nccl":
                ddp.register_comm_hook(None, ddp_allreduce_hook(self.log))
            self.log.arrive_at_collective = False
            # kept out of a compiled graph; wrapped here, not decorated: the decorator would
            # import torch._dynamo (1.5 s) in every workload process, DDP or not
            ddp.register_forward_hook(torch.compiler.disable(self._forward_done))
            self.ddp = ddp
            return ddp
        from torch.distributed.fsdp import fully_shard

        from workloads.structure import Structure

        reshard = self.args.reshard_after_forward
        shards = [fully_shard(layer, reshard_after_forward=reshard)
                  for layer in Structure(layers).layer_modules(model)]
        root = fully_shard(model, reshard_after_forward=reshard)
        comms = _fsdp_comms(self.log)
        if comms is not None and hasattr(root, "set_custom_all_gather"):
            for module in (*shards, root):
                module.set_custom_all_gather(comms[0])
                module.set_custom_reduce_scatter(comms[1])
            self.fsdp_comm_ranges = True
        return root

    def _forward_done(self, *_: Any) -> None:
        """DDP's forward returned: the all-reduces follow in backward (arrival, straggler).
        Outside a compiled graph: it records an event and may sleep."""
        self.log.arrive()

    def before_step(self) -> None:
        """At the start of every warm-up and measured step (workloads/runner.py): the step's
        start, from which its arrival is timed and after which the straggler's delay comes."""
        self.log.step_started()

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
        dist.all_gather_object(gathered, (steps, self.log.arrivals.ms()))
        arrivals = [a for _, a in gathered]
        tokens = tokens_per_rank * self.world_size
        mean_s = result["mean_ms"] / 1e3
        result.update(
            rank_step_ms=[s for s, _ in gathered],
            # none where no collective ran (comm skip)
            rank_arrival_ms=arrivals if all(arrivals) else None,
            tokens_per_step=tokens,
            tokens_per_step_per_rank=tokens_per_rank,
            tokens_per_s=tokens / mean_s,
            collectives=self._collectives(len(steps)),
            distributed=self.describe(),
        )
        if self.ddp is not None and not self.log.skip:
            result["distributed"]["buckets"] = ddp_buckets(self.ddp)

    def _collectives(self, steps: int) -> list[dict[str, Any]]:
        """Per (op, bytes): collectives per measured step. DDP: one all-reduce per bucket."""
        if self.ddp is None:
            return self.log.record(steps)
        if self.log.skip:
            return []
        sizes = Counter(ddp_buckets(self.ddp))
        return [{"op": "all_reduce", "bytes": b, "per_step": float(n)}
                for b, n in sorted(sizes.items())]

    def describe(self) -> dict[str, Any]:
        knobs = Knobs.of(self.args)
        return {"parallel": self.args.parallel, "world_size": self.world_size,
                "rank": self.rank, "backend": self.backend,
                "nccl": ".".join(map(str, torch.cuda.nccl.version()))
                if self.backend == "nccl" else None,
                "comm_ranges": (self.backend != "nccl") if self.args.parallel == "ddp"
                else self.fsdp_comm_ranges,
                "comm": knobs.comm,
                "straggler": {"rank": knobs.straggle_rank, "ms": knobs.straggle_ms}
                if knobs.straggle_ms > 0 else None}

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
    if args.parallel == "fsdp" and Knobs.of(args).comm == "skip" and not fsdp_comm_hooks():
        raise Unsupported("comm skip replaces FSDP2's collectives through its custom-comm "
                          "hooks (set_custom_all_gather), which this torch lacks")


def check_knobs(args: argparse.Namespace, world: int) -> None:
    """A straggler rank the run has (a usage error otherwise)."""
    knobs = Knobs.of(args)
    if knobs.straggle_ms > 0 and not 0 <= knobs.straggle_rank < world:
        raise ValueError(f"--straggle_rank {knobs.straggle_rank}: the run has ranks 0 to "
                         f"{world - 1}")


def start(args: argparse.Namespace, device: torch.device) -> DistributedRun:
    """Join the process group of this torchrun job (the workload's first collective)."""
    check_supported(args)
    rank, local_rank, world = rank_env()
    if world != args.gpus:
        raise ValueError(f"--gpus {args.gpus} but torchrun started {world} processes")
    check_knobs(args, world)
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
    knobs = Knobs.of(args)
    straggles = knobs.straggle_ms > 0 and rank == knobs.straggle_rank
    log = CommLog(skip=knobs.comm == "skip", arrivals=Arrivals(cuda=device.type == "cuda"),
                  delay_s=knobs.straggle_ms / 1e3 if straggles else 0.0)
    return DistributedRun(args, device, rank, local_rank, world, backend, log=log)
