"""FP8 training of a model's Linear layers (run key ``float8``), by torchao.

``float8: tensorwise | rowwise`` swaps the qualifying ``nn.Linear`` layers of the GPT or of a
``workload: model`` for torchao's ``Float8Linear`` (``torchao.float8.convert_to_float8_training``
with ``Float8LinearConfig.from_recipe_name``): each of their three GEMMs (forward, grad input,
grad weight) runs in FP8 on the tensor cores, its operands scaled and cast by kernels that
``torch.compile`` fuses. No kernel is profbench's own.

* ``tensorwise``: one dynamic scale per tensor, cuBLAS's FP8 GEMM (e4m3 forward, e5m2 for
  gradients); torchao's fastest recipe.
* ``rowwise``: one scale per row, CUTLASS's row-wise FP8 GEMM, every operand e4m3, scales
  rounded down to powers of two; more accurate, more scaling work.

Which layers qualify (:func:`qualifies`), as torchao's docs advise: both dimensions divisible
by 16 (the FP8 tensor cores' requirement), and not the model's output layer (the last Linear,
the LM head: its logits feed the loss, and torchao's example keeps it in high precision).

Refused as an ``unsupported`` row, with the reason (:func:`refusal`): no CUDA device, a GPU
below compute capability 8.9 (no FP8 tensor cores: named with its capability), a run without
``compile`` (eager FP8 pays a separate amax, scale and cast kernel for every operand of every
GEMM: torchao's recipes assume torch.compile), ``compile_blocks: once`` (the nested compile
region cannot take torchao's FP8 tensors: Inductor fails, measured on torch 2.13), and a model
with no qualifying layer (FP8 would change nothing).

What composes: ``compile_blocks`` each and regional, and the master-weight AdamW (its bf16
weight copies are the layers' ``weight`` Parameters, cast to FP8 in the forward), measured on
the CPU (tests/test_float8.py steps regional with it). Read from torchao 0.18's code: every
``dtype`` (under bf16/fp16 autocast the layer casts its input to the autocast dtype; fp32 and
fp16 outputs of the row-wise GEMM are computed in bf16 and cast back), the whole-step CUDA
graph (dynamic scaling keeps amax and scale on the device, no host sync) and DDP/FSDP2
(converted before wrapping, as torchao's docs do; the weights are all-gathered in their own
dtype).

Nothing here imports torch or torchao at import time: the pipeline reads the option's schema.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal

RECIPES = ("none", "tensorwise", "rowwise")
Recipe = Literal["none", "tensorwise", "rowwise"]
# FP8 tensor cores: Ada (8.9), Hopper (9.0) and later.
MIN_CAPABILITY = (8, 9)
# The GEMM dimensions the FP8 tensor cores take (torchao's filter checks the same).
DIM_MULTIPLE = 16
# The release the recipes were checked with (pyproject.toml's fp8 extra pins it).
TORCHAO = "0.18.0"
HELP = (
    "FP8 training of the Linear layers (torchao's float8 recipes, needs compile and a GPU "
    "of compute capability 8.9+): tensorwise = one scale per tensor, rowwise = one per "
    "row; none = off (docs/workloads.md)"
)


def option() -> Any:
    """The ``float8`` field of a workload's Options."""
    return field(default="none", metadata={"help": HELP})


def capability_refusal(name: str, capability: tuple[int, int]) -> str | None:
    """Why a GPU of this compute capability cannot run FP8 training, or None."""
    if tuple(capability) >= MIN_CAPABILITY:
        return None
    major, minor = capability
    return (
        f"float8 needs FP8 tensor cores (compute capability "
        f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or higher: Ada, Hopper, Blackwell); "
        f"{name} has compute capability {major}.{minor}"
    )


