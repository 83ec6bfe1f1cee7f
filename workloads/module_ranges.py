"""NVTX ranges per module path, in forward and in backward: ``module:<path>`` (e.g.
``module:layers.0.attn``), for every module of ``named_modules()`` down to a depth.

Forward: a push in the module's forward pre-hook, a pop in its forward hook (the caller's
thread). Backward runs on autograd's thread, in an order only autograd knows, so autograd
itself opens and closes the range: a pre-hook on the node that made each output opens it
just before autograd runs that node (not when the output's gradient is ready: a sibling's
node may run first), and a gradient hook on each input closes it when the input's gradient
is complete, i.e. the module's backward is done. Each input the module gets is its own view
of the caller's tensor, so a tensor shared with a sibling (a residual block's input, feeding
``conv1`` and ``downsample``) closes each sibling's range at its own end. Tensor hooks and
views, not pass-through ``autograd.Function`` s: a custom Function's outputs are views that
in-place ops (``ReLU(inplace=True)``) may not modify. These are start/end ranges (they may
begin and end on different threads). A module whose inputs need no gradient (an embedding,
a stem) closes its range when its parameters' gradients are all computed;
:meth:`ModuleRanges.close_open` ends what is still open when backward returns.

Activation checkpointing (``torch.utils.checkpoint``, HuggingFace's gradient checkpointing)
runs a module's forward again inside backward. A forward that starts while autograd executes a
graph (``torch._C._current_graph_task_id() != -1``, the test of PyTorch's own module tracker)
is such a recomputation: its range is ``recompute:<path>``, so neither the module's forward
time nor its calls count it. Checkpointing may stop a recomputation as soon as it has the
tensors backward needs, by raising inside a module's forward: the forward hooks are
registered with ``always_call=True`` so each push is popped all the same (else the ranges of
that module and its parents stay open into the next step). A reentrant checkpoint runs the
forward without grad and backpropagates through the recomputation: that recomputation's
hooks are what open and close the module's backward range.

While torch.compile traces, the hooks do nothing (no graph breaks): compiled code gets its
module paths from Inductor's provenance instead (docs/analysis.md). Modules inside a layer
compiled on its own get no hooks at all (:func:`module_paths`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import nvtx
import torch
from torch import nn

from workloads.structure import MODULE_RANGE_PREFIX, RECOMPUTE_RANGE_PREFIX


def recomputing() -> bool:
    """Whether a forward runs inside backward: activation checkpointing's recomputation."""
    return torch._C._current_graph_task_id() != -1


def module_paths(model: nn.Module, depth: int,
                 compiled: Sequence[nn.Module] = ()) -> list[tuple[str, nn.Module]]:
    """(path, module) of every named module of at most ``depth`` path components (the root,
    whose range would be the forward pass itself, excluded); each module once. Nothing inside
    a ``compiled`` region (each compiled on its own: ``compile_blocks`` regional or once): a
    hook there is a guard Dynamo checks per instance, so every layer would recompile the shared
    code (past ``recompile_limit``, 8, the rest run eagerly), while its paths come from
    Inductor's provenance anyway. The region's own module keeps its hooks."""
    inside = {id(m) for region in compiled for m in region.modules() if m is not region}
    return [(path, module) for path, module in model.named_modules()
            if path and path.count(".") < depth and id(module) not in inside]


class _Call:
    """One forward call of a module, as its backward sees it."""

    __slots__ = ("name", "range_id", "owner", "done", "handle")

    def __init__(self, name: str, owner: ModuleRanges) -> None:
        self.name, self.range_id, self.owner, self.done = name, None, owner, False
        self.handle: Any = None  # a hook on the module's parameters, removed once it fired

    def open(self, _grad: Any = None) -> None:
        if self.range_id is None and not self.done:
            self.range_id = nvtx.start_range(self.name)
            self.owner.open_calls.add(self)

    def close(self, _grad: Any = None) -> None:
        self.done = True
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
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


def _close_after_parameters(module: nn.Module, call: _Call) -> None:
    """A module whose inputs need no gradient (an embedding, a stem) has no input gradient to
    close its backward range: close it when its parameters' gradients are all computed, else
    a sibling's backward run after it (another embedding's) would land in it too."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return
    try:
        call.handle = torch.autograd.graph.register_multi_grad_hook(params, call.close)
    except (RuntimeError, TypeError):  # parameters autograd cannot hook (sharded): at the end
        call.handle = None


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

    def __init__(self, model: nn.Module, depth: int, compiled: Sequence[nn.Module] = ()) -> None:
        self.open_calls: set[_Call] = set()
        self.handles: list[Any] = []
        hooked = module_paths(model, depth, compiled)
        self.paths = [path for path, _ in hooked]
        for path, module in hooked:
            self._hook(module, path)

    def _hook(self, module: nn.Module, path: str) -> None:
        name, recompute_name = MODULE_RANGE_PREFIX + path, RECOMPUTE_RANGE_PREFIX + path
        calls: list[_Call] = []

        def before(_module: nn.Module, args: Any, kwargs: Any) -> Any:
            if torch.compiler.is_compiling():
                return None
            nvtx.push_range(recompute_name if recomputing() else name)
            call = _Call(name, self)
            calls.append(call)
            if not torch.is_grad_enabled():
                return None
            if not _grad_tensors((args, kwargs)):
                _close_after_parameters(module, call)
            # the gradient of the module's own view of an input is complete when its
            # backward is done
            return _own_views(args, call.close), _own_views(kwargs, call.close)

        def after(_module: nn.Module, _args: Any, _kwargs: Any, output: Any) -> None:
            if torch.compiler.is_compiling():
                return
            nvtx.pop_range()
            call = calls.pop()
            if torch.is_grad_enabled():
                # the module's backward starts when autograd runs the node that made an output
                # (not when the output's gradient is ready: a sibling's node may run first)
                for tensor in _grad_tensors(output):
                    if tensor.grad_fn is not None:
                        tensor.grad_fn.register_prehook(call.open)
                    else:
                        tensor.register_hook(call.open)

        self.handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        # always_call: a checkpoint that stops its recomputation early raises in forward
        self.handles.append(module.register_forward_hook(after, with_kwargs=True,
                                                         always_call=True))

    def close_open(self) -> None:
        """End the backward ranges nothing closed (modules whose inputs need no gradient)."""
        for call in list(self.open_calls):
            call.close()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
