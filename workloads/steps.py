"""Builds one workload (model + fixed inputs + a step function) from CLI-level settings.

A step is one forward, forward+backward or training iteration; :mod:`workloads.runner`
times it. Inputs are generated once from a seeded CPU generator (same data on every device)
and reused by every step, so a `train` run always fits the same batch.

Compilation (``compile`` != off) wraps the model and the loss separately, so the phase ranges
(forward_pass, loss_computation, backward_pass, optimizer_step) stay outside compiled code.
With ``cuda_graph: step`` the whole step is captured into one CUDA graph after it is built
(workloads/graphs.py); the compiled regions then use mode ``default`` (graphs do not nest).
"""

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workloads import float8 as fp8
from workloads import flops
from workloads.attention import Attention, attention_core, sdpa_backend_context
from workloads.attention import sdpa_unsupported_reason as _sdpa_reason
from workloads.device import autocast, compute_dtype
from workloads.gpt import GPT, config_for
from workloads.graphs import CUDA_GRAPH_MODES
from workloads.nvtx_ranges import rng
from workloads.optim import MasterAdamW, build_optimizer, optimizer_bytes_per_step
from workloads.runner import Step
from workloads.status import Unsupported

ATTENTION_MODES = ("forward", "forward_backward")
GPT_MODES = ("forward", "forward_backward", "train")
COMPILE_MODES = ("off", "default", "max-autotune-no-cudagraphs", "reduce-overhead")


@dataclass
class Workload:
    step: Step
    tokens_per_step: int
    params_count: int
    forward_flops: int
    flops_per_step: int
    # bytes one optimizer step must move through device memory (train mode; optim.py)
    optimizer_bytes_per_step: int | None = None
    # a model workload's layers and sublayers (workloads/models/parts.py), for the record
    structure: Any = None
    # the module paths with NVTX ranges (a capture of a model workload), for the record
    module_paths: list[str] | None = None
    module_depth: int | None = None  # the depth they go to (the analysis cuts compiled paths)
    float8: dict[str, Any] | None = None  # the FP8 conversion (workloads/float8.py), for the record


@dataclass(frozen=True)
class Speed:
    """The settings that change how fast, not what, a workload computes."""

    compile: str = "off"
    sdpa_backend: str = "auto"
    optimizer: str = "adamw_foreach"
    cuda_graph: str = "off"
    compile_blocks: str = "each"  # GPT only: "once" compiles one block for all layers (gpt.py)
    float8: str = "none"  # FP8 training recipe of the Linear layers (workloads/float8.py)

    def __post_init__(self) -> None:
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"unknown compile mode {self.compile!r}; expected {COMPILE_MODES}")
        if self.cuda_graph not in CUDA_GRAPH_MODES:
            raise ValueError(f"unknown cuda_graph {self.cuda_graph!r}; expected {CUDA_GRAPH_MODES}")

    @property
    def compile_mode(self) -> str:
        """The torch.compile mode the regions get: one graph of the whole step replaces
        reduce-overhead's per-region graphs (CUDA graphs do not nest)."""
        if self.cuda_graph == "step" and self.compile == "reduce-overhead":
            return "default"
        return self.compile

    @property
    def region_graphs(self) -> bool:
        """Whether torch.compile replays each compiled region as its own CUDA graph."""
        return self.compile_mode == "reduce-overhead"


