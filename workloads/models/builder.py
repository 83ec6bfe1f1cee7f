"""One builder for every model's step: ``workload: model`` (a factory's ModelParts) and the
built-in GPT (workloads/gpt.py, its ModelParts made here) go through :func:`build_step`.

It takes the model, its fixed batch and its loss, and owns everything around them: dtype,
activation checkpointing (``checkpoint: layers``), torch.compile over the structure's layers
(``compile_blocks`` each / once / regional), DDP/FSDP, the optimizer, the module ranges of a
capture (workloads/module_ranges.py) and the step (workloads/steps.py). A model's FLOPs come
from PyTorch's FlopCounterMode on one eager step, unless its builder gives them (the GPT's
are analytic: workloads/flops.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workloads import float8 as fp8
from workloads import flops, module_ranges
from workloads.device import autocast, compute_dtype
from workloads.gpt import GPT, config_for
from workloads.models import RunSettings
from workloads.models.parts import ModelParts, checkpoint_layers, compile_once
from workloads.optim import build_optimizer, optimizer_bytes_per_step
from workloads.status import Unsupported
from workloads.steps import (
    GPT_MODES,
    NESTED_REGION_OPTIONS,
    Speed,
    Workload,
    _check_mode,
    _count,
    _make_step,
    _require_sdpa,
    call_model,
    compile_callable,
    compile_kwargs,
    first_tensor,
    track_module_paths,
    track_provenance,
)
from workloads.structure import Structure, find_structure

# Set by the pipeline's capture rules (rules/profile.smk): the process runs under nsys. Module
# ranges cost autograd nodes in every step, so untraced timing runs go without them.
CAPTURE_ENV = "PROFBENCH_CAPTURE"
# The GPT's layers and their parts (workloads/gpt.py: Block), as any model declares them.
GPT_STRUCTURE = Structure(layers="layers.*", sublayers="ln1|attn|ln2|ffn")


@dataclass(frozen=True)
class StepSettings:
    """What the builder takes from a workload's options: ``workload: model``'s Options has
    every field (:meth:`of`); the GPT sets those it has."""

    mode: str
    batch: int
    optimizer: str = "adamw_foreach"
    compile_blocks: str = "each"
    checkpoint: str = "none"
    module_depth: int | None = None
    layers: str = ""
    sublayers: str = ""
    channels_last: bool = False
    cudnn_benchmark: bool = False
    lr: float = 1e-3

    @classmethod
    def of(cls, options: Any) -> StepSettings:
        """The settings of a workload's Options, by field name."""
        return cls(**{f.name: getattr(options, f.name) for f in fields(cls)
                      if hasattr(options, f.name)})


def build_model_step(options: Any, run: Any, factory: Callable[..., Any]) -> Workload:
    """A user's model (workloads/models/model.py) on a fixed batch from its batch maker."""
    return build_step(StepSettings.of(options), run,
                      lambda: model_parts(factory(**options.kwargs), options.factory),
                      name=f"factory {options.factory!r}")


