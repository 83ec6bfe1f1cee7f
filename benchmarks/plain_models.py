"""Plain PyTorch training-step timings of ResNet and of a HuggingFace causal LM.

The baseline that profbench's ``workload: model`` runs of the same models are compared with:
a training loop written from the PyTorch docs' performance recipes alone (no profbench code),
with bf16 autocast, fused AdamW, torch.compile of forward + loss, channels-last memory for
the ResNet and SDPA attention for the LM, on random data.

    # ResNet-50, batch 64, 224x224 images
    python benchmarks/plain_models.py --model resnet --out resnet50.json
    # GPT-2 small (124M), batch 8, context 1024; --model llama: a Llama of the same shape
    python benchmarks/plain_models.py --model gpt2 --out gpt2.json
    # CPU smoke (seconds)
    python benchmarks/plain_models.py --model resnet --depth 18 --image-size 32 --batch 2 \\
        --steps 2 --warmup 1 --device cpu --no-compile
    python benchmarks/plain_models.py --model gpt2 --n-layer 2 --n-embd 64 --n-head 4 \\
        --vocab-size 128 --context 32 --batch 2 --steps 2 --warmup 1 --device cpu --no-compile

Each step is timed alone: CUDA events around it and a synchronize after it (host clock on the
CPU). It prints the median ms per step and, with ``--out``, writes a JSON of every step's
time, the GPU, and the torch version.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Batch = tuple[Any, torch.Tensor]


def build_resnet(args: argparse.Namespace, device: torch.device) -> tuple[nn.Module, Batch]:
    import torchvision

    with device:
        model = getattr(torchvision.models, f"resnet{args.depth}")(
            weights=None, num_classes=args.num_classes)
    generator = torch.Generator().manual_seed(args.seed)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, generator=generator)
    labels = torch.randint(0, args.num_classes, (args.batch,), generator=generator)
    if not args.no_channels_last:
        # cuDNN's convolutions run NHWC natively; NCHW costs a transpose around each.
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)
    return model, (images.to(device), labels.to(device))


def build_causal_lm(args: argparse.Namespace, device: torch.device) -> tuple[nn.Module, Batch]:
    # Built from a config with random weights: no download, no Hub access.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    if args.model == "gpt2":
        config = transformers.GPT2Config(
            n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
            vocab_size=args.vocab_size, n_positions=args.context,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=args.vocab_size - 1, eos_token_id=args.vocab_size - 1,
            use_cache=False, attn_implementation="sdpa")
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.LlamaConfig(
            num_hidden_layers=args.n_layer, hidden_size=args.n_embd,
            num_attention_heads=args.n_head, num_key_value_heads=args.n_head,
            # Llama's SwiGLU width: 8/3 of the model width, rounded up to a multiple of 256
            intermediate_size=256 * -(-8 * args.n_embd // (3 * 256)),
            vocab_size=args.vocab_size, max_position_embeddings=args.context,
            tie_word_embeddings=False, use_cache=False, attn_implementation="sdpa")
        cls = transformers.LlamaForCausalLM
    with device:
        model = cls(config)
    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.batch, args.context)
    tokens = torch.randint(0, args.vocab_size, shape, generator=generator)
    targets = torch.randint(0, args.vocab_size, shape, generator=generator)
    return model, ({"input_ids": tokens.to(device)}, targets.to(device))


def forward_loss_fn(model: nn.Module, kind: str) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """Forward and loss in one function, so torch.compile fuses the loss into the graph (the
    LM's fp32 logits are never materialized in full)."""

    def resnet(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(images).float(), labels)

    def causal_lm(inputs: dict[str, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        logits = model(**inputs).logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    return resnet if kind == "resnet" else causal_lm


def time_steps(step: Callable[[], torch.Tensor], n: int, device: torch.device) -> list[float]:
    """Milliseconds of each of n steps, each synchronized before the next starts."""
    times = []
    for _ in range(n):
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


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("resnet", "gpt2", "llama"), default="resnet")
    p.add_argument("--batch", type=int, help="default: 64 (resnet), 8 (gpt2, llama)")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                   help="bf16: autocast to bfloat16 (fp32 weights); fp32: TF32 matmuls")
    p.add_argument("--no-compile", action="store_true", help="eager")
    p.add_argument("--compile-mode", default="default",
                   help="torch.compile mode: default, reduce-overhead, max-autotune, ...")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="JSON with every step's time")
    g = p.add_argument_group("resnet")
    g.add_argument("--depth", type=int, choices=(18, 34, 50, 101, 152), default=50)
    g.add_argument("--image-size", type=int, default=224)
    g.add_argument("--num-classes", type=int, default=1000)
    g.add_argument("--no-channels-last", action="store_true")
    g = p.add_argument_group("gpt2, llama")
    g.add_argument("--context", type=int, default=1024)
    g.add_argument("--n-layer", type=int, default=12)
    g.add_argument("--n-embd", type=int, default=768)
    g.add_argument("--n-head", type=int, default=12)
    g.add_argument("--vocab-size", type=int, default=50257)
    args = p.parse_args(argv)
    if args.batch is None:
        args.batch = 64 if args.model == "resnet" else 8
    if args.steps < 1 or args.warmup < 0:
        p.error("need --steps >= 1 and --warmup >= 0")

    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    # TF32 for the matmuls and convolutions left in fp32; cuDNN picks its fastest algorithms
    # for these fixed shapes.
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.benchmark = True

    if args.model == "resnet":
        model, (inputs, targets) = build_resnet(args, device)
        items_per_step = args.batch
    else:
        model, (inputs, targets) = build_causal_lm(args, device)
        items_per_step = args.batch * args.context
    model.train()
    params = sum(t.numel() for t in model.parameters())
    # Fused AdamW: one kernel for the whole update instead of several per parameter group.
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True)
    forward_loss = forward_loss_fn(model, "resnet" if args.model == "resnet" else "lm")
    if not args.no_compile:
        forward_loss = torch.compile(forward_loss, mode=args.compile_mode)

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = forward_loss(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    warmup_ms = time_steps(step, args.warmup, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_ms = time_steps(step, args.steps, device)
    median = statistics.median(step_ms)

    name = (f"resnet{args.depth}" if args.model == "resnet"
            else f"{args.model} {params / 1e6:.3g}M")
    on_cuda = device.type == "cuda"
    result = {
        "model": name,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "params": params,
        "items_per_step": items_per_step,
        "median_ms": median,
        "items_per_s": items_per_step / median * 1e3,
        "step_ms": step_ms,
        "warmup_ms": warmup_ms,
        "timer": "cuda_event" if on_cuda else "wall",
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if on_cuda else None,
        "device": torch.cuda.get_device_name(device) if on_cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torchvision": version("torchvision"),
        "transformers": version("transformers"),
        "python": platform.python_version(),
    }
    print(f"{name} batch {args.batch} on {result['device']}: median {median:.2f} ms/step "
          f"({result['items_per_s']:.0f} {'images' if args.model == 'resnet' else 'tokens'}/s)"
          f", first warm-up step {warmup_ms[0] if warmup_ms else float('nan'):.0f} ms")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
