"""A plain torchrun script of the GPT train step that config/distributed.yaml times.

The reference the pipeline's distributed numbers are checked against (docs/distributed.md,
"Checking against a plain script"): the CS336 GPT (pre-norm RMSNorm, RoPE, SwiGLU, untied
LM head, no biases) written here from scratch, trained the way the PyTorch docs show, with no
profbench code: bf16 autocast, fused AdamW, SDPA on the cuDNN backend, eager; DDP as in the
DDP tutorial, FSDP2 as in the ``fully_shard`` docs (every block, then the root).

    # 2 GPUs: DDP, GPT 2.7B, and the same step with gradient sync skipped
    torchrun --standalone --nproc-per-node 2 benchmarks/plain_distributed.py \\
        --size 2.7B --parallel ddp --no-sync
    # one GPU
    python benchmarks/plain_distributed.py --size 2.7B
    # CPU, 2 gloo ranks (seconds)
    torchrun --standalone --nproc-per-node 2 benchmarks/plain_distributed.py \\
        --size tiny --parallel fsdp --device cpu --warmup 1 --steps 2
    # the parameter count only (meta device, nothing allocated)
    python benchmarks/plain_distributed.py --size 2.7B --count-params

Timing: ``--warmup`` steps, then ``--steps`` steps, each started by a barrier on every rank
and timed alone (CUDA events and a synchronize on a GPU, the host clock on a CPU). Each rank's
median, and the median over ranks, is the step time. Rank 0 prints one JSON line (and writes
it to ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

# d_model, d_ff, n_layers, n_heads (CS336's sizes; tiny for CPU tests)
SIZES = {
    "tiny": (64, 128, 2, 4),
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}
SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
# NVLink multicast off for NCCL, torch symmetric memory and NVSHMEM, as the pipeline's
# launcher sets it (a host's own value is kept).
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


# --- the model ---------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # the mean of squares in fp32 under bf16 autocast
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
                * self.weight).type_as(x)


class Rotary:
    """RoPE on adjacent feature pairs. Plain tensors, not buffers: constants that DDP need not
    broadcast and FSDP need not shard."""

    def __init__(self, head_dim: int, context: int, theta: float = 10_000.0) -> None:
        inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(context, dtype=torch.float32), inv_freq)
        self.cos, self.sin = angles.cos(), angles.sin()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[: x.size(-2)], self.sin[: x.size(-2)]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, rope: Rotary) -> None:
        super().__init__()
        self.n_heads, self.rope = n_heads, rope
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False)
                                          for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (p(x).view(b, s, self.n_heads, -1).transpose(1, 2) for p in (self.q, self.k,
                                                                                 self.v))
        y = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, d))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d_model: int, d_ff: int, n_heads: int, rope: Rotary) -> None:
        super().__init__()
        self.norm1, self.attn = RMSNorm(d_model), Attention(d_model, n_heads, rope)
        self.norm2, self.ffn = RMSNorm(d_model), SwiGLU(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, size: str, vocab: int, context: int) -> None:
        super().__init__()
        d_model, d_ff, n_layers, n_heads = SIZES[size]
        rope = Rotary(d_model // n_heads, context)
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, d_ff, n_heads, rope) for _ in range(n_layers))
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.trunc_normal_(m.weight, std=0.02, a=-0.06, b=0.06)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def count_params(size: str, vocab: int = 10_000, context: int = 512) -> int:
    """Parameters of the model, built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(size, vocab, context).parameters())


# --- ranks, wrapping, the step -----------------------------------------------------------------


