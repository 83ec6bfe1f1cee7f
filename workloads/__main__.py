"""Command line: ``python -m workloads {attention,gpt} ...`` -> timings JSON + one summary line.

Examples::

    python -m workloads attention --impl sdpa --batch 32 --seq 100 --embed 256 --out a.json
    python -m workloads gpt --size small --mode train --dtype bf16 --out g.json
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from workloads import flops
from workloads.attention import IMPLS
from workloads.device import DTYPES, device_name, resolve_device
from workloads.gpt import SIZES
from workloads.provenance import provenance
from workloads.runner import Measurement, run_steps
from workloads.steps import ATTENTION_MODES, GPT_MODES, Workload, build_attention, build_gpt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workloads", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="workload", required=True)

    attention = sub.add_parser("attention", help="naive vs SDPA attention module (notebook)")
    attention.add_argument("--impl", choices=IMPLS, default="naive")
    attention.add_argument("--batch", type=_positive, default=32)
    attention.add_argument("--seq", type=_positive, default=100)
    attention.add_argument("--embed", type=_positive, default=256)
    attention.add_argument("--heads", type=_positive, default=1)
    attention.add_argument("--mode", choices=ATTENTION_MODES, default="forward")

    gpt = sub.add_parser("gpt", help="CS336 GPT language model")
    gpt.add_argument("--size", choices=list(SIZES), default="small")
    gpt.add_argument("--context", type=_positive, default=512)
    gpt.add_argument("--batch", type=_positive, default=4)
    gpt.add_argument("--vocab", type=_positive, default=10_000)
    gpt.add_argument("--mode", choices=GPT_MODES, default="forward")
    gpt.add_argument("--attention", choices=IMPLS, default="sdpa")

    for p in (attention, gpt):
        p.add_argument("--dtype", choices=DTYPES, default="fp32")
        p.add_argument("--warmup", type=_non_negative, default=3, help="unmeasured steps")
        p.add_argument("--steps", type=_positive, default=5, help="measured steps")
        p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument(
            "--peak-tflops",
            type=float,
            default=None,
            help="peak TFLOP/s for MFU (default: datasheet value for known GPUs, else no MFU)",
        )
        p.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
        workload = build_workload(args, device)
    except ValueError as err:  # invalid combination of options
        parser.error(str(err))
    measurement = run_steps(workload.step, warmup=args.warmup, steps=args.steps, device=device)
    result = make_result(args, device, workload, measurement)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(summary_line(result))
    return 0


def build_workload(args: argparse.Namespace, device: torch.device) -> Workload:
    common = dict(batch=args.batch, dtype=args.dtype, mode=args.mode, device=device, seed=args.seed)
    if args.workload == "attention":
        return build_attention(
            impl=args.impl, seq=args.seq, embed=args.embed, heads=args.heads, **common
        )
    return build_gpt(
        size=args.size, context=args.context, vocab=args.vocab, attention=args.attention, **common
    )


def make_result(
    args: argparse.Namespace, device: torch.device, workload: Workload, measurement: Measurement
) -> dict[str, Any]:
    """The JSON record of one run (keys documented in docs/workloads.md)."""
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    params.pop("workload")
    params["device"] = device.type
    stats = measurement.summary()
    mean_s = stats["mean_ms"] / 1e3
    name = device_name(device)
    flops_per_step = flops.step_flops(workload.forward_flops, args.mode)
    peak = args.peak_tflops
    if peak is None and device.type == "cuda":
        peak = flops.peak_tflops(name, args.dtype)
    return {
        "workload": args.workload,
        "params": params,
        "device_name": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "step_times_ms": measurement.step_times_ms,
        "cuda_event_times_ms": measurement.cuda_event_times_ms or None,
        **stats,
        "tokens_per_s": workload.tokens_per_step / mean_s,
        "params_count": workload.params_count,
        "peak_memory_bytes": measurement.peak_memory_bytes,
        "losses": measurement.losses,
        "model_flops_per_step": flops_per_step,
        "peak_tflops": peak,
        "mfu": flops.mfu(flops_per_step, mean_s, peak),
        "provenance": provenance(),
    }


def summary_line(result: dict[str, Any]) -> str:
    p = result["params"]
    variant = (
        f"gpt {p['size']} {p['attention']}"
        if result["workload"] == "gpt"
        else f"attention {p['impl']} h={p['heads']}"
    )
    line = (
        f"{variant} {p['mode']} {p['dtype']} on {result['device_name']}: "
        f"{result['mean_ms']:.2f} ms/step (median {result['median_ms']:.2f}, "
        f"std {result['std_ms']:.2f}, n={len(result['step_times_ms'])}), "
        f"{result['tokens_per_s']:,.0f} tok/s"
    )
    if result["mfu"] is not None:
        line += f", MFU {result['mfu']:.1%}"
    if result["losses"]:
        line += f", loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f}"
    return line


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


if __name__ == "__main__":
    sys.exit(main())