def refusal(
    recipe: str,
    device_type: str,
    compile_mode: str,
    gpu: tuple[str, tuple[int, int]] | None,
    compile_blocks: str = "each",
) -> str | None:
    """Why this run cannot train in FP8 (an ``unsupported`` row's message), or None. ``gpu``:
    the CUDA device's name and compute capability (None off CUDA)."""
    if recipe == "none":
        return None
    if recipe not in RECIPES:
        return f"float8: unknown recipe {recipe!r}; expected one of {list(RECIPES)}"
    if device_type != "cuda" or gpu is None:
        return (
            f"float8 needs a CUDA GPU with FP8 tensor cores (compute capability "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}+); this run is on the {device_type}"
        )
    reason = capability_refusal(*gpu)
    if reason is not None:
        return reason
    if compile_mode == "off":
        return (
            "float8 needs compile (e.g. compile: default): torchao's FP8 recipes rely on "
            "torch.compile to fuse the amax, scale and cast kernels around each FP8 GEMM; "
            "eager, each is a kernel of its own for every operand"
        )
    if compile_blocks == "once":
        return (
            "float8 does not compose with compile_blocks: once: torch.compile's nested compile "
            "region cannot take torchao's FP8 tensors (Inductor: 'attempting to run "
            "aten.to.dtype, this is not supported'); use compile_blocks: each or regional"
        )
    return None


def qualifies(module: Any, path: str, head: str | None) -> str | None:
    """Why the Linear at ``path`` stays in high precision, or None when it converts."""
    if path == head:
        return "output layer"
    out_features, in_features = module.weight.shape
    if in_features % DIM_MULTIPLE or out_features % DIM_MULTIPLE:
        return f"dims not divisible by {DIM_MULTIPLE}"
    return None


def output_layer(model: Any) -> str | None:
    """The path of the model's last ``nn.Linear`` (its output layer: the LM head), or None."""
    from torch import nn

    last = None
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = path
    return last


def convert(model: Any, speed: Any, device: Any, compile_blocks: str) -> dict[str, Any] | None:
    """Swap the qualifying Linear layers of ``model`` (in place) for torchao's Float8Linear with
    the recipe ``speed.float8`` (workloads.steps.Speed) under the run's ``compile_blocks``;
    before the optimizer, DDP/FSDP and compile see the model. Returns the record's ``float8``
    entry (None for ``none``); raises Unsupported with the reason when the run cannot train in
    FP8."""
    from workloads.status import Unsupported

    recipe = speed.float8
    if recipe == "none":
        return None
    gpu = None
    if device.type == "cuda":
        import torch

        gpu = (torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device))
    reason = refusal(recipe, device.type, speed.compile_mode, gpu, compile_blocks)
    if reason is not None:
        raise Unsupported(reason)
    return swap_linears(model, recipe)


def swap_linears(model: Any, recipe: str) -> dict[str, Any]:
    """torchao's conversion of the qualifying Linear layers of ``model`` (in place), without
    the device checks (it runs on any device; a GEMM needs FP8 tensor cores). Returns the
    record's ``float8`` entry; raises Unsupported when torchao is missing or no layer
    qualifies."""
    from workloads.status import Unsupported

    try:
        import torchao
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as err:
        raise Unsupported(
            f"float8 needs torchao (pip install -e '.[fp8]': torchao=={TORCHAO}): {err}"
        ) from err
    from torch import nn

    head = output_layer(model)
    kept: dict[str, list[str]] = {}
    converted: list[str] = []
    shapes: set[tuple[int, int]] = set()  # (in, out) features: each GEMM's K and N

    def keep_or_convert(module: nn.Module, path: str) -> bool:
        why = qualifies(module, path, head)
        if why is None:
            converted.append(path)
            shapes.add((module.in_features, module.out_features))
        else:
            kept.setdefault(why, []).append(path)
        return why is None

    convert_to_float8_training(
        model, module_filter_fn=keep_or_convert, config=Float8LinearConfig.from_recipe_name(recipe)
    )
    if not converted:
        raise Unsupported(
            f"float8: no nn.Linear of the model qualifies (kept in high precision: "
            f"{kept or 'the model has none'}; a layer of another class, e.g. transformers' "
            "Conv1D in GPT-2, is not converted by torchao)"
        )
    return {
        "recipe": recipe,
        "torchao": torchao.__version__,
        "converted": len(converted),
        "shapes": sorted(shapes),
        "kept": kept,
    }