def join(parallel: str, device_arg: str) -> tuple[int, int, torch.device]:
    """(rank, world size, device); the process group when parallel."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if parallel == "none":
        if world > 1:
            raise SystemExit("--parallel none is one process; launch it without torchrun")
        kind = device_arg if device_arg != "auto" else (
            "cuda" if torch.cuda.is_available() else "cpu")
        return 0, 1, torch.device(kind, 0) if kind == "cuda" else torch.device(kind)
    if "LOCAL_RANK" not in os.environ:
        raise SystemExit(f"--parallel {parallel} runs under torchrun "
                         "(torchrun --standalone --nproc-per-node N ...)")
    local = int(os.environ["LOCAL_RANK"])
    cuda = device_arg == "cuda" or (device_arg == "auto" and torch.cuda.is_available())
    if cuda:
        for name, value in NCCL_ENV.items():
            os.environ.setdefault(name, value)
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def wrap(model: nn.Module, args: argparse.Namespace, device: torch.device) -> nn.Module:
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb)
        if args.comm_hook == "python":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            # PyTorch's own all-reduce hook, in Python (DDP's comm-hook docs): what a hook
            # costs beside DDP's built-in C++ all-reduce
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        return ddp
    if args.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, reshard_after_forward=args.reshard_after_forward)
        return fully_shard(model, reshard_after_forward=args.reshard_after_forward)
    return model


@dataclass
class Steps:
    """The train step, and the same step with gradient synchronization skipped (after
    :meth:`skip_sync`)."""

    model: nn.Module
    args: argparse.Namespace
    device: torch.device
    tokens: torch.Tensor = field(init=False)
    targets: torch.Tensor = field(init=False)
    optimizer: torch.optim.Optimizer = field(init=False)

    def __post_init__(self) -> None:
        generator = torch.Generator().manual_seed(self.args.seed)  # every rank: the same batch
        shape = (self.args.batch, self.args.context)
        self.tokens, self.targets = (
            torch.randint(0, self.args.vocab, shape, generator=generator).to(self.device)
            for _ in range(2))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3, fused=True)

    def attention_backend(self) -> contextlib.AbstractContextManager:
        sdpa = self.args.sdpa
        return sdpa_kernel(SDPA_BACKENDS[sdpa]) if sdpa != "auto" else contextlib.nullcontext()

    def forward_backward(self) -> None:
        bf16 = self.args.dtype == "bf16"
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = self.model(self.tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), self.targets.flatten())
        loss.backward()

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with self.attention_backend():
            self.forward_backward()
        self.optimizer.step()

    def skip_sync(self) -> None:
        """From now on :meth:`no_sync_step` runs: FSDP2 stops reducing gradients."""
        if self.args.parallel == "fsdp":
            self.model.set_requires_gradient_sync(False)
            # FSDP2 then leaves the sharded gradients unset: zero ones, set once and never
            # reset, give the optimizer the same update to do as in the synced step.
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)

    def no_sync_step(self) -> None:
        with self.attention_backend():
            if self.args.parallel == "ddp":
                self.optimizer.zero_grad(set_to_none=True)
                with self.model.no_sync():
                    self.forward_backward()
            else:
                self.forward_backward()
        self.optimizer.step()


# --- timing ------------------------------------------------------------------------------------


def barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


def time_steps(step: Callable[[], None], n: int, device: torch.device, world: int
               ) -> list[float]:
    """ms of each of n steps: all ranks start it together (barrier), each timed alone."""
    times = []
    for _ in range(n):
        barrier(world)
        if device.type == "cuda":
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def measure(step: Callable[[], None], args: argparse.Namespace, device: torch.device,
            world: int) -> dict[str, Any]:
    warmup = time_steps(step, args.warmup, device, world)
    steps = time_steps(step, args.steps, device, world)
    per_rank = gather(steps, world)
    medians = [statistics.median(t) for t in per_rank]
    return {"step_ms": statistics.median(medians), "rank_median_ms": medians,
            "rank_step_ms": per_rank, "warmup_ms": warmup}


def gather(values: Any, world: int) -> list[Any]:
    if world == 1:
        return [values]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, values)
    return out


def environment(device: torch.device) -> dict[str, Any]:
    cuda = device.type == "cuda"
    return {
        "device_name": torch.cuda.get_device_name(device) if cuda else platform.processor()
        or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "timer": "cuda_event" if cuda else "wall",
        "env": {k: os.environ[k] for k in sorted(os.environ)
                if k.startswith(("NCCL_", "TORCH_NCCL", "PYTORCH_CUDA_ALLOC", "OMP_NUM"))},
    }


def memory(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    # retries: the caching allocator freed its cache to satisfy a cudaMalloc (a slow step)
    return {"peak_memory_bytes": stats.get("allocated_bytes.all.peak"),
            "reserved_bytes": stats.get("reserved_bytes.all.peak"),
            "alloc_retries": stats.get("num_alloc_retries")}


# --- main --------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=list(SIZES), default="small")
    p.add_argument("--parallel", choices=("none", "ddp", "fsdp"), default="none")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--vocab", type=int, default=10_000)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                   help="bf16: autocast to bfloat16 (fp32 weights)")
    p.add_argument("--sdpa", choices=(*SDPA_BACKENDS, "auto"), default=None,
                   help="attention backend (default: cudnn on a GPU, auto on a CPU)")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size")
    p.add_argument("--reshard-after-forward", type=_boolean, default=True,
                   help="FSDP2: true (default) or false")
    p.add_argument("--comm-hook", choices=("none", "python"), default="none",
                   help="DDP: python registers PyTorch's Python all-reduce hook")
    p.add_argument("--no-sync", action="store_true",
                   help="also time the step with gradient synchronization skipped")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count-params", action="store_true",
                   help="print the parameter count (meta device) and exit")
    p.add_argument("--out", type=Path, help="also write the JSON here (rank 0)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("need --steps >= 1 and --warmup >= 0")
    if args.no_sync and args.parallel == "none":
        p.error("--no-sync needs --parallel ddp or fsdp")
    return args


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse(argv)
    if args.count_params:
        result = {"size": args.size, "params": count_params(args.size, args.vocab, args.context)}
        print(json.dumps(result), flush=True)
        return result
    rank, world, device = join(args.parallel, args.device)
    if args.sdpa is None:
        args.sdpa = "cudnn" if device.type == "cuda" else "auto"
    torch.manual_seed(args.seed)  # every rank: the same weights
    with device:
        model = GPT(args.size, args.vocab, args.context)
    params = sum(p.numel() for p in model.parameters())
    model = wrap(model, args, device)
    steps = Steps(model, args, device)
    result: dict[str, Any] = {
        "size": args.size, "parallel": args.parallel, "world_size": world,
        "batch": args.batch, "context": args.context, "vocab": args.vocab, "dtype": args.dtype,
        "sdpa": args.sdpa, "bucket_cap_mb": args.bucket_cap_mb, "comm_hook": args.comm_hook,
        "reshard_after_forward": args.reshard_after_forward, "warmup": args.warmup,
        "steps": args.steps, "params": params, **environment(device),
    }
    result.update(measure(steps.step, args, device, world))
    result["rank_memory"] = gather(memory(device), world)
    if args.no_sync:
        steps.skip_sync()
        no_sync = measure(steps.no_sync_step, args, device, world)
        result["no_sync"] = no_sync
        # what the step without sync still does that the synced step does not (FSDP2 keeps
        # the unsharded gradients, and adds each step's to them)
        result["no_sync_extra"] = ("accumulates unsharded gradients"
                                   if args.parallel == "fsdp" else None)
        # what gradient synchronization adds to the step, untraced
        result["sync_cost_ms"] = result["step_ms"] - no_sync["step_ms"]
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return None
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")
    return result


if __name__ == "__main__":
    main()
