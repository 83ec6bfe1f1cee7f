"""Which difference between the pipeline's distributed step and the plain script's costs time:
one torchrun job, every variant built and timed in turn in the same processes.

    torchrun --standalone --nproc-per-node 2 benchmarks/distributed_bisect.py --size 2.7B
    torchrun --standalone --nproc-per-node 4 benchmarks/distributed_bisect.py --size 2.7B \\
        --variants pipeline,plain --rounds 3
    # CPU, 2 gloo ranks (seconds)
    torchrun --standalone --nproc-per-node 2 benchmarks/distributed_bisect.py --size tiny \\
        --device cpu --warmup 1 --steps 2 --rounds 1

benchmarks/distributed_spread.py launches whole timing commands (guard, launcher, torchrun);
this script takes the step apart. A variant is the pipeline's GPT train step (workloads: its
model, its DDP/FSDP wrapping with the comm ranges, its warm-up/measure loop) or the plain
script's (benchmarks/plain_distributed.py: its model and wrapping) with one thing changed
(VARIANTS). Rounds interleave the variants (each once, then again) so that a drift of the
machine reaches each alike. Every variant is timed by the same loop (workloads/runner.py:
CUDA events, a synchronize per step), each step started by a barrier where the variant says
so. Rank 0 prints, per variant, the median step over rounds (each round: the median over
ranks of each rank's median), the rounds' spread and the spread within a round, and the
ratio to ``plain``; ``--out`` writes every step of every rank.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import plain_distributed as plain  # noqa: E402

from workloads import parallel  # noqa: E402
from workloads.runner import run_steps  # noqa: E402


@dataclass(frozen=True)
class Variant:
    model: str  # "pipeline" (workloads/gpt.py through build_gpt) or "plain"
    parallel: str = "ddp"
    # DDP's all-reduce: "pipeline" (as workloads/parallel.py wraps it: DDP's built-in C++
    # all-reduce on NCCL), "avg_range" (a Python comm hook: the all-reduce with NCCL's average
    # inside an NVTX range), "python" (PyTorch's default_hooks.allreduce_hook)
    hook: str = "pipeline"
    barrier: bool = False  # every rank starts each step together
    bucket_view: bool = False  # DDP gradient_as_bucket_view
    fsdp_hooks: bool = True  # pipeline FSDP: the comm-range all-gather/reduce-scatter
    about: str = ""


VARIANTS = {
    "pipeline": Variant("pipeline", about="the pipeline's DDP step as its timing process runs it"),
    "pipeline_barrier": Variant("pipeline", barrier=True,
                                about="... each step started by a barrier"),
    "pipeline_hook_avg": Variant("pipeline", hook="avg_range",
                                 about="... with a Python comm hook (AVG all-reduce in a range)"),
    "pipeline_python": Variant("pipeline", hook="python",
                               about="... with PyTorch's Python all-reduce hook"),
    "pipeline_bucketview": Variant("pipeline", bucket_view=True,
                                   about="... with gradient_as_bucket_view"),
    "plain_nobarrier": Variant("plain", hook="none",
                               about="the plain script's model and DDP, no barrier"),
    "plain": Variant("plain", hook="none", barrier=True,
                     about="the plain script's model and DDP, a barrier per step (its timing)"),
    "fsdp_pipeline": Variant("pipeline", parallel="fsdp",
                             about="the pipeline's FSDP2 step (comm-range collectives)"),
    "fsdp_pipeline_default": Variant("pipeline", parallel="fsdp", fsdp_hooks=False,
                                     about="... with FSDP2's own collectives"),
    "fsdp_plain": Variant("plain", parallel="fsdp", barrier=True,
                          about="the plain script's FSDP2 step"),
}
DEFAULT_VARIANTS = ("pipeline,pipeline_barrier,pipeline_hook_avg,pipeline_python,"
                    "pipeline_bucketview,plain_nobarrier,plain")


def pipeline_args(args: argparse.Namespace, variant: Variant) -> argparse.Namespace:
    """The options parallel.DistributedRun reads, as the workload's parser gives them."""
    return argparse.Namespace(parallel=variant.parallel, gpus=dist.get_world_size(),
                              bucket_cap_mb=args.bucket_cap_mb, reshard_after_forward=True,
                              comm="on", straggle_ms=0.0, straggle_rank=0, mode="train")


def ddp(model: torch.nn.Module, device: torch.device, variant: Variant,
        bucket_cap_mb: float) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        wrapped = DDP(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb,
                      broadcast_buffers=False, gradient_as_bucket_view=variant.bucket_view)
    if variant.hook == "python":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        wrapped.register_comm_hook(None, default_hooks.allreduce_hook)
    elif variant.hook == "avg_range":
        wrapped.register_comm_hook(None, avg_range_hook)
    return wrapped


# No annotations: DDP checks them against dist.GradBucket, and here they are strings.
def avg_range_hook(state, bucket):  # noqa: ANN001, ANN201
    """The all-reduce with NCCL's average (sum and average on gloo), inside an NVTX range
    closed when its future completes."""
    import nvtx

    tensor = bucket.buffer()
    range_id = nvtx.start_range(f"comm all_reduce {tensor.numel() * tensor.element_size()}B")
    if dist.get_backend() == "nccl":
        work = dist.all_reduce(tensor, op=dist.ReduceOp.AVG, async_op=True)
    else:
        tensor.div_(dist.get_world_size())
        work = dist.all_reduce(tensor, async_op=True)

    def close(fut: torch.futures.Future) -> torch.Tensor:
        nvtx.end_range(range_id)
        return fut.value()[0]

    return work.get_future().then(close)


