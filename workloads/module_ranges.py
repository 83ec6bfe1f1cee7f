"""NVTX ranges per module path, in forward and in backward: ``module:<path>`` (e.g.
``module:layers.0.attn``), for every module of ``named_modules()`` down to a depth.

Forward: a push in the module's forward pre-hook, a pop in its forward hook (the caller's
thread). Backward runs on autograd's thread, in an order only autograd knows, so autograd
itself opens and closes the range: a gradient hook on each output opens it when the gradient
reaches the module, one on each input closes it when the input's gradient is complete, i.e.
the module's backward is done. Each input the module gets is its own view of the caller's
tensor, so a tensor shared with a sibling (a residual block's input, feeding ``conv1`` and
``downsample``) closes each sibling's range at its own end. Tensor hooks and views, not
pass-through ``autograd.Function`` s: a custom Function's outputs are views that in-place ops
(``ReLU(inplace=True)``) may not modify. These are
start/end ranges (they may begin and end on different threads). A module whose inputs need no
gradient (the first ones: an embedding, a stem) has nothing to close its range:
:meth:`ModuleRanges.close_open` ends those when backward returns, when autograd has nothing
left to run.

While torch.compile traces, the hooks do nothing (no graph breaks): compiled code gets its
module paths from Inductor's provenance instead (docs/analysis.md).
"""

from __future__ import annotations

from typing import Any

import nvtx
import torch
from torch import nn

from workloads.models.parts import MODULE_RANGE_PREFIX


def module_paths(model: nn.Module, depth: int) -> list[tuple[str, nn.Module]]:
    """(path, module) of every named module of at most ``depth`` path components (the root,
    whose range would be the forward pass itself, excluded); each module once."""
    return [(path, module) for path, module in model.named_modules()
            if path and path.count(".") < depth]


class _Call:
    """One forward call of a module, as its backward sees it."""

    __slots__ = ("name", "range_id", "owner", "done")

    def __init__(self, name: str, owner: ModuleRanges) -> None:
        self.name, self.range_id, self.owner, self.done = name, None, owner, False

    def open(self, _grad: torch.Tensor | None = None) -> None:
        if self.range_id is None and not self.done:
            self.range_id = nvtx.start_range(self.name)
            self.owner.open_calls.add(self)

    def close(self, _grad: torch.Tensor | None = None) -> None:
        self.done = True
        if self.range_id is not None:
            nvtx.end_range(self.range_id)
            self.range_id = None
            self.owner.open_calls.discard(self)


def _own_views(values: Any, hook: Any) -> Any:
    """``values`` with every tensor that needs a gradient replaced by a view of it whose
    gradient hook is ``hook``: the view is this module's alone, so its gradient is complete
    when this module's backward is (a tensor shared with a sibling, as a residual block's
    input, completes only after both). A view costs no kernel."""
    if isinstance(values, torch.Tensor):
        if not values.requires_grad:
            return values
        view = values.view_as(values)
        view.register_hook(hook)
        # an in-place op on the view (ReLU(inplace=True)) rebases it and its hook is lost:
        # the caller's tensor closes the range then, when its gradient is complete
        values.register_hook(hook)
        return view
    if isinstance(values, tuple) and hasattr(values, "_fields"):  # a namedtuple
        return type(values)(*(_own_views(v, hook) for v in values))
    if isinstance(values, list | tuple):
        return type(values)(_own_views(v, hook) for v in values)
    if isinstance(values, dict) and type(values) is dict:
        return {k: _own_views(v, hook) for k, v in values.items()}
    return values


def _grad_tensors(values: Any) -> list[torch.Tensor]:
    if isinstance(values, torch.Tensor):
        return [values] if values.requires_grad else []
    if isinstance(values, list | tuple):
        return [t for v in values for t in _grad_tensors(v)]
    if isinstance(values, dict):
        return [t for v in values.values() for t in _grad_tensors(v)]
    return []


class ModuleRanges:
    """The hooks of one model; ``remove()`` takes them off."""

    def __init__(self, model: nn.Module, depth: int) -> None:
        self.open_calls: set[_Call] = set()
        self.handles: list[Any] = []
        hooked = module_paths(model, depth)
        self.paths = [path for path, _ in hooked]
        for path, module in hooked:
            self._hook(module, MODULE_RANGE_PREFIX + path)

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
            # the gradient of the module's own view of an input is complete when its
            # backward is done
            return _own_views(args, call.close), _own_views(kwargs, call.close)

        def after(_module: nn.Module, _args: Any, _kwargs: Any, output: Any) -> None:
            if torch.compiler.is_compiling():
                return
            nvtx.pop_range()
            call = calls.pop()
            if torch.is_grad_enabled():
                # the gradient reaching an output starts the module's backward
                for tensor in _grad_tensors(output):
                    tensor.register_hook(call.open)

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
