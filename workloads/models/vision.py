"""Any torchvision classifier as a profbench model factory, with no structure declared: its
layers are found (workloads/models/parts.py ``find_structure``), as a user's model that
declares none would have them.

    runs:
      vit: {workload: model, factory: "workloads.models.vision:make",
            kwargs: {arch: vit_b_16}, batch: 64, mode: train, dtype: bf16}

``arch`` is a builder of ``torchvision.models`` (``vit_b_16``, ``resnet50``, ...); other
keyword arguments go to it (a small ViT for a CPU test: ``arch: VisionTransformer`` with
``patch_size``, ``num_layers``, ``num_heads``, ``hidden_dim``, ``mlp_dim``). Needs
torchvision: ``pip install -e '.[models]'``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from workloads.models.parts import import_torchvision

# The batch maker's seed: every call, and every run, sees the same images and labels.
SEED = 0
# builders whose models take the image size (a ViT's position embeddings depend on it)
SIZED = ("vit", "VisionTransformer", "swin")


def image_batches(image_size: int, num_classes: int
                  ) -> Callable[[int, torch.device], tuple[torch.Tensor, torch.Tensor]]:
    """A batch maker of random NCHW float32 images and labels, drawn on the CPU so the batch
    is the same on every device (profbench converts it to channels-last when the run asks,
    and autocast picks the dtype)."""

    def make_batch(batch_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(SEED)
        images = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
        labels = torch.randint(0, num_classes, (batch_size,), generator=generator)
        return images.to(device), labels.to(device)

    return make_batch


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


def make(arch: str = "vit_b_16", image_size: int = 224, num_classes: int = 1000,
         **model_kwargs: Any) -> tuple[torch.nn.Module, Any, Any]:
    """torchvision's ``arch`` with random weights, random images of ``image_size``."""
    try:
        models = import_torchvision().models
    except ImportError as err:
        raise ImportError("workloads.models.vision needs torchvision: "
                          "pip install -e '.[models]'") from err
    builder = getattr(models, arch, None)
    if not callable(builder):
        raise ValueError(f"torchvision.models has no model {arch!r}")
    if arch.startswith(SIZED):
        model_kwargs.setdefault("image_size", image_size)
    if arch[:1].islower():
        model_kwargs.setdefault("weights", None)
    model = builder(num_classes=num_classes, **model_kwargs)
    return model, image_batches(image_size, num_classes), classification_loss
