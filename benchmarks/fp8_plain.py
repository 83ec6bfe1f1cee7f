"""Plain FP8 training steps of the CS336 GPT: torchao's documented recipe, no profbench code.

The reference that profbench's ``float8`` rungs (config/fp8.yaml) are checked against: the
GPT of benchmarks/plain_distributed.py (itself written from scratch) trained the way the
PyTorch and torchao docs show: bf16 autocast, fused AdamW, SDPA on the cuDNN backend,
torch.compile, and for FP8 ``torchao.float8.convert_to_float8_training`` with
``Float8LinearConfig.from_recipe_name`` (tensorwise or rowwise), the Linear layers whose
dimensions are multiples of 16 converted, the LM head kept in bf16 (torchao's example filter).

    # the issue's measurement: 2.7B, batch 4 x 512, bf16 then each FP8 recipe
    python benchmarks/fp8_plain.py --size 2.7B --out fp8_plain.json
    # each block compiled on its own (PyTorch's recipe for deep models; compile_blocks: regional)
    python benchmarks/fp8_plain.py --size 2.7B --compile regional
    # CPU smoke (seconds; PyTorch runs torch._scaled_mm on the CPU too)
    python benchmarks/fp8_plain.py --size tiny --batch 2 --context 32 --vocab 256 \\
        --device cpu --compile off --warmup 1 --steps 2

Each recipe runs on the same seed (the same weights and batch), one after the other in this
process: ``--warmup`` steps, then ``--steps`` steps each timed alone (CUDA events around it and
a synchronize after it; the host clock on the CPU). It prints one line per recipe (median ms,
the losses) and the ratio to bf16, and with ``--out`` writes a JSON of all of it.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_distributed import GPT, SIZES  # noqa: E402 - the plain script's model

RECIPES = ("bf16", "tensorwise", "rowwise")


def to_float8(model: nn.Module, recipe: str) -> int:
    """torchao's conversion with its docs' filter; returns the Linear layers converted."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    converted = []

    def module_filter_fn(mod: nn.Module, fqn: str) -> bool:
        if fqn == "head":  # don't convert the last module (the LM head)
            return False
        ok = mod.in_features % 16 == 0 and mod.out_features % 16 == 0
        if ok:
            converted.append(fqn)
        return ok

    convert_to_float8_training(
        model, module_filter_fn=module_filter_fn, config=Float8LinearConfig.from_recipe_name(recipe)
    )
    return len(converted)


def build(
    args: argparse.Namespace, recipe: str, device: torch.device
) -> tuple[nn.Module, torch.optim.Optimizer, int]:
    torch.manual_seed(args.seed)
    with device:
        model = GPT(args.size, args.vocab, args.context)
    converted = to_float8(model, recipe) if recipe != "bf16" else 0
    # fused AdamW on the fp32 weights (autocast casts them), built before compile
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    if args.compile == "model":
        model = torch.compile(model)
    elif args.compile == "regional":
        for module in (*model.blocks, model.norm):
            module.compile()
    return model, optimizer, converted


def time_recipe(args: argparse.Namespace, recipe: str, device: torch.device) -> dict[str, Any]:
    model, optimizer, converted = build(args, recipe, device)
    generator = torch.Generator().manual_seed(args.seed)
    tokens, targets = (
        torch.randint(0, args.vocab, (args.batch, args.context), generator=generator).to(device)
        for _ in range(2)
    )

    def attention() -> contextlib.AbstractContextManager:
        if device.type == "cuda":
            return sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
        return contextlib.nullcontext()

    losses: list[float] = []

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with attention(), torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        optimizer.step()
        return loss.detach()

    start = time.perf_counter()
    for _ in range(args.warmup):
        losses.append(step().item())
    warmup_s = time.perf_counter() - start
    times = []
    for _ in range(args.steps):
        if device.type == "cuda":
            begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            begin.record()
            loss = step()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            loss = step()
            times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {
        "recipe": recipe,
        "step_ms": statistics.median(times),
        "step_times_ms": times,
        "losses": losses,
        "warmup_s": warmup_s,
        "converted_linears": converted,
        "peak_memory_bytes": peak,
    }


def free(device: torch.device) -> None:
    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def add_model_arguments(p: argparse.ArgumentParser, compile_default: str) -> None:
    """The model, the recipes, where it runs and where the JSON goes (this script's and
    benchmarks/fp8_loss.py's)."""
    p.add_argument("--size", choices=list(SIZES), default="2.7B")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--vocab", type=int, default=10_000)
    p.add_argument(
        "--recipes",
        default=",".join(RECIPES),
        help=f"comma-separated, from {RECIPES} (bf16: no FP8)",
    )
    p.add_argument(
        "--compile",
        choices=("model", "regional", "off"),
        default=compile_default,
        help="model: torch.compile(model); regional: each block and the final norm; off: eager",
    )
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)


def parse_recipes(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    args.recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    if not args.recipes or set(args.recipes) - set(RECIPES):
        p.error(f"--recipes: expected some of {RECIPES}")


def resolve_device(args: argparse.Namespace) -> torch.device:
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(args.device)


def write_out(path: Path | None, result: dict[str, Any]) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p, compile_default="model")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args(argv)
    parse_recipes(p, args)
    if args.steps < 1 or args.warmup < 0:
        p.error("need --steps >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    device = resolve_device(args)
    cuda = device.type == "cuda"
    result: dict[str, Any] = {
        "size": args.size,
        "batch": args.batch,
        "context": args.context,
        "vocab": args.vocab,
        "compile": args.compile,
        "warmup": args.warmup,
        "steps": args.steps,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torchao": importlib.metadata.version("torchao"),
        "timer": "cuda_event" if cuda else "wall",
        "recipes": {},
    }
    for recipe in args.recipes:
        row = time_recipe(args, recipe, device)
        free(device)  # the recipe's model, optimizer and compiled code are gone
        result["recipes"][recipe] = row
        bf16 = result["recipes"].get("bf16")
        ratio = (
            f", speed-up over bf16 {bf16['step_ms'] / row['step_ms']:.3f}x"
            if bf16 and row is not bf16
            else ""
        )
        print(
            f"{recipe}: {row['step_ms']:.2f} ms/step{ratio}; loss "
            f"{row['losses'][0]:.4f} -> {row['losses'][-1]:.4f}",
            flush=True,
        )
    write_out(args.out, result)
    return result


if __name__ == "__main__":
    main()
