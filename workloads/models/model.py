"""``workload: model``: your own PyTorch model, named by its factory, through profbench's step.

    runs:
      my_cnn: {workload: model, factory: "path/to/my_cnn.py:make", kwargs: {width: 64},
               batch: 32, mode: train, dtype: bf16}

The factory returns the model, a batch maker and a loss (workloads/models/parts.py);
profbench owns the step around them, so dtype, torch.compile (``compile_blocks`` over the
structure's layers), ``cuda_graph: step``, the AdamW variants, the SDPA backend, ``ops`` and
DDP/FSDP (``parallel``, train only; FSDP shards each layer, then the root) apply as to the
built-in GPT. Each module down to ``module_depth`` gets an NVTX range in forward and in
backward (workloads/module_ranges.py); the analysis turns them into the run's module table.
FLOPs come from PyTorch's FlopCounterMode on one step before the warm-up.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from workloads import factory_check
from workloads.float8 import Recipe
from workloads.models import gpt

# What a job of a model reserves on a cluster unless the run says (host MB, minutes).
DEFAULT_NEEDS = (16000, 20)


def _as_gpt(name: str) -> Any:
    """The GPT's option ``name`` (default and help): the distributed step is the same."""
    option = gpt.Options.__dataclass_fields__[name]
    return field(default=option.default, metadata=option.metadata)


@dataclass
class Options:
    factory: str = field(metadata={"help": "the factory: 'package.module:function' or "
                                   "'path/to/file.py:function' (docs/workloads.md)"})
    kwargs: dict = field(default_factory=dict,
                         metadata={"help": "keyword arguments of the factory"})
    batch: int = field(default=1, metadata={"help": "batch size given to the batch maker",
                                            "minimum": 1})
    mode: Literal["forward", "forward_backward", "train"] = "forward"
    optimizer: Literal["adamw_foreach", "adamw_fused", "adamw_master"] = field(
        default="adamw_foreach", metadata={"help": "train only: PyTorch's multi-tensor AdamW, "
                                           "its fused kernel, or the flat master-weight AdamW"})
    channels_last: bool = field(default=False, metadata={
        "help": "the model's weights and its 4-D inputs in channels-last memory format"})
    cudnn_benchmark: bool = field(default=False, metadata={
        "help": "let cuDNN time its algorithms for each convolution shape and keep the "
                "fastest (torch.backends.cudnn.benchmark)"})
    module_depth: int | None = field(default=None, metadata={
        "help": "NVTX ranges for every module path of at most this many components, in "
                "forward and backward: the module table's rows (0: none; default: one below "
                "the layers, to their sublayers, else 3)", "minimum": 0})
    layers: str = field(default="", metadata={
        "help": "'|'-separated globs of the module paths that are layers (e.g. 'layers.*'); "
                "default: the factory's structure"})
    sublayers: str = field(default="", metadata={
        "help": "'|'-separated globs of a layer's parts by their last name (e.g. "
                "'attn|ffn|ln*'); default: the factory's structure"})
    compile_blocks: Literal["each", "once", "regional"] = field(default="each", metadata={
        "help": "with compile: each = the whole model in one compiled graph; once = the "
                "layers' forward is one nested compile region, compiled in the first layer and "
                "reused by the others (the structure's layers, all of one class); regional = "
                "each layer compiled on its own, the rest eager"})
    checkpoint: Literal["none", "layers"] = field(default="none", metadata={
        "help": "activation checkpointing: layers = each of the structure's layers keeps only "
                "its input and runs its forward again in backward (torch.utils.checkpoint, "
                "non-reentrant), trading step time for activation memory"})
    float8: Recipe = _as_gpt("float8")
    parallel: Literal["none", "ddp", "fsdp"] = _as_gpt("parallel")
    gpus: int = _as_gpt("gpus")
    bucket_cap_mb: float = _as_gpt("bucket_cap_mb")
    reshard_after_forward: bool = _as_gpt("reshard_after_forward")


def needs(options: Options) -> tuple[float, float]:
    """Host MB and minutes of one job: a factory's model is not known before it runs."""
    return DEFAULT_NEEDS


def check(options: Options) -> tuple[str, str] | None:
    """(key, problem) before any job starts: what the factory's source shows is wrong (read,
    not imported: fast), then it must import, be callable and take the run's kwargs
    (workloads/factory_check.py)."""
    problem = factory_check.source_problem(options.factory, options.kwargs)
    if problem is not None:
        return problem
    try:
        fn = load_factory(options.factory)
    except FactoryError as err:
        return "factory", str(err)
    return factory_check.signature_problem(fn, options.kwargs)


class FactoryError(ValueError):
    """A factory that cannot be found, imported or used."""


def load_factory(spec: str) -> Any:
    """The callable named by ``module:attr`` or ``file.py:attr``."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise FactoryError(f"factory {spec!r}: expected 'package.module:function' or "
                           "'path/to/file.py:function'")
    try:
        module = _import_file(target) if target.endswith(".py") else importlib.import_module(
            target)
    except FactoryError:
        raise
    except Exception as err:  # noqa: BLE001 - any import error is the user's to see
        raise FactoryError(f"factory {spec!r}: importing {target!r} failed: "
                           f"{type(err).__name__}: {err}") from err
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise FactoryError(f"factory {spec!r}: {target!r} has no callable {attr!r}")
    return fn


def _import_file(path: str) -> Any:
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FactoryError(f"factory file {path!r} does not exist")
    name = f"profbench_factory_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    return module


def build(options: Options, run: Any) -> Any:
    """The model's step (workloads.steps.Workload) from its factory's parts."""
    from workloads.models.builder import build_model_step

    return build_model_step(options, run, load_factory(options.factory))