def build_step(settings: StepSettings, run: Any, make_parts: Callable[[], ModelParts], *,
               name: str, counted_flops: Callable[[], dict[str, int]] | None = None
               ) -> Workload:
    """The step of the model ``make_parts`` returns (called after seeding with the run's
    seed), on the fixed batch its batch maker draws after seeding again. ``counted_flops``:
    the model's forward and step FLOPs (``{"forward": .., "step": ..}``), else counted on
    one eager step. ``name`` names the model in errors."""
    _check_mode(settings.mode, GPT_MODES, "model")
    device, speed = run.device, run.speed
    torch.backends.cudnn.benchmark = settings.cudnn_benchmark
    torch.manual_seed(run.seed)
    parts = make_parts()
    model = parts.model.to(device)
    memory_format = torch.channels_last if settings.channels_last else torch.preserve_format
    if settings.channels_last:
        model = model.to(memory_format=torch.channels_last)
    torch.manual_seed(run.seed)
    inputs, targets = parts.make_batch(settings.batch, device)
    inputs, targets = _on_device(inputs, device, memory_format), _on_device(targets, device)
    if settings.mode == "train" and parts.loss is None:
        raise ValueError(f"{name} returned no loss: mode train needs one")
    structure = Structure(settings.layers, settings.sublayers) if settings.layers else (
        parts.structure or find_structure(model))
    params_count = _count(model)
    counted = counted_flops() if counted_flops is not None else count_step_flops(
        model, inputs, targets, parts.loss, settings.mode, run.dtype, device)
    # before the hooks, checkpointing and compile; compile_blocks as this builder reads it
    float8 = fp8.convert(model, speed, device, settings.compile_blocks)
    depth = module_depth(model, structure, settings.module_depth)
    ranges = None  # after the counted step: its ranges would stay open
    compiled = speed.compile_mode != "off"
    if depth and os.environ.get(CAPTURE_ENV) == "1":
        regions = structure.layer_modules(model) if compiled and settings.compile_blocks in (
            "regional", "once") else []
        ranges = module_ranges.ModuleRanges(model, depth, regions)
    if settings.checkpoint == "layers":
        checkpoint_layers(structure.layer_modules(model))
    if settings.compile_blocks == "once" and compiled:
        compile_once(structure.layer_modules(model))  # before DDP/FSDP wrap the layers
    wrapped = model if run.wrap is None else run.wrap(
        model, layers=structure.layers, broadcast_buffers=not parts.constant_buffers)
    optimizer = None
    if settings.mode == "train":
        low = compute_dtype(run.dtype) if run.dtype in ("bf16", "fp16") else None
        optimizer = build_optimizer(
            settings.optimizer, wrapped, lr=settings.lr, low_precision=low,
            compile_mode=speed.compile_mode, capturable=speed.cuda_graph == "step")
    if compiled:
        track_module_paths()
    if settings.compile_blocks == "regional" and compiled:
        compile_regional(structure.layer_modules(model), speed.compile_mode)
        compiled_model = wrapped
    else:
        compiled_model = compile_callable(
            wrapped, speed.compile_mode,
            NESTED_REGION_OPTIONS if settings.compile_blocks == "once" else None)
    loss_fn = None
    if parts.loss is not None and settings.mode != "forward":
        user_loss = parts.loss

        def loss_fn(output: Any) -> torch.Tensor:
            return user_loss(output, targets)

        loss_fn = compile_callable(loss_fn, speed.compile_mode)
    grad_output = None
    if loss_fn is None and settings.mode == "forward_backward":
        grad_output = _grad_output_like(model, inputs, device, run.dtype)

    def forward() -> Any:
        with autocast(device, run.dtype):
            return call_model(compiled_model, inputs)

    scaler = None
    if run.dtype == "fp16" and settings.mode != "forward":
        scaler = torch.amp.GradScaler(device.type)
    step = _make_step(wrapped, forward, settings.mode, loss_fn=loss_fn, optimizer=optimizer,
                      speed=speed, scaler=scaler, grad_output=grad_output,
                      after_backward=ranges.close_open if ranges else None)
    return Workload(
        step=step,
        tokens_per_step=settings.batch * parts.items_per_sample,
        params_count=params_count,
        forward_flops=counted["forward"],
        flops_per_step=counted["step"],
        optimizer_bytes_per_step=optimizer_bytes_per_step(optimizer),
        structure=structure,
        module_paths=ranges.paths if ranges else None,
        module_depth=depth,
        float8=float8,
    )


def compile_regional(layers: list[nn.Module], mode: str) -> None:
    """Regional compilation (``compile_blocks: regional``, PyTorch's recipe for deep models):
    each layer's forward is compiled on its own and the rest runs eagerly. The layers share
    one forward and its guards hold for each of them (parameters are graph inputs), so Dynamo
    traces one layer per process whatever the depth. Its forward, not its call: the layer's
    module ranges and hooks stay eager."""
    if not layers:
        raise ValueError("compile_blocks regional needs layers: set `layers` or return a "
                         "structure from the factory")
    track_provenance()
    for layer in layers:
        layer.forward = torch.compile(layer.forward, **compile_kwargs(mode))


