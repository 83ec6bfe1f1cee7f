"""Builds one workload (model + fixed inputs + a step function) from CLI-level settings.

A step is one forward, forward+backward or training iteration; :mod:`workloads.runner`
times it. Inputs are generated once from a seeded CPU generator (same data on every device)
and reused by every step, so a `train` run always fits the same batch.

Compilation (``compile`` != off) wraps the model and the loss separately, so the phase ranges
(forward_pass, loss_computation, backward_pass, optimizer_step) stay outside compiled code.
With ``cuda_graph: step`` the whole step is captured into one CUDA graph after it is built
(workloads/graphs.py); the compiled regions then use mode ``default`` (graphs do not nest).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

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


@dataclass(frozen=True)
class Speed:
    """The settings that change how fast, not what, a workload computes."""

    compile: str = "off"
    sdpa_backend: str = "auto"
    optimizer: str = "adamw_foreach"
    cuda_graph: str = "off"
    compile_blocks: str = "each"  # GPT only: "once" compiles one block for all layers (gpt.py)

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
                out.backward(grad_output.to(out.dtype))
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