def build_attention(
    *,
    impl: str,
    batch: int,
    seq: int,
    embed: int,
    heads: int,
    dtype: str,
    mode: str,
    device: torch.device,
    seed: int,
    speed: Speed = Speed(),
) -> Workload:
    """The notebook attention module on a fixed random (batch, seq, embed) input."""
    _check_mode(mode, ATTENTION_MODES, "attention")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Attention(embed, heads, impl)
    if impl == "sdpa":
        shape = (batch, heads, seq, embed // heads)
        _require_sdpa(speed.sdpa_backend, shape, dtype, device, causal=False, mode=mode)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, embed, generator=generator).to(device)
    # No loss in this workload: backward starts from a fixed random output gradient.
    grad_output = torch.randn(batch, seq, embed, generator=generator).to(device)
    compiled = compile_callable(model, speed.compile_mode)

    def forward() -> torch.Tensor:
        with autocast(device, dtype):
            return compiled(x)

    step = _make_step(model, forward, mode, grad_output=grad_output, speed=speed)
    forward_flops = flops.attention_forward_flops(batch, seq, embed)
    return Workload(
        step=step,
        tokens_per_step=batch * seq,
        params_count=_count(model),
        forward_flops=forward_flops,
        flops_per_step=flops.step_flops(forward_flops, mode),
    )


def build_attention_core(
    *,
    impl: str,
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    causal: bool,
    dtype: str,
    mode: str,
    device: torch.device,
    seed: int,
    speed: Speed = Speed(),
) -> Workload:
    """softmax(q k^T / sqrt(d)) v on fixed random q, k, v of shape (batch, heads, seq, head_dim).

    q, k, v are created in the compute dtype (bf16/fp16 tensors, no autocast); backward
    returns dq, dk, dv for a fixed random output gradient (no accumulation into .grad).
    """
    _check_mode(mode, ATTENTION_MODES, "attention_core")
    shape = (batch, heads, seq, head_dim)
    if impl == "sdpa":
        _require_sdpa(speed.sdpa_backend, shape, dtype, device, causal=causal, mode=mode)
    # Drawn on the device, in the compute dtype: on the CPU, four (8, 16, 4096, 128) draws
    # took ~3 s of a timing job whose 20 steps take 0.04 s (docs/timing.md).
    generator = torch.Generator(device).manual_seed(seed)
    cdtype = compute_dtype(dtype)
    q, k, v, grad_out = (
        torch.randn(shape, generator=generator, device=device, dtype=cdtype) for _ in range(4)
    )
    backward = mode == "forward_backward"
    for t in (q, k, v):
        t.requires_grad_(backward)

    def core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention_core(q, k, v, impl, causal=causal)

    compiled = compile_callable(core, speed.compile_mode)
    graphs = speed.region_graphs

    def step() -> None:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with sdpa_backend_context(speed.sdpa_backend):
            if not backward:
                with torch.no_grad(), rng("forward_pass"):
                    compiled(q, k, v)
                return
            with rng("forward_pass"):
                out = compiled(q, k, v)
            with rng("backward_pass"):
                torch.autograd.grad(out, (q, k, v), grad_out)

    forward_flops = flops.attention_core_forward_flops(batch, heads, seq, head_dim, causal)
    return Workload(
        step=step,
        tokens_per_step=batch * seq,
        params_count=0,
        forward_flops=forward_flops,
        flops_per_step=flops.attention_core_step_flops(forward_flops, mode),
    )


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
    speed: Speed = Speed(),
    wrap: Callable[[nn.Module], nn.Module] | None = None,
) -> Workload:
    """The CS336 GPT on a fixed random token batch, with random targets. ``wrap`` (DDP or
    FSDP, workloads/parallel.py) wraps the model before the optimizer is built."""
    _check_mode(mode, GPT_MODES, "gpt")
    cfg = config_for(size, context_length=context, vocab_size=vocab, attention=attention,
                     compile_blocks=speed.compile_blocks)
    if attention == "sdpa":
        shape = (batch, cfg.n_heads, context, cfg.d_model // cfg.n_heads)
        _require_sdpa(speed.sdpa_backend, shape, dtype, device, causal=True, mode=mode)
    if mode == "train" and speed.optimizer == "adamw_master" and dtype == "fp16":
        raise Unsupported("optimizer adamw_master has no fp16 GradScaler support; use bf16")
    torch.manual_seed(seed)
    # Built directly on the device: initializing a multi-GB model on the CPU is slow.
    with torch.device(device):
        model = GPT(cfg)
    params_count = _count(model)
    float8 = fp8.convert(model, speed, device)
    gpt = model  # regional compilation compiles its blocks in place, also under a wrapper
    if wrap is not None:
        model = wrap(model)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, context), generator=generator).to(device)
    targets = torch.randint(0, vocab, (batch, context), generator=generator).to(device)
    optimizer = None
    if mode == "train":
        low = compute_dtype(dtype) if dtype in ("bf16", "fp16") else None
        optimizer = build_optimizer(
            speed.optimizer, model, lr=lr, low_precision=low, compile_mode=speed.compile_mode,
            capturable=speed.cuda_graph == "step",
        )
    if speed.compile_blocks == "regional":
        compile_regions(gpt, speed.compile_mode)
        compiled_model = model
    else:
        compiled_model = compile_callable(
            model, speed.compile_mode,
            NESTED_REGION_OPTIONS if speed.compile_blocks == "once" else None)

    def loss(logits: torch.Tensor) -> torch.Tensor:
        # fp32 loss whatever the activation dtype (what autocast does on CUDA anyway).
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    compiled_loss = compile_callable(loss, speed.compile_mode)

    def forward() -> torch.Tensor:
        with autocast(device, dtype):
            return compiled_model(tokens)

    scaler = None
    if dtype == "fp16" and mode != "forward":
        scaler = torch.amp.GradScaler(device.type)
    step = _make_step(
        model, forward, mode, loss_fn=compiled_loss, optimizer=optimizer, speed=speed,
        scaler=scaler,
    )
    forward_flops = flops.gpt_forward_flops(cfg, batch, context)
    return Workload(
        step=step,
        tokens_per_step=batch * context,
        params_count=params_count,
        forward_flops=forward_flops,
        flops_per_step=flops.step_flops(forward_flops, mode),
        optimizer_bytes_per_step=optimizer_bytes_per_step(optimizer),
        float8=float8,
    )


