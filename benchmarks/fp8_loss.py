"""FP8 against bf16 training loss, step for step, on a token stream a model can learn.

The FP8 rungs' losses (config/fp8.yaml, benchmarks/fp8_vs_plain.py) are those of a few steps
on one fixed random batch: a model memorizing it, whose loss after 11 steps moves along a
steep curve, so two recipes' losses there differ as much as their trajectories do. This
script asks the numerics question on its own terms: the plain script's model and torchao
recipe (benchmarks/fp8_plain.py, no profbench code) trained for hundreds of steps on fresh
batches of a random Markov chain (each token has ``--branching`` possible successors with
random weights), whose exact loss floor is known, with a learning-rate warm-up and cosine
decay, the same batches and initial weights for every recipe.

    python benchmarks/fp8_loss.py --size 2.7B --steps 300 --out fp8_loss.json
    # CPU smoke (seconds)
    python benchmarks/fp8_loss.py --size tiny --batch 2 --context 32 --vocab 256 \\
        --device cpu --compile off --steps 20

It prints, per recipe, the loss at every tenth of the run and the mean over the last
``--window`` steps, with the ratio to bf16's and the excess over the chain's floor (the mean
of -log p(target | previous token) over the same batches); ``--out`` writes all of it and
every step's loss.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fp8_plain import (  # noqa: E402 - the plain script's model, recipe and options
    add_model_arguments,
    build,
    free,
    parse_recipes,
    resolve_device,
    write_out,
)


def markov_chain(
    vocab: int, branching: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(successors [vocab, branching], their probabilities [vocab, branching]): each token's
    possible next tokens and Dirichlet(1) weights over them."""
    successors = torch.randint(0, vocab, (vocab, branching), generator=generator)
    weights = -torch.log(torch.rand(vocab, branching, generator=generator))  # Exp(1) draws
    return successors, weights / weights.sum(1, keepdim=True)


def sample_batches(
    successors: torch.Tensor,
    probs: torch.Tensor,
    steps: int,
    batch: int,
    context: int,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences [steps, batch, context + 1] drawn from the chain, and the probability
    the chain gave each next token [steps, batch, context] (the floor's terms)."""
    n = steps * batch
    seqs = torch.empty(n, context + 1, dtype=torch.long)
    seqs[:, 0] = torch.randint(0, probs.shape[0], (n,), generator=generator)
    chosen = torch.empty(n, context)
    for t in range(context):
        rows = probs[seqs[:, t]]
        pick = torch.multinomial(rows, 1, generator=generator).squeeze(1)
        seqs[:, t + 1] = successors[seqs[:, t], pick]
        chosen[:, t] = rows.gather(1, pick[:, None]).squeeze(1)
    return seqs.view(steps, batch, context + 1), chosen.view(steps, batch, context)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak``, then cosine decay to a tenth of it."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    args: argparse.Namespace, recipe: str, device: torch.device, seqs: torch.Tensor
) -> dict[str, Any]:
    model, optimizer, converted = build(args, recipe, device)
    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.lr_warmup)
        batch = seqs[step].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    values = [x.item() for x in losses]
    return {
        "recipe": recipe,
        "losses": values,
        "converted_linears": converted,
        "finite": all(math.isfinite(v) for v in values),
        "last_window_mean": statistics.fmean(values[-args.window :]),
        "seconds": time.perf_counter() - start,
    }


def summary_line(row: dict[str, Any], marks: list[int], window: int, floor: float) -> str:
    """One recipe's losses at the marks, its last window's mean and how it compares."""
    at = " ".join(f"{row['losses'][m]:.3f}" for m in marks)
    line = (
        f"{row['recipe']}: loss at steps {[m + 1 for m in marks]}: {at}; mean of the last "
        f"{window} {row['last_window_mean']:.4f} (floor {floor:.4f})"
    )
    if "ratio_to_bf16" in row:
        line += (
            f", {row['ratio_to_bf16']:.4f} of bf16's, excess over the floor "
            f"{row['excess_ratio_to_bf16']:.3f} of bf16's"
        )
    return line + f"; {row['seconds']:.0f} s"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arguments(p, compile_default="regional")
    p.add_argument(
        "--branching", type=int, default=4, help="possible successors of each token in the chain"
    )
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate")
    p.add_argument(
        "--lr-warmup", type=int, default=None, help="warm-up steps (default: a tenth of --steps)"
    )
    p.add_argument(
        "--window", type=int, default=None, help="last steps averaged (default: a tenth of --steps)"
    )
    args = p.parse_args(argv)
    parse_recipes(p, args)
    if args.steps < 2 or args.branching < 1:
        p.error("need --steps >= 2 and --branching >= 1")
    args.lr_warmup = args.lr_warmup if args.lr_warmup is not None else max(1, args.steps // 10)
    args.window = min(args.steps, args.window or max(1, args.steps // 10))
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    device = resolve_device(args)
    generator = torch.Generator().manual_seed(args.seed)
    successors, probs = markov_chain(args.vocab, args.branching, generator)
    seqs, chosen = sample_batches(
        successors, probs, args.steps, args.batch, args.context, generator
    )
    floor = -chosen[-args.window :].log().mean().item()
    result: dict[str, Any] = {
        **{
            k: getattr(args, k)
            for k in (
                "size",
                "batch",
                "context",
                "vocab",
                "branching",
                "compile",
                "steps",
                "lr",
                "lr_warmup",
                "window",
            )
        },
        "loss_floor": floor,
        "loss_at_start": math.log(args.vocab),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "torchao": importlib.metadata.version("torchao"),
        "recipes": {},
    }
    marks = sorted({max(0, args.steps * i // 10 - 1) for i in range(1, 11)})
    for recipe in args.recipes:
        row = train(args, recipe, device, seqs)
        free(device)
        result["recipes"][recipe] = row
        bf16 = result["recipes"].get("bf16")
        if bf16 and row is not bf16:
            row["ratio_to_bf16"] = row["last_window_mean"] / bf16["last_window_mean"]
            row["excess_ratio_to_bf16"] = (row["last_window_mean"] - floor) / (
                bf16["last_window_mean"] - floor
            )
        print(summary_line(row, marks, args.window, floor), flush=True)
    write_out(args.out, result)
    return result


if __name__ == "__main__":
    main()