def build_gpt(
    *,
    size: str,
    context: int,
    batch: int,
    vocab: int,
    mode: str,
    dtype: str,
    attention: str,
    device: torch.device,
    seed: int,
    lr: float = 1e-3,
    speed: Speed | None = None,
    wrap: Callable[..., nn.Module] | None = None,
    checkpoint: str = "none",
) -> Workload:
    """The CS336 GPT (workloads/gpt.py) on a fixed random token batch with random targets,
    through :func:`build_step` like any model, with its analytic FLOPs. ``wrap`` (DDP or
    FSDP, workloads/parallel.py) wraps the model before the optimizer is built."""
    _check_mode(mode, GPT_MODES, "gpt")
    speed = speed or Speed()
    cfg = config_for(size, context_length=context, vocab_size=vocab, attention=attention)
    if attention == "sdpa":
        shape = (batch, cfg.n_heads, context, cfg.d_model // cfg.n_heads)
        _require_sdpa(speed.sdpa_backend, shape, dtype, device, causal=True, mode=mode)
    if mode == "train" and speed.optimizer == "adamw_master" and dtype == "fp16":
        raise Unsupported("optimizer adamw_master has no fp16 GradScaler support; use bf16")
    settings = StepSettings(mode=mode, batch=batch, optimizer=speed.optimizer,
                            compile_blocks=speed.compile_blocks, checkpoint=checkpoint, lr=lr)
    forward_flops = flops.gpt_forward_flops(cfg, batch, context)
    counted = {"forward": forward_flops, "step": flops.step_flops(forward_flops, mode)}
    return build_step(settings, RunSettings(dtype, device, seed, speed, wrap),
                      lambda: gpt_parts(cfg, device, seed), name="gpt",
                      counted_flops=lambda: counted)


def gpt_parts(cfg: Any, device: torch.device, seed: int) -> ModelParts:
    """The GPT as a factory returns a model: built on the device (initializing a multi-GB
    model on the CPU is slow), a fixed random token batch with random targets, and an fp32
    cross-entropy loss whatever the activation dtype (what autocast does on CUDA anyway)."""
    with torch.device(device):
        model = GPT(cfg)

    def make_batch(batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length),
                               generator=generator)
        targets = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length),
                                generator=generator)
        return tokens.to(device), targets.to(device)

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    return ModelParts(model, make_batch, loss, structure=GPT_STRUCTURE,
                      items_per_sample=cfg.context_length, constant_buffers=True)


def module_depth(model: nn.Module, structure: Any, depth: int | None) -> int:
    """The module ranges' depth: as set, else one below the first layer (its sublayers),
    else 3."""
    if depth is not None:
        return depth
    layer = next((p for p, _ in model.named_modules() if structure.is_layer(p)), None)
    return layer.count(".") + 2 if layer else 3


def model_parts(made: Any, factory: str) -> Any:
    """The factory's return value as ModelParts, or a ValueError saying what it must be."""
    if isinstance(made, tuple) and len(made) == 3:
        made = ModelParts(*made)
    what = (f"factory {factory!r} must return ModelParts(model, make_batch, loss) or the "
            "tuple (model, make_batch, loss): an nn.Module, a callable (batch_size, device) -> "
            "(inputs, targets), and a callable (output, targets) -> loss or None")
    if not isinstance(made, ModelParts):
        raise ValueError(f"{what}; it returned {type(made).__name__}")
    if not isinstance(made.model, nn.Module):
        raise ValueError(f"{what}; its model is a {type(made.model).__name__}")
    if not callable(made.make_batch) or (made.loss is not None and not callable(made.loss)):
        raise ValueError(f"{what}; its make_batch or loss is not callable")
    return made


def count_step_flops(model: nn.Module, inputs: Any, targets: Any, loss: Any, mode: str,
                     dtype: str, device: torch.device) -> dict[str, int]:
    """FLOPs of the forward and of the whole step, counted by PyTorch's FlopCounterMode on one
    eager step of the model (matmuls, convolutions and attention, as the analytic counts)."""
    from torch.utils.flop_counter import FlopCounterMode

    backward = mode != "forward"
    with FlopCounterMode(display=False) as forward_counter:
        with torch.set_grad_enabled(backward), autocast(device, dtype):
            output = call_model(model, inputs)
            value = loss(output, targets) if backward and loss is not None else None
    forward = forward_counter.get_total_flops()
    if not backward:
        return {"forward": forward, "step": forward}
    with FlopCounterMode(display=False) as backward_counter:
        if value is not None:
            value.backward()
        else:
            out = first_tensor(output)
            out.backward(torch.ones_like(out))
    model.zero_grad(set_to_none=True)
    return {"forward": forward, "step": forward + backward_counter.get_total_flops()}




def _on_device(value: Any, device: torch.device,
               memory_format: torch.memory_format = torch.preserve_format) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.to(device)
        if value.dim() == 4 and value.is_floating_point():
            value = value.contiguous(memory_format=memory_format)
        return value
    if isinstance(value, tuple | list):
        return type(value)(_on_device(v, device, memory_format) for v in value)
    if isinstance(value, dict):
        return {k: _on_device(v, device, memory_format) for k, v in value.items()}
    return value




def _grad_output_like(model: nn.Module, inputs: Any, device: torch.device, dtype: str
                      ) -> torch.Tensor:
    """A fixed random gradient of the model's output (forward_backward without a loss)."""
    with torch.no_grad(), autocast(device, dtype):
        out = first_tensor(call_model(model, inputs), needs_grad=False)
    generator = torch.Generator().manual_seed(0)
    return torch.randn(out.shape, generator=generator).to(device)