# Inductor options of a model whose block is a nested compile region reused by every layer
# (workloads/gpt.py: BlockCompiledOnce). Without them torch (2.13 on CPU, measured) reuses a
# buffer across the region's calls that a later backward call still reads: gradients of every
# layer but the last come out wrong (tests/test_compile_blocks.py checks them against eager).
NESTED_REGION_OPTIONS = {"allow_buffer_reuse": False}


def compile_callable(fn: Any, mode: str, options: dict[str, Any] | None = None) -> Any:
    """``fn`` compiled with torch.compile in ``mode`` (``off``: unchanged), with Inductor
    ``options`` on top of the mode's own.

    Every builder calls this before the first step, so provenance tracking is on for all
    of the process's compilations, the optimizer's (compiled at its first step) included.
    """
    if mode == "off":
        return fn
    track_provenance()
    return torch.compile(fn, **compile_kwargs(mode, options))


def compile_regions(model: GPT, mode: str) -> None:
    """Regional compilation (PyTorch's recipe for deep models): each layer's block and the
    final norm are compiled in place (``nn.Module.compile``); the embedding lookup, the layer
    loop and the LM head's GEMM run eagerly. Every block shares ``Block.forward`` and its
    guards hold for each of them (parameters are graph inputs), so Dynamo traces one block
    per process whatever the depth, where a whole-model compile traces every layer (2.7B's
    32: ~6 s of every compiled process on the H100). The layer loop being eager, the
    ``layer_<i>`` NVTX ranges stay in the profile."""
    if mode == "off":
        return
    track_provenance()
    for region in (*model.layers, model.ln_final):
        region.compile(**compile_kwargs(mode))


