"""torchvision's ResNet as a profbench model factory: image classification on random images.

    runs:
      resnet50: {workload: model, factory: "workloads.models.resnet:make", batch: 64,
                 mode: train, dtype: bf16, channels_last: true}

Each residual block (``layer1.0``, ..., ``layer4.2``) is a layer; its convolutions, batch
norms and the downsample shortcut are the sublayers. Needs torchvision:
``pip install -e '.[models]'``.
"""

from __future__ import annotations

from workloads.models.parts import ModelParts, Structure, import_torchvision
from workloads.models.vision import classification_loss, image_batches

DEPTHS = (18, 34, 50, 101, 152)


def make(depth: int = 50, image_size: int = 224, num_classes: int = 1000,
         width_per_group: int = 64) -> ModelParts:
    """ResNet-``depth`` with random weights; ``make(depth=18, image_size=32, num_classes=10)``
    is small enough for a CPU test. ``width_per_group`` (bottleneck depths 50+ only) widens
    the 3x3 convolutions: 128 is Wide ResNet."""
    if depth not in DEPTHS:
        raise ValueError(f"unknown ResNet depth {depth}; expected one of {DEPTHS}")
    if depth < 50 and width_per_group != 64:
        raise ValueError(f"ResNet-{depth} has basic blocks, which only take width_per_group 64")
    try:
        models = import_torchvision().models
    except ImportError as err:
        raise ImportError("workloads.models.resnet needs torchvision: "
                          "pip install -e '.[models]'") from err
    kwargs = {"width_per_group": width_per_group} if depth >= 50 else {}
    model = getattr(models, f"resnet{depth}")(weights=None, num_classes=num_classes, **kwargs)

    return ModelParts(
        model=model,
        make_batch=image_batches(image_size, num_classes),
        loss=classification_loss,
        # `layer?.*` matches a block (`layer1.0`) and everything inside it; the outermost
        # match wins, and a stage (`layer1`) has no dot after it, so it is no layer.
        structure=Structure(layers="layer?.*", sublayers="conv*|bn*|downsample"),
    )
