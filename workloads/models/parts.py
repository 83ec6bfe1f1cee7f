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

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the analysis reads Structure without torch
    from torch import nn

Batch = tuple[Any, Any]

# What a capture of a model workload carries for the analysis (analysis/metrics/modules.py):
# the NVTX range of a module (workloads/module_ranges.py), and the line a compiled node's stack
# trace gets with its module path (workloads/steps.py: track_module_paths).
MODULE_RANGE_PREFIX = "module:"
# a module's forward run again inside backward by activation checkpointing
RECOMPUTE_RANGE_PREFIX = "recompute:"
MODULE_PATH_LINE = "[profbench module {}]"
# ... and the line of a forward node recomputed in backward (compiled checkpointing)
RECOMPUTE_LINE = "[profbench recompute]"


@dataclass(frozen=True)
class Structure:
    """Which module paths are layers and sublayers, as ``|``-separated globs over
    ``named_modules()`` paths: ``layers="layers.*"`` makes ``layers.0``, ``layers.1``, ... the
    layers (the outermost match wins), ``sublayers="attn|ffn|ln*"`` names a layer's parts by
    their last path component. Empty: no layers (the module table still lists modules).
    ``found``: made by :func:`find_structure`, not declared."""

    layers: str = ""
    sublayers: str = ""
    found: bool = False

    def layer_of(self, path: str) -> str | None:
        """The outermost layer path that ``path`` is, or lies inside; None outside layers."""
        if not self.layers:
            return None
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if _matches(prefix, self.layers):
                return prefix
        return None

    def is_layer(self, path: str) -> bool:
        """Whether ``path`` is a layer itself (``layers.0``, not ``layers.0.attn``)."""
        return bool(path) and self.layer_of(path) == path

    def sublayer_of(self, path: str) -> str | None:
        """The sublayer name (the first component below the layer that matches
        ``sublayers``) of a path inside a layer; None otherwise."""
        layer = self.layer_of(path)
        if layer is None or not self.sublayers or path == layer:
            return None
        for part in path[len(layer) + 1:].split("."):
            if _matches(part, self.sublayers):
                return part
        return None

    def layer_modules(self, model: nn.Module) -> list[nn.Module]:
        """The model's layers (the outermost paths matching ``layers``), in
        ``named_modules()`` order."""
        return [module for path, module in model.named_modules() if self.is_layer(path)]


def find_structure(model: nn.Module) -> Structure:
    """The layers of a model that declares none: the ``nn.ModuleList`` / ``nn.Sequential``
    containers whose children (two or more, each with parts of its own) share one class, the
    outermost such; of those, every one whose children are of the class of the container
    holding the most parameters (ViT's ``encoder.layers``, a HuggingFace model's ``h`` or
    ``layers``, ResNet's four stages of blocks). The sublayers are the layers' children by
    name (``self_attention``, ``mlp``, ``ln_1``...). No such container: no layers."""
    from torch import nn

    found = []
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList | nn.Sequential):
            continue
        kids = list(module.children())
        classes = {type(k) for k in kids}
        if len(kids) >= 2 and len(classes) == 1 and any(True for _ in kids[0].children()):
            found.append((path, module, classes.pop()))
    outer = [f for f in found if not any(f[0] != o[0] and (not o[0] or f[0].startswith(
        o[0] + ".")) for o in found)]
    if not outer:
        return Structure(found=True)
    largest = max(outer, key=lambda f: sum(p.numel() for p in f[1].parameters()))
    chosen = [f for f in outer if f[2] is largest[2]]
    layers = "|".join(f"{path}.*" if path else "*" for path, _, _ in chosen)
    names = {name for _, container, _ in chosen for layer in container.children()
             for name, _ in layer.named_children()}
    return Structure(layers=layers, sublayers="|".join(sorted(names)), found=True)


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


def _matches(name: str, globs: str) -> bool:
    return any(fnmatch.fnmatchcase(name, g.strip()) for g in globs.split("|") if g.strip())


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
