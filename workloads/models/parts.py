"""What a model factory returns: the model, a batch maker and a loss (docs/workloads.md).

A factory is any callable ``make(**kwargs)`` named in a config (``factory: pkg.mod:make`` or
``factory: path/to/file.py:make``); profbench owns the step around what it returns, so every
knob (dtype, torch.compile, CUDA graphs, the AdamW variants, DDP/FSDP, op ranges) applies.

It returns a :class:`ModelParts`, or the tuple ``(model, make_batch, loss)``:

* ``model``: an ``nn.Module`` on any device (profbench moves it);
* ``make_batch(batch_size, device)``: ``(inputs, targets)``; ``inputs`` is a tensor (called as
  ``model(inputs)``), a tuple (``model(*inputs)``) or a dict (``model(**inputs)``);
* ``loss(output, targets)``: a scalar tensor, or ``None`` for a forward-only model.

A :class:`ModelParts` may add the model's ``structure`` (its layers and sublayers), what one
sample counts for in the throughput (``items_per_sample``) and whether its buffers are
constant (``constant_buffers``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# Where they are defined (below this folder: the step builders and the analysis use them);
# a factory imports them from here.
from workloads.structure import (  # noqa: F401
    MODULE_PATH_LINE,
    MODULE_RANGE_PREFIX,
    RECOMPUTE_LINE,
    RECOMPUTE_RANGE_PREFIX,
    Structure,
    find_structure,
)

if TYPE_CHECKING:
    from torch import nn

Batch = tuple[Any, Any]

@dataclass
class ModelParts:
    model: nn.Module
    make_batch: Callable[..., Batch]
    loss: Callable[[Any, Any], Any] | None = None
    structure: Structure | None = None
    # what one batch element counts for in the throughput column (tokens of a language model)
    items_per_sample: int = 1
    # True when no forward changes a buffer (RoPE tables do not; BatchNorm's running
    # statistics do): DDP then skips broadcasting rank 0's buffers before each forward
    constant_buffers: bool = False


_TORCHVISION_SCHEMAS: Any = None  # the torch.library that keeps the schemas below defined


def import_torchvision() -> Any:
    """``import torchvision``, also beside a CPU-only torch build.

    PyPI's Linux torchvision wheels are built for the CUDA torch build. Beside a CPU-only one
    (``torch==X+cpu``) their C++ operators do not load, and the import then fails on the fake
    kernels torchvision registers for two of them, ``nms`` and ``qnms``, whether it has them
    or not (pytorch/vision#9085). transformers imports torchvision whenever it is installed,
    so it fails too. Defining those two operators' schemas lets the import through; the C++
    operators (nms, roi_align, ...) stay unavailable, and no example model uses them.
    """
    global _TORCHVISION_SCHEMAS
    import importlib
    import sys

    try:
        return importlib.import_module("torchvision")
    except RuntimeError as err:
        if "torchvision::nms" not in str(err) or _TORCHVISION_SCHEMAS is not None:
            raise
    import torch

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    _TORCHVISION_SCHEMAS = torch.library.Library("torchvision", "DEF")  # noqa: TOR901
    for op in ("nms", "qnms"):
        _TORCHVISION_SCHEMAS.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) "
                                    "-> Tensor")
    return importlib.import_module("torchvision")


def checkpoint_layers(layers: list[Any]) -> None:
    """Activation checkpointing of each layer (``checkpoint: layers``): its forward runs under
    ``torch.utils.checkpoint`` (non-reentrant, as PyTorch recommends), so backward recomputes
    it from the layer's input instead of keeping its activations. Like HuggingFace's
    gradient checkpointing, the layer's ``forward`` is checkpointed, not its call: its own
    hooks (FSDP2's, the module ranges) stay outside and run once. Each layer becomes an
    instance of a subclass of its class; without gradients the forward runs as it is."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if not layers:
        raise ValueError("checkpoint layers needs layers: set `layers` or return a structure "
                         "from the factory (or let profbench find them)")
    made: dict[type, type] = {}
    for layer in layers:
        cls = type(layer)
        if cls not in made:
            inner = cls.forward

            def forward(self: Any, *args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
                if not torch.is_grad_enabled():
                    return _inner(self, *args, **kwargs)
                return checkpoint(_inner, self, *args, use_reentrant=False, **kwargs)

            made[cls] = type(f"{cls.__name__}Checkpointed", (cls,), {
                "forward": forward, "__module__": cls.__module__})
        layer.__class__ = made[cls]


def compile_once(layers: list[Any]) -> None:
    """Make the layers' forward one nested compile region (``compile_blocks: once``):
    torch.compile traces and compiles it in the first layer and reuses that code in every
    other one, forward and backward, as the GPT's ``BlockCompiledOnce``. Each layer becomes
    an instance of one subclass of its class whose forward is the marked region, so the
    region is one function for all of them. Eager, nothing changes."""
    import torch

    from workloads.status import Unsupported

    if not layers:
        raise ValueError("compile_blocks once needs layers: set `layers` or return a "
                         "structure from the factory")
    classes = sorted({type(layer) for layer in layers}, key=lambda c: c.__qualname__)
    if len(classes) > 1:
        names = ", ".join(c.__qualname__ for c in classes)
        raise Unsupported(f"compile_blocks once compiles one layer for all: the layers are "
                          f"of {len(classes)} classes ({names}); use compile_blocks each or "
                          "regional, or name layers of one class in `layers`")
    cls = classes[0]
    region = type(f"{cls.__name__}CompiledOnce", (cls,), {
        "forward": torch.compiler.nested_compile_region(cls.forward),
        "__module__": cls.__module__})
    for layer in layers:
        layer.__class__ = region
