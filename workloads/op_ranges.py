"""PyTorch's own op ranges around the measured steps (``--op_ranges on|shapes``): the source
of the operator table (``analysis/metrics/ops.py``, docs/analysis.md "Operator table").

* CUDA device: ``torch.autograd.profiler.emit_nvtx(record_shapes=...)``, PyTorch's NVTX
  observer: one push/pop range per op (every ``aten::`` op including composite ones such as
  ``aten::linear``, autograd nodes such as ``MmBackward0``, ``record_function`` labels such
  as ``Optimizer.step#AdamW.step``) on the thread that runs it (backward: autograd's
  thread), named ``<op>[, seq = N], op_id = M[, sizes = [...], input_op_ids = [...]]``. Nsight
  Systems 2025's ``--pytorch=autograd-nvtx`` injects the same context manager, but around the
  whole process (model build and warm-up included), and 2024.2.3 has no such option; here it
  covers the measured steps only, with any nsys.
* CPU device: a PyTorch build without CUDA has no NVTX observer (``emit_nvtx`` raises), so a
  ``TorchDispatchMode`` pushes ranges in the same name format for every op that reaches the
  dispatcher below autograd (``aten::mm``, ``aten::add_``, ...; composite ops and autograd
  nodes have no range of their own there). The table is built the same way from either.

The ranges cost time on the host (measured per run: docs/analysis.md), so they are a second,
opt-in capture of the run; the lean capture and the timing processes never have them.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import nvtx
import torch
from torch.utils._python_dispatch import TorchDispatchMode

OP_RANGES = ("off", "on", "shapes")


def op_ranges(mode: str, device: torch.device) -> contextlib.AbstractContextManager:
    """A context manager that emits one NVTX range per PyTorch op while it is open."""
    if mode not in OP_RANGES:
        raise ValueError(f"unknown op_ranges {mode!r}; expected one of {OP_RANGES}")
    if mode == "off":
        return contextlib.nullcontext()
    shapes = mode == "shapes"
    if device.type == "cuda":
        return torch.autograd.profiler.emit_nvtx(record_shapes=shapes)
    return DispatchOpRanges(record_shapes=shapes)


class DispatchOpRanges(TorchDispatchMode):
    """emit_nvtx's ranges for a CPU build: ``aten::<op>, op_id = N[, sizes = [...]]``."""

    def __init__(self, record_shapes: bool = False) -> None:
        super().__init__()
        self.record_shapes = record_shapes
        self._ids = itertools.count(1)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        name = f"{func._schema.name}, op_id = {next(self._ids)}"
        if self.record_shapes:
            name += f", sizes = {input_sizes(args)}"
        nvtx.push_range(name)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            nvtx.pop_range()


def input_sizes(args: tuple) -> str:
    """emit_nvtx's ``sizes`` field: one shape per tensor input (a list of tensors gives one
    per tensor), ``[]`` for anything else."""
    shapes: list[str] = []
    for arg in args:
        items = arg if isinstance(arg, list | tuple) and arg and all(
            isinstance(a, torch.Tensor) for a in arg) else [arg]
        for item in items:
            shapes.append(str(list(item.shape)) if isinstance(item, torch.Tensor) else "[]")
    return "[" + ", ".join(shapes) + "]"