def compile_kwargs(mode: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """torch.compile's keyword arguments for ``mode`` with Inductor ``options`` on top:
    torch.compile takes a mode or options, not both, so the mode's own become options."""
    if options:
        from torch._inductor import list_mode_options

        return {"options": {**list_mode_options(mode), **options}}
    return {"mode": None if mode == "default" else mode}


def track_provenance() -> None:
    """Make Inductor record, for every kernel it generates, the ATen ops and source lines it
    came from: ``# [Provenance debug handles]`` comments in the generated code and, under
    TORCH_TRACE, the kernel stack traces the analysis maps compiled kernels back to the
    model with (docs/analysis.md). It only adds comments and metadata. Set in every
    process of a compiled run (timing and capture alike) so that they all make and reuse
    the same Inductor cache entries: the capture then loads the timing processes' code."""
    import torch._inductor.config as inductor_config

    trace = inductor_config.trace
    if hasattr(trace, "provenance_tracking_level"):
        trace.provenance_tracking_level = 1
    elif hasattr(trace, "provenance_tracking"):  # torch releases before the level setting
        trace.provenance_tracking = True


# A version in the pass's uuid keeps Inductor's cache honest (MODULE_PATH_LINE: parts.py).
_MODULE_PATHS_UUID = "profbench-module-paths-3"
# forward nodes' module paths by stack trace, for the backward graph compiled after them
_PATH_BY_TRACE: dict[str, str] = {}


def track_module_paths() -> None:
    """Make Inductor keep, for every compiled node, the path of the module it came from:
    a post-grad pass appends it to the node's stack trace (``nn_module_stack`` in forward,
    ``fwd_nn_module_stack`` in backward), which provenance tracking records for each kernel
    and Inductor's cache keeps with the compiled code, so a capture that loads the timing
    processes' code still has it. A forward node that AOTAutograd's partitioner put in the
    backward graph (activation checkpointing's recomputation, or its own rematerialization)
    gets a second line, ``RECOMPUTE_LINE``. Model workloads only: the GPT maps its kernels by
    source."""
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    from workloads.models.parts import MODULE_PATH_LINE, RECOMPUTE_LINE

    class ModulePaths(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            backward = any(n.meta.get("partitioner_tag") == "is_backward" for n in graph.nodes)
            for node in graph.nodes:
                stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
                trace = node.meta.get("stack_trace")
                if trace is None:
                    continue
                if stack:
                    path = module_path(next(reversed(stack.values()))[0])
                    _PATH_BY_TRACE[trace] = path
                else:  # a backward node AOTAutograd gave no module: its forward's, by source
                    path = _PATH_BY_TRACE.get(trace)
                if path is not None:
                    lines = [MODULE_PATH_LINE.format(path)]
                    if backward and node.meta.get("partitioner_tag") == "is_forward":
                        lines.append(RECOMPUTE_LINE)
                    node.meta["stack_trace"] = trace.rstrip("\n") + "".join(
                        f"\n  {line}" for line in lines) + "\n"

        def uuid(self) -> str:
            return _MODULE_PATHS_UUID

    current = inductor_config.post_grad_custom_post_pass
    if current is None or getattr(current, "uuid", lambda: None)() != _MODULE_PATHS_UUID:
        inductor_config.post_grad_custom_post_pass = ModulePaths()


def module_path(dynamo_path: str) -> str:
    """``L['self'].layers.0._orig_mod.attn`` -> ``layers.0.attn``: the path in
    ``named_modules()`` of the model profbench built."""
    parts = [p for p in dynamo_path.split(".")[1:] if p != "_orig_mod"]
    return ".".join(parts)


def _make_step(
    model: nn.Module,
    forward: Callable[[], torch.Tensor],
    mode: str,
    *,
    speed: Speed,
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    grad_output: torch.Tensor | None = None,
    optimizer: torch.optim.Optimizer | MasterAdamW | None = None,
    scaler: torch.amp.GradScaler | None = None,
    after_backward: Callable[[], None] | None = None,
) -> Step:
    """Wrap forward / loss / backward / optimizer in their NVTX ranges.

    Backward starts from the scalar loss when there is a ``loss_fn``, else from the model
    output with ``grad_output``. The step returns the loss (or None) without syncing.
    """
    graphs = speed.region_graphs

    def forward_step() -> None:
        # Inference-style: no autograd graph is recorded, as when serving the model.
        with torch.no_grad(), rng("forward_pass"):
            forward()

    def training_step() -> torch.Tensor | None:
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)
        with rng("forward_pass"):
            out = forward()
        loss = None
        if loss_fn is not None:
            with rng("loss_computation"):
                loss = loss_fn(out)
        with rng("backward_pass"):
            if loss is not None:
                (scaler.scale(loss) if scaler is not None else loss).backward()
            else:
                out = _first_tensor(out)
                out.backward(grad_output.to(out.dtype))
            if after_backward is not None:
                after_backward()
        if optimizer is not None:
            with rng("optimizer_step"):
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
        # A CUDA-graph output is overwritten by the next replay: keep a copy of the loss.
        return loss.detach().clone() if graphs and loss is not None else loss

    inner = forward_step if mode == "forward" else training_step

    def step() -> torch.Tensor | None:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with sdpa_backend_context(speed.sdpa_backend):
            return inner()

    return step


def _require_sdpa(
    backend: str,
    shape: tuple[int, int, int, int],
    dtype: str,
    device: torch.device,
    *,
    causal: bool,
    mode: str,
) -> None:
    reason = _sdpa_reason(
        backend, shape, compute_dtype(dtype), device, causal=causal,
        backward=mode != "forward",
    )
    if reason is not None:
        raise Unsupported(reason)


def _check_mode(mode: str, allowed: tuple[str, ...], workload: str) -> None:
    if mode not in allowed:
        raise ValueError(f"mode {mode!r} is not available for {workload}; choose from {allowed}")


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())




