"""A model's layers and sublayers, and the names its capture carries for the analysis.

:class:`Structure` says which module paths are layers and sublayers (declared by a factory,
by a run's ``layers`` / ``sublayers``, or found by :func:`find_structure`); the step
builders (workloads/models/builder.py), DDP/FSDP (workloads/parallel.py) and the analysis
(analysis/metrics/modules.py) read it. No torch at import: the analysis imports this.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

# What a capture of a model workload carries for the analysis (analysis/metrics/modules.py):
# the NVTX range of a module (workloads/module_ranges.py), and the line a compiled node's stack
# trace gets with its module path (workloads/models/builder.py: track_module_paths).
MODULE_RANGE_PREFIX = "module:"
# a module's forward run again inside backward by activation checkpointing
RECOMPUTE_RANGE_PREFIX = "recompute:"
MODULE_PATH_LINE = "[profbench module {}]"
# ... and the line of a forward node recomputed in backward (compiled checkpointing)
RECOMPUTE_LINE = "[profbench recompute]"
# ... and the ATen op of the node (``aten.convolution_backward.default``): an extern kernel's
# provenance also holds the nodes fused into its inputs, of other modules (a batch norm's
# backward before a convolution's), so the analysis keeps those of the op it runs
NODE_OP_LINE = "[profbench op {}]"


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


def _matches(name: str, globs: str) -> bool:
    return any(fnmatch.fnmatchcase(name, g.strip()) for g in globs.split("|") if g.strip())
