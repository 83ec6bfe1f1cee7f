"""NVTX ranges per module path, in forward and in backward: ``module:<path>`` (e.g.
``module:layers.0.attn``), for every module of ``named_modules()`` down to a depth.

Forward: a push in the module's forward pre-hook, a pop in its forward hook (the caller's
thread). Backward runs on autograd's thread, in an order only autograd knows, so the range is
opened and closed by autograd itself: pass-through ``autograd.Function`` s (the xformers
profiler's technique) around the module's outputs, whose backward opens the range when the
gradient reaches the module, and around its inputs, whose backward closes it when the gradient
leaves. These are start/end ranges (they may begin and end on different threads). A module
whose inputs need no gradient (the first ones: an embedding, a stem) has nothing to close its
range: :meth:`ModuleRanges.close_open` ends those when backward returns, when autograd has
nothing left to run.

While torch.compile traces, the hooks do nothing (no graph breaks): compiled code gets its
module paths from Inductor's provenance instead (docs/analysis.md).
"""

from __future__ import annotations

from typing import Any

import nvtx
import torch
from torch import nn

PREFIX = "module:"


def range_name(path: str) -> str:
    return f"{PREFIX}{path}"


def module_paths(model: nn.Module, depth: int) -> list[tuple[str, nn.Module]]:
    """(path, module) of every named module of at most ``depth`` path components (the root,
    whose range would be the forward pass itself, excluded); each module once."""
    return [(path, module) for path, module in model.named_modules()
            if path and path.count(".") < depth]


class _Call:
    """One forward call of a module, as its backward sees it."""

    __slots__ = ("name", "range_id", "owner")

    def __init__(self, name: str, owner: ModuleRanges) -> None:
        self.name, self.range_id, self.owner = name, None, owner

    def open(self) -> None:
        if self.range_id is None:
            self.range_id = nvtx.start_range(self.name)
            self.owner.open_calls.add(self)

    def close(self) -> None:
        if self.range_id is not None:
            nvtx.end_range(self.range_id)
            self.range_id = None
            self.owner.open_calls.discard(self)


class _OpenInBackward(torch.autograd.Function):
    """Identity on the module's outputs; its backward opens the module's range."""

    @staticmethod
    def forward(ctx: Any, call: _Call, *tensors: torch.Tensor) -> Any:
        ctx.call = call
        return tensors if len(tensors) > 1 else tensors[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        ctx.call.open()
        return (None, *grads)


class _CloseInBackward(torch.autograd.Function):
    """Identity on the module's inputs; its backward closes the module's range."""

    @staticmethod
    def forward(ctx: Any, call: _Call, *tensors: torch.Tensor) -> Any:
        ctx.call = call
        return tensors if len(tensors) > 1 else tensors[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        ctx.call.close()
        return (None, *grads)


def _grad_tensors(values: Any) -> list[torch.Tensor]:
    if isinstance(values, torch.Tensor):
        return [values] if values.requires_grad else []
    if isinstance(values, list | tuple):
        return [t for v in values for t in _grad_tensors(v)]
    if isinstance(values, dict):
        return [t for v in values.values() for t in _grad_tensors(v)]
    return []


def _replace(values: Any, swap: dict[int, torch.Tensor]) -> Any:
    if isinstance(values, torch.Tensor):
        return swap.get(id(values), values)
    if isinstance(values, tuple) and hasattr(values, "_fields"):  # a namedtuple
        return type(values)(*(_replace(v, swap) for v in values))
    if isinstance(values, list | tuple):
        return type(values)(_replace(v, swap) for v in values)
    if isinstance(values, dict):  # HF ModelOutput is a dict: keep its class
        out = values.copy() if hasattr(values, "copy") else dict(values)
        for k, v in values.items():
            out[k] = _replace(v, swap)
        return out
    return values


def _wrapped(fn: type[torch.autograd.Function], call: _Call, values: Any) -> Any:
    tensors = _grad_tensors(values)
    if not tensors:
        return values
    out = fn.apply(call, *tensors)
    out = out if isinstance(out, tuple) else (out,)
    return _replace(values, {id(t): o for t, o in zip(tensors, out, strict=True)})


class ModuleRanges:
    """The hooks of one model; ``remove()`` takes them off."""

    def __init__(self, model: nn.Module, depth: int) -> None:
        self.open_calls: set[_Call] = set()
        self.handles: list[Any] = []
        self.paths = [path for path, _ in module_paths(model, depth)]
        for path, module in module_paths(model, depth):
            self._hook(module, range_name(path))

    def _hook(self, module: nn.Module, name: str) -> None:
        calls: list[_Call] = []

        def before(_module: nn.Module, args: Any, kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                return None
            nvtx.push_range(name)
            call = _Call(name, self)
            calls.append(call)
            if not torch.is_grad_enabled():
                return None
            return _wrapped(_CloseInBackward, call, args), _wrapped(_CloseInBackward, call, kwargs)

        def after(_module: nn.Module, _args: Any, _kwargs: Any, output: Any) -> Any:
            if torch.compiler.is_compiling():
                return None
            nvtx.pop_range()
            call = calls.pop()
            if not torch.is_grad_enabled():
                return None
            return _wrapped(_OpenInBackward, call, output)

        self.handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        self.handles.append(module.register_forward_hook(after, with_kwargs=True))

    def close_open(self) -> None:
        """End the backward ranges nothing closed (modules whose inputs need no gradient)."""
        for call in list(self.open_calls):
            call.close()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