# Set by the pipeline's capture rules (rules/profile.smk): the process runs under nsys. Module
# ranges cost autograd nodes in every step, so untraced timing runs go without them.
CAPTURE_ENV = "PROFBENCH_CAPTURE"


def build_model_step(options: Any, run: Any, factory: Callable[..., Any]) -> Workload:
    """A user's model (workloads/models/model.py) on a fixed batch from its batch maker."""
    from workloads import module_ranges
    from workloads.models.parts import Structure, find_structure

    _check_mode(options.mode, GPT_MODES, "model")
    device, speed = run.device, run.speed
    torch.backends.cudnn.benchmark = options.cudnn_benchmark
    torch.manual_seed(run.seed)
    parts = model_parts(factory(**options.kwargs), options.factory)
    model = parts.model.to(device)
    memory_format = torch.channels_last if options.channels_last else torch.preserve_format
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    torch.manual_seed(run.seed)
    inputs, targets = parts.make_batch(options.batch, device)
    inputs, targets = _on_device(inputs, device, memory_format), _on_device(targets, device)
    if options.mode == "train" and parts.loss is None:
        raise ValueError(f"factory {options.factory!r} returned no loss: mode train needs one")
    structure = Structure(options.layers, options.sublayers) if options.layers else (
        parts.structure or find_structure(model))
    params_count = _count(model)
    counted = count_step_flops(model, inputs, targets, parts.loss, options.mode, run.dtype,
                               device)
    float8 = fp8.convert(model, speed, device)  # before the hooks
    depth = module_depth(model, structure, options.module_depth)
    ranges = None  # after the counted step: its ranges would stay open
    if depth and os.environ.get(CAPTURE_ENV) == "1":
        ranges = module_ranges.ModuleRanges(model, depth)
    if options.checkpoint == "layers":
        from workloads.models.parts import checkpoint_layers

        checkpoint_layers(structure.layer_modules(model))
    if options.compile_blocks == "once" and speed.compile_mode != "off":
        from workloads.models.parts import compile_once

        compile_once(structure.layer_modules(model))  # before DDP/FSDP wrap the layers
    wrapped = model if run.wrap is None else run.wrap(
        model, layers=structure.layers, broadcast_buffers=not parts.constant_buffers)
    optimizer = None
    if options.mode == "train":
        low = compute_dtype(run.dtype) if run.dtype in ("bf16", "fp16") else None
        optimizer = build_optimizer(
            options.optimizer, wrapped, lr=1e-3, low_precision=low,
            compile_mode=speed.compile_mode, capturable=speed.cuda_graph == "step")
    if speed.compile_mode != "off":
        track_module_paths()
    if options.compile_blocks == "regional" and speed.compile_mode != "off":
        layers = [m for p, m in model.named_modules() if structure.is_layer(p)]
        if not layers:
            raise ValueError("compile_blocks regional needs layers: set `layers` or return a "
                             "structure from the factory")
        track_provenance()
        for layer in layers:  # its forward, not its call: the layer's module ranges stay eager
            layer.forward = torch.compile(layer.forward, **compile_kwargs(speed.compile_mode))
        compiled_model = wrapped
    else:
        compiled_model = compile_callable(
            wrapped, speed.compile_mode,
            NESTED_REGION_OPTIONS if options.compile_blocks == "once" else None)
    loss_fn = None
    if parts.loss is not None and options.mode != "forward":
        user_loss = parts.loss

        def loss_fn(output: Any) -> torch.Tensor:
            return user_loss(output, targets)

        loss_fn = compile_callable(loss_fn, speed.compile_mode)
    grad_output = None
    if loss_fn is None and options.mode == "forward_backward":
        grad_output = _grad_output_like(model, inputs, device, run.dtype)

    def forward() -> Any:
        with autocast(device, run.dtype):
            return _call(compiled_model, inputs)

    scaler = None
    if run.dtype == "fp16" and options.mode != "forward":
        scaler = torch.amp.GradScaler(device.type)
    step = _make_step(wrapped, forward, options.mode, loss_fn=loss_fn, optimizer=optimizer,
                      speed=speed, scaler=scaler, grad_output=grad_output,
                      after_backward=ranges.close_open if ranges else None)
    return Workload(
        step=step,
        tokens_per_step=options.batch * parts.items_per_sample,
        params_count=params_count,
        forward_flops=counted["forward"],
        flops_per_step=counted["step"],
        optimizer_bytes_per_step=optimizer_bytes_per_step(optimizer),
        structure=structure,
        module_paths=ranges.paths if ranges else None,
        module_depth=depth,
        float8=float8,
    )


