"""The step around a workload's model: its phase ranges, compilation and the attention
workloads' builders (the models' builder, GPT included, is workloads/models/builder.py).

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
from torch import nn

from workloads import flops
from workloads.attention import Attention, attention_core, sdpa_backend_context
from workloads.attention import sdpa_unsupported_reason as _sdpa_reason
from workloads.device import autocast, compute_dtype
from workloads.graphs import CUDA_GRAPH_MODES
from workloads.nvtx_ranges import rng
from workloads.optim import MasterAdamW
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
    # a model workload's layers and sublayers (workloads/structure.py), for the record
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
    # the models' layers compiled as one graph, once for all, or each alone (models/builder.py)
    compile_blocks: str = "each"
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


# Inductor options of a model whose block is a nested compile region reused by every layer
# (workloads/models/parts.py: compile_once). Without them torch (2.13 on CPU, measured) reuses a
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


# A version in the pass's uuid keeps Inductor's cache honest (MODULE_PATH_LINE: structure.py).
_MODULE_PATHS_UUID = "profbench-module-paths-4"
# forward nodes' module paths by stack trace, for the backward graph compiled after them
_PATH_BY_TRACE: dict[str, str] = {}


def track_module_paths() -> None:
    """Make Inductor keep, for every compiled node, the path of the module it came from:
    a post-grad pass appends it to the node's stack trace (``nn_module_stack`` in forward,
    ``fwd_nn_module_stack`` in backward), which provenance tracking records for each kernel
    and Inductor's cache keeps with the compiled code, so a capture that loads the timing
    processes' code still has it. A forward node that AOTAutograd's partitioner put in the
    backward graph (activation checkpointing's recomputation, or its own rematerialization)
    gets a second line, ``RECOMPUTE_LINE``; a node of an ATen op gets its op's name,
    ``NODE_OP_LINE``, which tells an extern kernel's own nodes from those fused into its
    inputs."""
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    from workloads.structure import MODULE_PATH_LINE, NODE_OP_LINE, RECOMPUTE_LINE

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
                    if isinstance(node.target, torch._ops.OpOverload):
                        lines.append(NODE_OP_LINE.format(node.target))
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
                out = first_tensor(out)
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




def call_model(model: Any, inputs: Any) -> Any:
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, tuple | list):
        return model(*inputs)
    return model(inputs)


def first_tensor(output: Any, needs_grad: bool = True) -> torch.Tensor:
    """The output itself, or its first tensor (that needs a gradient) of a tuple or dict."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output
    for v in values:
        if isinstance(v, torch.Tensor) and (v.requires_grad or not needs_grad):
            return v
    raise ValueError("the model's output holds no tensor that needs a gradient")