def build_pipeline_step(args: argparse.Namespace, variant: Variant, device: torch.device
                        ) -> tuple[Callable[[], Any], Callable[[], None]]:
    """The pipeline's step (build_gpt with the run's wrapping) and its before-step mark."""
    from workloads.models.builder import build_gpt
    from workloads.steps import Speed

    run = parallel.DistributedRun(
        pipeline_args(args, variant), device, dist.get_rank(), 0, dist.get_world_size(),
        dist.get_backend(),
        log=parallel.CommLog(arrivals=parallel.Arrivals(cuda=device.type == "cuda")))

    def wrap(model: torch.nn.Module, **_: Any) -> torch.nn.Module:
        if variant.parallel == "ddp" and (variant.hook != "pipeline" or variant.bucket_view):
            return ddp(model, device, variant, args.bucket_cap_mb)
        if variant.parallel == "fsdp" and not variant.fsdp_hooks:
            return _fsdp_layers(model)
        return run.wrap(model)

    speed = Speed(optimizer="adamw_fused", sdpa_backend=args.sdpa)
    workload = build_gpt(size=args.size, context=args.context, batch=args.batch,
                         vocab=args.vocab, mode="train", dtype=args.dtype, attention="sdpa",
                         device=device, seed=0, speed=speed, wrap=wrap)
    run.log.measuring = True
    return workload.step, run.before_step


def _fsdp_layers(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 over the pipeline GPT's layers and root, FSDP2's own collectives."""
    from torch.distributed.fsdp import fully_shard

    from workloads.models.parts import Structure

    for layer in Structure("layers.*").layer_modules(model):
        fully_shard(layer, reshard_after_forward=True)
    return fully_shard(model, reshard_after_forward=True)


def build_plain_step(args: argparse.Namespace, variant: Variant, device: torch.device
                     ) -> tuple[Callable[[], Any], Callable[[], None]]:
    torch.manual_seed(0)
    with device:
        model = plain.GPT(args.size, args.vocab, args.context)
    opts = argparse.Namespace(
        parallel=variant.parallel, bucket_cap_mb=args.bucket_cap_mb,
        reshard_after_forward=True, comm_hook="none", seed=0, batch=args.batch,
        context=args.context, vocab=args.vocab, dtype=args.dtype,
        sdpa=args.sdpa if device.type == "cuda" else "auto")
    if variant.parallel == "ddp":
        model = ddp(model, device, variant, args.bucket_cap_mb)
    else:
        model = plain.wrap(model, opts, device)
    steps = plain.Steps(model, opts, device)
    return steps.step, lambda: None


def time_variant(name: str, args: argparse.Namespace, device: torch.device) -> list[float]:
    """This rank's measured steps (ms) of one variant, built from scratch and freed after."""
    variant = VARIANTS[name]
    build = build_pipeline_step if variant.model == "pipeline" else build_plain_step
    step, mark = build(args, variant, device)

    def before_step() -> None:
        if variant.barrier:
            dist.barrier()
        mark()

    measurement = run_steps(step, warmup=args.warmup, steps=args.steps, device=device,
                            before_step=before_step)
    del step, before_step
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return measurement.step_ms


def median_over_ranks(per_rank: list[list[float]]) -> float:
    return statistics.median(statistics.median(steps) for steps in per_rank)


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values) if values else 0.0


def report(results: dict[str, list[list[list[float]]]]) -> tuple[str, dict[str, Any]]:
    """Per variant: median of the rounds' medians, rounds' spread, within-round spread."""
    summary: dict[str, Any] = {}
    for name, rounds in results.items():
        medians = [median_over_ranks(per_rank) for per_rank in rounds]
        within = statistics.median(spread(steps) for per_rank in rounds for steps in per_rank)
        summary[name] = {"median_ms": statistics.median(medians), "round_medians_ms": medians,
                         "rounds_spread": spread(medians), "within_round_spread": within}
    base = summary.get("plain", {}).get("median_ms")
    lines = [f"{'variant':<24} {'median ms':>10} {'/plain':>7} {'rounds':>7} {'within':>7}  "
             "what"]
    for name, s in summary.items():
        ratio = f"{s['median_ms'] / base:7.3f}" if base else f"{'':>7}"
        lines.append(f"{name:<24} {s['median_ms']:10.2f} {ratio} {s['rounds_spread']:7.1%} "
                     f"{s['within_round_spread']:7.1%}  {VARIANTS[name].about}")
    return "\n".join(lines), summary


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=list(plain.SIZES), default="small")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help=f"comma-separated, of: {', '.join(VARIANTS)}")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--vocab", type=int, default=10_000)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--sdpa", default=None, help="default: cudnn on a GPU, auto on a CPU")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--out", type=Path, help="JSON of every step of every rank (rank 0)")
    args = p.parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse(argv)
    _, world, device = plain.join("ddp", args.device)
    if args.sdpa is None:
        args.sdpa = "cudnn" if device.type == "cuda" else "auto"
    names = args.variants.split(",")
    results: dict[str, list[Any]] = {name: [] for name in names}
    started = time.monotonic()
    for index in range(args.rounds):
        for name in names:
            steps = time_variant(name, args, device)
            per_rank = plain.gather(steps, world)
            results[name].append(per_rank)
            if dist.get_rank() == 0:
                print(f"round {index} {name}: {median_over_ranks(per_rank):.2f} ms "
                      f"(ranks {[round(statistics.median(s), 2) for s in per_rank]}) "
                      f"{time.monotonic() - started:.0f} s", flush=True)
    rank = dist.get_rank()
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    text, summary = report(results)
    print(text, flush=True)
    out = {"size": args.size, "world_size": world, "steps": args.steps, "warmup": args.warmup,
           **plain.environment(device), "summary": summary, "steps_ms": results}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out) + "\n")
    return out


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