def module_depth(model: nn.Module, structure: Any, depth: int | None) -> int:
    """The module ranges' depth: as set, else one below the first layer (its sublayers),
    else 3."""
    if depth is not None:
        return depth
    layer = next((p for p, _ in model.named_modules() if structure.is_layer(p)), None)
    return layer.count(".") + 2 if layer else 3


def model_parts(made: Any, factory: str) -> Any:
    """The factory's return value as ModelParts, or a ValueError saying what it must be."""
    from workloads.models.parts import ModelParts

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
            output = _call(model, inputs)
            value = loss(output, targets) if backward and loss is not None else None
    forward = forward_counter.get_total_flops()
    if not backward:
        return {"forward": forward, "step": forward}
    with FlopCounterMode(display=False) as backward_counter:
        if value is not None:
            value.backward()
        else:
            out = _first_tensor(output)
            out.backward(torch.ones_like(out))
    model.zero_grad(set_to_none=True)
    return {"forward": forward, "step": forward + backward_counter.get_total_flops()}


def _call(model: Any, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    return model(inputs)


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


def _first_tensor(output: Any, needs_grad: bool = True) -> torch.Tensor:
    """The output itself, or its first tensor (that needs a gradient) of a tuple or dict."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output
    for v in values:
        if isinstance(v, torch.Tensor) and (v.requires_grad or not needs_grad):
            return v
    raise ValueError("the model's output holds no tensor that needs a gradient")


def _grad_output_like(model: nn.Module, inputs: Any, device: torch.device, dtype: str
                      ) -> torch.Tensor:
    """A fixed random gradient of the model's output (forward_backward without a loss)."""
    with torch.no_grad(), autocast(device, dtype):
        out = _first_tensor(_call(model, inputs), needs_grad=False)
    generator = torch.Generator().manual_seed(0)
    return torch.randn(out.shape, generator=generator).to(device)
