"""CS336 GPT language model: pre-norm blocks with RoPE attention and a SwiGLU FFN.

The model of workloads/gpt.py (its sizes in ``SIZES``) on a fixed random token batch with
random targets, built like any ``workload: model`` (workloads/models/builder.py; its
layers ``layers.*``, their parts ``ln1``, ``attn``, ``ln2``, ``ffn``); mode ``train`` adds
an AdamW step, ``checkpoint: layers`` checkpoints every block, ``parallel`` runs it under
torchrun with DDP or FSDP2 (workloads/parallel.py, docs/distributed.md). FLOPs are analytic
(workloads/flops.py: gpt_forward_flops).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from workloads.float8 import Recipe, option

# n_layers of each size (workloads/gpt.py: SIZES), for the estimates below without torch.
LAYERS = {"tiny": 2, "small": 12, "medium": 24, "large": 36, "xl": 48, "2.7B": 32}
# size -> (host MB, minutes for the default 5 warm-up + 10 measured steps, forward).
SIZE_NEEDS = {
    "tiny": (4000, 5),
    "small": (8000, 10),
    "medium": (12000, 15),
    "large": (16000, 20),
    "xl": (24000, 30),
    "2.7B": (32000, 40),
}
# Kernels per layer and measured step, from H100 captures of the eager matrix (summary column
# kernel_count / steps): ~40 forward, ~126 forward+backward, 130-161 for the AdamW train
# step (2.7B highest); the upper ends, so the disk estimate is high. bf16 autocast adds up to
# 25% (its casts).
KERNELS_PER_LAYER = {"forward": 41, "forward_backward": 126, "train": 165}
BF16_KERNEL_FACTOR = 1.25


@dataclass
class Options:
    size: Literal["tiny", "small", "medium", "large", "xl", "2.7B"] = field(
        default="small", metadata={"help": "model size (tiny: for CPU tests)", "required": True})
    context: int = field(default=512, metadata={"help": "tokens per sequence", "minimum": 1})
    batch: int = field(default=4, metadata={"minimum": 1})
    vocab: int = field(default=10_000, metadata={"minimum": 2})
    mode: Literal["forward", "forward_backward", "train"] = "forward"
    attention: Literal["naive", "sdpa"] = "sdpa"
    optimizer: Literal["adamw_foreach", "adamw_fused", "adamw_master"] = field(
        default="adamw_foreach", metadata={"help": "train only: PyTorch's multi-tensor AdamW, "
                                           "its fused kernel, or profbench's flat "
                                           "master-weight AdamW"})
    parallel: Literal["none", "ddp", "fsdp"] = field(default="none", metadata={
        "help": "train only: one process per rank under torchrun: DistributedDataParallel or "
                "FSDP2 fully_shard (docs/distributed.md); none = one process"})
    gpus: int = field(default=1, metadata={
        "help": "ranks of a parallel run, one GPU each (on a CPU: gloo processes, one core "
                "each); a machine with fewer gives status unsupported", "minimum": 1})
    bucket_cap_mb: float = field(default=25.0, metadata={
        "help": "DDP: gradient bucket size in MB (one all-reduce per bucket; PyTorch's "
                "default 25)", "exclusiveMinimum": 0})
    reshard_after_forward: bool = field(default=True, metadata={
        "help": "FSDP: true/false: free the gathered parameters after forward (true, ZeRO-3) "
                "or keep them for backward (false)"})
    comm: Literal["on", "skip"] = field(default="on", metadata={
        "help": "DDP/FSDP: skip = every collective replaced by its local result, no "
                "communication and the same compute: the synchronized run's step minus this "
                "one is the untraced cost of communication (docs/distributed.md)"})
    straggle_ms: float = field(default=0.0, metadata={
        "help": "test knob, DDP/FSDP: rank straggle_rank sleeps this long before its first "
                "collective of every warm-up and measured step, so the others wait for it "
                "there (0: off)", "minimum": 0})
    straggle_rank: int = field(default=0, metadata={
        "help": "the rank straggle_ms slows", "minimum": 0})
    compile_blocks: Literal["each", "once", "regional"] = field(default="each", metadata={
        "help": "with compile: each = every layer traced into one flat graph; once = the "
                "block is one nested compile region, compiled once for every layer; "
                "regional = each layer's block compiled on its own, the layer loop eager "
                "(docs/workloads.md)"})
    checkpoint: Literal["none", "layers"] = field(default="none", metadata={
        "help": "activation checkpointing: layers = each block keeps only its input and runs "
                "its forward again in backward (torch.utils.checkpoint, non-reentrant), "
                "trading step time for activation memory"})
    float8: Recipe = option()


def build(options: Options, run: Any) -> Any:
    """The GPT's step, built as any model's (workloads/models/builder.py: build_gpt);
    ``run.wrap`` is DDP or FSDP. The optimizer and compile_blocks reach it through
    ``run.speed``."""
    from workloads.models.builder import build_gpt

    return build_gpt(size=options.size, context=options.context, batch=options.batch,
                     vocab=options.vocab, mode=options.mode, dtype=run.dtype,
                     attention=options.attention, device=run.device, seed=run.seed,
                     speed=run.speed, wrap=run.wrap, checkpoint=options.checkpoint)


def check(options: Options) -> tuple[str, str] | None:
    """The distributed knobs need a distributed run, and the straggler a rank it has."""
    if options.parallel == "none":
        for key, off in (("comm", "on"), ("straggle_ms", 0)):
            if getattr(options, key) != off:
                return key, f"{key} is a setting of DDP/FSDP runs: set parallel: ddp or fsdp"
    elif options.straggle_ms > 0 and options.straggle_rank >= options.gpus:
        return "straggle_rank", (f"rank {options.straggle_rank} does not exist in a run of "
                                 f"{options.gpus} ranks")
    return None


def needs(options: Options) -> tuple[float, float]:
    return SIZE_NEEDS[options.size]


def kernels_per_step(options: Options, dtype: str) -> int:
    per_step = LAYERS[options.size] * KERNELS_PER_LAYER.get(options.mode, 165)
    return int(per_step * BF16_KERNEL_FACTOR) if dtype == "bf16" else per_step


def summary(options: Options) -> str:
    return f"gpt {options.size} {options.attention}"
