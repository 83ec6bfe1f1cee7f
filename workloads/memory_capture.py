"""The memory capture (``--memory_out PATH``): where a run's memory goes, in its own process.

After the run's warm-up and measured steps (which this capture leaves as they are), three more
steps, each instrumented by what PyTorch maintains:

1. **The allocator's history** (``torch.cuda.memory._record_memory_history`` and its
   ``_snapshot()``, CUDA only): every allocation and free of one step, in order. Replayed from
   the bytes allocated when the step starts, it gives the memory curve, the peak (checked
   against ``torch.cuda.max_memory_allocated`` of the same step) and the blocks alive at the
   peak. Each live block gets a category from the tensors that own it: parameters, gradients,
   optimizer state (the model and optimizer the step closes over), activations (tensors saved
   for backward, seen by ``torch.autograd.graph.saved_tensors_hooks`` during the same step),
   temporaries (allocated in the step, none of these) and other (alive before the step: inputs,
   workspaces). The same step records, at the end of each phase range (forward, loss, backward,
   optimizer), the bytes alive and the peak since the phase before, and per module path the
   bytes it saved for backward.
2. **MemTracker** (``torch.distributed._tools.mem_tracker``): per module its peak bytes by
   category in forward and backward (eager code; compiled code allocates past the dispatcher).
3. **The profiler** (``torch.profiler.profile(profile_memory=True)``): every allocation and
   free with the ATen op that made it, for the operator memory table (TensorBoard's columns:
   allocation count, allocation size, size increase, self and total). Works on the CPU too.

CUDA graphs: a replay allocates nothing (its memory is the graph's private pool, allocated at
capture), so a whole-step graph run is captured on its eager step (the same ops the graph
recorded) and the record says what the private pools hold (``cuda_graph_pool_bytes``).
"""

from __future__ import annotations

import bisect
import contextlib
import time
import types
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from workloads import nvtx_ranges
from workloads.device import synchronize

PHASES = ("forward_pass", "loss_computation", "backward_pass", "optimizer_step")
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
GRAPH_NOTE = (
    "whole-step CUDA graph: the step the graph records, captured before the graph; a replay "
    "allocates nothing, its memory is the graph's private pool (cuda_graph_pool_bytes)"
)
# the allocator's history of one step: far more entries than any step here makes
MAX_ENTRIES = 2_000_000
# wrappers whose real module is one attribute down (torch.compile, DDP/FSDP, checkpointing)
_WRAPPER_PARTS = ("_orig_mod", "module", "_checkpoint_wrapped_module")


def capture(
    step: Callable[[], Any],
    device: torch.device,
    graph: dict[str, Any] | None = None,
    compiled: bool = False,
) -> dict[str, Any]:
    """The memory record of ``step`` (an eager or compiled step, never a graph replay).
    ``compiled``: torch.compile'd code allocates below the dispatcher, where MemTracker
    cannot see it (and a dispatch mode around it could recompile): no MemTracker step."""
    owners = find_owners(step)
    record: dict[str, Any] = {"device": device.type, "notes": []}
    if device.type == "cuda":
        record.update(allocator_view(step, device, owners, hooks=not compiled))
        record["cuda_graph_pool_bytes"] = graph_pool_bytes(device)
        if graph:
            record["notes"].append(GRAPH_NOTE)
    elif not compiled:  # hooks around compiled code would change what Dynamo traced
        record.update(saved_view(step, owners))
    if device.type != "cuda":
        record["notes"].append(
            "the memory curve, the peak and the bytes by category need "
            "CUDA (the CUDA caching allocator's history)"
        )
    record["analytic"] = analytic_bytes(owners, device)
    record["modules_peak"] = (
        {"error": "compiled code allocates below the dispatcher: MemTracker sees eager code"}
        if compiled
        else module_peaks(step, owners)
    )
    record["ops"] = op_memory(step, device)
    return record


# --- what the step closes over: its model(s) and optimizer ----------------------------------


def find_owners(step: Callable[[], Any]) -> dict[str, list[Any]]:
    """The modules and optimizers reachable from ``step``'s closure (and the closures of the
    functions it closes over): the step's model and optimizer, whatever workload built it."""
    found: dict[str, list[Any]] = {"modules": [], "optimizers": []}
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if id(obj) in seen or depth > 6:
            return
        seen.add(id(obj))
        if isinstance(obj, nn.Module):
            found["modules"].append(obj)
        elif isinstance(obj, torch.optim.Optimizer) or _is_flat_optimizer(obj):
            found["optimizers"].append(obj)
        elif isinstance(obj, types.FunctionType | types.MethodType | functools_partial()):
            for inner in _closed_over(obj):
                visit(inner, depth + 1)
        elif isinstance(obj, list | tuple):
            for item in obj[:64]:
                visit(item, depth + 1)

    visit(step, 0)
    roots = [
        m
        for m in found["modules"]
        if not any(m is not o and _contains(o, m) for o in found["modules"])
    ]
    return {"modules": roots, "optimizers": found["optimizers"]}


def functools_partial() -> type:
    import functools

    return functools.partial


def _closed_over(fn: Any) -> list[Any]:
    if isinstance(fn, types.MethodType):
        return [fn.__self__, fn.__func__]
    if isinstance(fn, functools_partial()):
        return [fn.func, *fn.args, *fn.keywords.values()]
    inner = [c.cell_contents for c in (fn.__closure__ or ()) if _filled(c)]
    wrapped = getattr(fn, "__wrapped__", None) or getattr(fn, "_torchdynamo_orig_callable", None)
    return inner + ([wrapped] if wrapped is not None else [])


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _contains(outer: nn.Module, inner: nn.Module) -> bool:
    return any(m is inner for m in outer.modules())


def _is_flat_optimizer(obj: Any) -> bool:
    """workloads/optim.py's MasterAdamW: flat fp32 buffers, not a torch Optimizer."""
    return hasattr(obj, "exp_avg") and hasattr(obj, "master") and hasattr(obj, "hyper")


def optimizer_tensors(optimizer: Any) -> list[torch.Tensor]:
    """The tensors an optimizer keeps between steps (its states, master weights, flat
    gradient buffers)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return [
            v
            for state in optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor)
        ]
    return [v for v in vars(optimizer).values() if isinstance(v, torch.Tensor)]


def analytic_bytes(owners: dict[str, list[Any]], device: torch.device) -> dict[str, int]:
    """Parameters, gradients and optimizer state counted from the tensors themselves on the
    device (each storage once; bytes of a parameter's or a gradient's storage count there,
    not again as the optimizer's: ``adamw_master``'s fp32 parameters live inside its master
    weights; a CPU step count is not device memory)."""
    params = {id(p): p for m in owners["modules"] for p in m.parameters()}
    grads = [p.grad for p in params.values() if p.grad is not None]
    opt = [
        t
        for o in owners["optimizers"]
        for t in optimizer_tensors(o)
        if t.device.type == device.type
    ]
    counted = _spans([*params.values(), *grads])
    return {
        "parameters": _storage_bytes(params.values()),
        "gradients": _storage_bytes(grads),
        "optimizer_state": sum(b - _overlap(s, b, counted) for s, b in _spans(opt)),
        "parameter_count": sum(p.numel() for p in params.values()),
    }


def _spans(tensors: Any) -> list[tuple[int, int]]:
    """(start, bytes) of each distinct storage, merged where they overlap, in order."""
    spans = sorted(
        {(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors}
    )
    merged: list[tuple[int, int]] = []
    for start, nbytes in spans:
        if merged and start < merged[-1][0] + merged[-1][1]:
            end = max(merged[-1][0] + merged[-1][1], start + nbytes)
            merged[-1] = (merged[-1][0], end - merged[-1][0])
        else:
            merged.append((start, nbytes))
    return merged


def _overlap(start: int, nbytes: int, spans: list[tuple[int, int]]) -> int:
    return sum(max(0, min(start + nbytes, s + b) - max(start, s)) for s, b in spans)


def _storage_bytes(tensors: Any) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


# --- step 1: the allocator's history, saved tensors and phases ------------------------------


class StepObserver:
    """During one step: the tensors saved for backward (per module path), the module path
    stack, and the allocator's figures at the end of each phase range."""

    def __init__(self, roots: list[nn.Module], device: torch.device) -> None:
        self.device = device
        self.paths = {id(m): path for root in roots for path, m in named_modules(root)}
        # a weight saved for backward is a parameter, not an activation
        self.param_ptrs = {
            p.untyped_storage().data_ptr() for root in roots for p in root.parameters()
        }
        self.stack: list[str] = []
        # storage ptr -> (bytes, module path, saved before backward started)
        self.saved: dict[int, tuple[int, str, bool]] = {}
        self.phases: list[dict[str, Any]] = []
        self.handles: list[Any] = []

    @contextlib.contextmanager
    def observing(self, hooks: bool = True) -> Iterator[None]:
        """``hooks`` false (compiled code): the phase ends only. Global module hooks and
        saved-tensor hooks around compiled code would change what Dynamo traced (its guards
        see them: a recompilation), so a compiled run's activations come from the history."""
        if not hooks:
            nvtx_ranges.set_exit_observer(self._phase_ended)
            try:
                yield
            finally:
                nvtx_ranges.set_exit_observer(None)
            return
        pre = nn.modules.module.register_module_forward_pre_hook(self._enter)
        post = nn.modules.module.register_module_forward_hook(self._exit, always_call=True)
        nvtx_ranges.set_exit_observer(self._phase_ended)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
                yield
        finally:
            nvtx_ranges.set_exit_observer(None)
            pre.remove()
            post.remove()

    def _enter(self, module: nn.Module, _args: Any) -> None:
        if id(module) in self.paths:
            self.stack.append(self.paths[id(module)])

    def _exit(self, module: nn.Module, _args: Any, _out: Any) -> None:
        if id(module) in self.paths and self.stack:
            self.stack.pop()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.saved and ptr not in self.param_ptrs:
            path = self.stack[-1] if self.stack else ""
            # saved before backward, or by a recomputation inside it (checkpointing)
            before_backward = torch._C._current_graph_task_id() == -1
            self.saved[ptr] = (storage.nbytes(), path, before_backward)
        return tensor

    def _phase_ended(self, name: str) -> None:
        if name not in PHASES:
            return
        # the phase's end on the host clock, before this bookkeeping's own time
        mark: dict[str, Any] = {"phase": name, "time_us": time.time_ns() / 1e3}
        if self.device.type == "cuda":
            mark["allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            mark["peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
            mark["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)  # the next phase's own peak
            # where the phase ends in the allocator's history: its length so far (a snapshot
            # here costs the capture time, never a timed step)
            mark["trace_index"] = len(_allocations(torch.cuda.memory._snapshot(), self.device))
        mark["resumed_us"] = time.time_ns() / 1e3  # where the next phase starts
        self.phases.append(mark)


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def named_modules(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, module) with the wrappers' parts left out, so the paths are the module
    table's (``layers.0.attn``, whether compiled, wrapped or not)."""
    out = []
    for path, module in root.named_modules():
        parts = [p for p in path.split(".") if p and p not in _WRAPPER_PARTS]
        out.append((".".join(parts), module))
    return out


def allocator_view(
    step: Callable[[], Any],
    device: torch.device,
    owners: dict[str, list[Any]],
    hooks: bool = True,
) -> dict[str, Any]:
    """One step under the allocator's history: curve, peak, categories at the peak, phases,
    bytes saved for backward per module. Without ``hooks`` (compiled code) the activations
    are the blocks allocated before backward and alive when it starts."""
    observer = StepObserver(owners["modules"], device)
    grads_before = _grad_ptrs(owners)
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start_bytes = torch.cuda.memory_allocated(device)
    live_at_start = _live_blocks(torch.cuda.memory._snapshot(), device)
    torch.cuda.memory._record_memory_history(
        context="alloc",
        stacks="python",
        max_entries=MAX_ENTRIES,
        device=device,
        clear_history=True,
    )
    started_us = time.time_ns() / 1e3
    try:
        with observer.observing(hooks):
            step()
        synchronize(device)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None, device=device)
    step_ms = (time.time_ns() / 1e3 - started_us) / 1e3
    phase_peaks = [p.pop("peak_bytes") for p in observer.phases]
    max_allocated = max([torch.cuda.max_memory_allocated(device), *phase_peaks])
    max_reserved = max(
        [
            torch.cuda.max_memory_reserved(device),
            *(p.pop("peak_reserved_bytes") for p in observer.phases),
        ]
    )
    trace = _allocations(snapshot, device)
    curve = replay(trace, start_bytes)
    origin = clock_origin(curve, started_us)
    host_clock, started_us = origin == started_us, origin
    owners_by_ptr = category_owners(owners, grads_before, observer.saved)
    peak_at = max(range(len(curve)), key=lambda i: curve[i][1]) if curve else None
    live = live_after(live_at_start, trace, peak_at)
    # made before backward, alive when it starts, saved by no hook: what autograd or a
    # checkpoint keeps otherwise (a checkpointed layer's input, the logits), or everything a
    # compiled run's forward keeps (its hooks are off)
    forward = forward_alive(observer.phases, live_at_start, trace)
    by_category = categorize(live, owners_by_ptr, _backward_start(observer.phases), forward)
    at_backward = at_backward_start(observer.phases, live_at_start, trace, owners_by_ptr, forward)
    peak = curve[peak_at][1] if curve else start_bytes
    return {
        "peak_allocated_bytes": max(peak, start_bytes),
        "max_memory_allocated": max_allocated,
        "peak_reserved_bytes": max_reserved,
        "start_allocated_bytes": start_bytes,
        "peak_time_ms": (curve[peak_at][0] - started_us) / 1e3 if curve else None,
        "at_peak": {c: by_category[c] for c in CATEGORIES},
        # of the activations, the bytes no saved-tensor hook saw (kept by autograd otherwise,
        # a checkpoint's layer inputs; a compiled run's all)
        "at_peak_activations_kept": by_category["activations_kept"],
        "curve": _thin([((t - started_us) / 1e3, b) for t, b in curve]),
        "step_ms": step_ms,
        "phases": phase_rows(observer.phases, curve, started_us, start_bytes, phase_peaks,
                             host_clock),
        "at_backward_start": at_backward and {c: at_backward[c] for c in CATEGORIES},
        "at_backward_start_activations_kept": at_backward and at_backward["activations_kept"],
        "activations_from": (
            "saved for backward (saved_tensors_hooks), and kept alive into backward"
            if hooks
            else "kept alive into backward (no hooks on compiled code)"
        ),
        "saved_by_module": saved_by_module(observer.saved),
        "saved_bytes": sum(b for b, _, _ in observer.saved.values()),
        "history_entries": len(trace),
    }


def saved_view(step: Callable[[], Any], owners: dict[str, list[Any]]) -> dict[str, Any]:
    """Without CUDA: the bytes saved for backward (per module path) of one step."""
    observer = StepObserver(owners["modules"], torch.device("cpu"))
    with observer.observing():
        step()
    return {
        "saved_by_module": saved_by_module(observer.saved),
        "saved_bytes": sum(b for b, _, _ in observer.saved.values()),
    }


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _allocations(snapshot: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """The history's allocations and frees (as the allocator counts allocated bytes)."""
    return [
        e
        for e in snapshot["device_traces"][_index(device)]
        if e["action"] in ("alloc", "free_requested")
    ]


def _backward_start(marks: list[dict[str, Any]]) -> int | None:
    """Where backward starts in the history: the end of the loss range, else of forward."""
    ends = {m["phase"]: m["trace_index"] for m in marks}
    return ends.get("loss_computation", ends.get("forward_pass"))


def at_backward_start(
    marks: list[dict[str, Any]],
    start: dict[int, int],
    trace: list[dict[str, Any]],
    spans: list[tuple[int, int, str, int]],
    forward: set[tuple[int, int]],
) -> dict[str, int] | None:
    """Bytes by category alive when backward starts (the activations: all saved)."""
    end = _backward_start(marks)
    if end is None:
        return None
    return categorize(live_after(start, trace, end - 1), spans, end, forward)


def forward_alive(
    marks: list[dict[str, Any]], start: dict[int, int], trace: list[dict[str, Any]]
) -> set[tuple[int, int]]:
    """(address, allocation index) of the blocks allocated in forward and the loss (from the
    step's start) and alive when backward starts."""
    end = _backward_start(marks)
    if end is None or not any(m["phase"] == "backward_pass" for m in marks):
        return set()  # no backward: nothing is kept for it
    return {(a, born) for a, (_, born) in live_after(start, trace, end - 1).items() if born >= 0}


def _live_blocks(snapshot: dict[str, Any], device: torch.device) -> dict[int, int]:
    """Address -> size of every allocated block of the device, from a snapshot. A block's
    address is its own where the snapshot gives it, else its segment's address plus the
    sizes of the blocks before it (the blocks of a segment are listed in address order)."""
    index, live = _index(device), {}
    for seg in snapshot["segments"]:
        if seg["device"] != index:
            continue
        addr = seg["address"]
        for block in seg["blocks"]:
            addr = block.get("address", addr)
            if block["state"] == "active_allocated":
                live[addr] = block["size"]
            addr += block["size"]
    return live


def clock_origin(curve: list[tuple[float, int]], started_us: float) -> float:
    """The step's start on the history's clock: the host clock where the two agree (the
    allocator stamps entries in microseconds since the epoch), else its first entry."""
    if curve and abs(curve[0][0] - started_us) > 10e6:
        return curve[0][0]
    return started_us


def replay(trace: list[dict[str, Any]], start_bytes: int) -> list[tuple[float, int]]:
    """(time_us, allocated bytes) after each allocation and free, from ``start_bytes``: the
    allocator's own count (a free lowers it when requested)."""
    allocated, curve = start_bytes, []
    for entry in trace:
        allocated += entry["size"] if entry["action"] == "alloc" else -entry["size"]
        curve.append((float(entry["time_us"]), allocated))
    return curve


def live_after(
    start: dict[int, int], trace: list[dict[str, Any]], upto: int | None
) -> dict[int, tuple[int, int]]:
    """The blocks alive after trace entry ``upto``: address -> (size, the trace index of its
    allocation; -1: alive when the step started)."""
    live = {addr: (size, -1) for addr, size in start.items()}
    for index, entry in enumerate(trace[: (upto + 1) if upto is not None else 0]):
        if entry["action"] == "alloc":
            live[entry["addr"]] = (entry["size"], index)
        else:
            live.pop(entry["addr"], None)
    return live


def _grad_ptrs(owners: dict[str, list[Any]]) -> list[tuple[int, int]]:
    return [
        (p.grad.untyped_storage().data_ptr(), p.grad.untyped_storage().nbytes())
        for m in owners["modules"]
        for p in m.parameters()
        if p.grad is not None
    ]


# When a storage owns a block, by the block's allocation (its trace index, -1: before the
# step; B: where backward starts): parameters and optimizer state always; last step's
# gradients only a block from before the step; this step's gradients one from before it or
# from backward; a tensor saved before backward a block from before B, one saved by a
# recomputation inside backward a block from after B. An address freed and reused is
# another tensor.
ANY, BEFORE_STEP, BEFORE_BACKWARD, IN_BACKWARD, GRADIENT = range(5)


def category_owners(
    owners: dict[str, list[Any]],
    grads_before: list[tuple[int, int]],
    saved: dict[int, tuple[int, str, bool]],
) -> list[tuple[int, int, str, int]]:
    """(start, end, category, when) of every storage with a known owner. One address may
    have several (last step's gradient, then a tensor allocated where it was): ``when``
    tells them apart, and where two can own a block the category's priority decides."""
    spans: dict[tuple[int, str, int], int] = {}

    def add(ptr: int, nbytes: int, category: str, when: int) -> None:
        if ptr:
            spans[(ptr, category, when)] = max(nbytes, spans.get((ptr, category, when), 0))

    def storage(t: torch.Tensor) -> tuple[int, int]:
        return t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()

    for module in owners["modules"]:
        for t in [*module.parameters(), *module.buffers()]:
            add(*storage(t), "parameters", ANY)
    for module in owners["modules"]:
        for p in module.parameters():
            if p.grad is not None:
                add(*storage(p.grad), "gradients", GRADIENT)
    for ptr, nbytes in grads_before:
        add(ptr, nbytes, "gradients", BEFORE_STEP)
    for optimizer in owners["optimizers"]:
        for t in optimizer_tensors(optimizer):
            add(*storage(t), "optimizer_state", ANY)
    for ptr, (nbytes, _, before_backward) in saved.items():
        add(ptr, nbytes, "activations", BEFORE_BACKWARD if before_backward else IN_BACKWARD)
    return sorted((ptr, ptr + max(n, 1), c, w) for (ptr, c, w), n in spans.items())


def _owns(when: int, born: int, backward_start: int | None) -> bool:
    """Whether a storage of ``when`` can be the tensor of a block allocated at ``born``."""
    if when == ANY or backward_start is None:
        return when != BEFORE_STEP or born < 0
    return {
        BEFORE_STEP: born < 0,
        BEFORE_BACKWARD: born < backward_start,
        IN_BACKWARD: born >= backward_start,
        GRADIENT: born < 0 or born >= backward_start,
    }[when]


def categorize(
    live: dict[int, tuple[int, int]],
    spans: list[tuple[int, int, str, int]],
    backward_start: int | None,
    forward: set[tuple[int, int]] = frozenset(),
) -> dict[str, int]:
    """Bytes by category of the live blocks (address -> size, allocation index). A block's
    bytes go to the owned storages inside it (where storages overlap, parameters before
    gradients before optimizer state before activations: ``adamw_master``'s fp32 parameters
    are views of its master weights); the rest of an owned block (the allocator's rounding) to
    other. A block no storage owns: activations (``forward``: made before backward and alive
    when it starts; also counted alone as ``activations_kept``), temporaries (allocated in the
    step) or other (alive before it)."""
    index = OwnerIndex(spans)
    out = dict.fromkeys((*CATEGORIES, "activations_kept"), 0)
    for addr, (size, born) in live.items():
        owned = index.owners(addr, size, born, backward_start)
        if owned:
            for category, nbytes in owned.items():
                out[category] += nbytes
            out["other"] += size - sum(owned.values())  # the allocator's rounding
        elif (addr, born) in forward:
            out["activations"] += size
            out["activations_kept"] += size
        else:
            out["other" if born < 0 else "temporaries"] += size
    return out


PRIORITY = {c: i for i, c in enumerate(CATEGORIES)}


class OwnerIndex:
    """The owned storages, sorted by start, for the ones overlapping a block."""

    def __init__(self, spans: list[tuple[int, int, str, int]]) -> None:
        self.spans = sorted(spans)
        self.starts = [span[0] for span in self.spans]
        self.max_end: list[int] = []  # the largest end among the spans up to each index
        for span in self.spans:
            self.max_end.append(max(span[1], self.max_end[-1] if self.max_end else span[1]))

    def owners(self, addr: int, size: int, born: int, backward_start: int | None) -> dict[str, int]:
        """Category -> bytes of [addr, addr + size) its storages cover (by priority)."""
        hi = bisect.bisect_left(self.starts, addr + size)
        pieces = []
        j = hi - 1
        while j >= 0 and self.max_end[j] > addr:
            start, end, category, when = self.spans[j]
            if end > addr and _owns(when, born, backward_start):
                pieces.append((max(start, addr), min(end, addr + size), category))
            j -= 1
        return _cover(pieces)


def _cover(pieces: list[tuple[int, int, str]]) -> dict[str, int]:
    """Bytes per category of overlapping pieces, each byte to its highest-priority piece."""
    points = sorted({p for a, b, _ in pieces for p in (a, b)})
    out: dict[str, int] = defaultdict(int)
    for a, b in zip(points, points[1:], strict=False):
        over = [c for s, e, c in pieces if s <= a and e >= b]
        if over:
            out[min(over, key=PRIORITY.__getitem__)] += b - a
    return dict(out)


def phase_rows(
    marks: list[dict[str, Any]],
    curve: list[tuple[float, int]],
    started_us: float,
    start_bytes: int,
    peaks: list[int],
    host_clock: bool = False,
) -> list[dict[str, Any]]:
    """Per phase range: where it starts and ends on the curve's clock, the bytes alive then
    and the peak inside it. Where the allocator's history runs on the host clock, the range's
    own ends (a phase that allocates nothing, AdamW fused, still has its length; the capture's
    bookkeeping between two phases is in neither); else where the history was split."""
    rows, begin, before = [], 0.0, start_bytes
    for mark, peak in zip(marks, peaks, strict=True):
        index = mark["trace_index"]
        end = (curve[index - 1][0] - started_us) / 1e3 if 0 < index <= len(curve) else begin
        if host_clock and "time_us" in mark:
            end = (mark["time_us"] - started_us) / 1e3
        rows.append(
            {
                "phase": mark["phase"],
                "start_ms": begin,
                "end_ms": end,
                "allocated_at_start_bytes": before,
                "allocated_at_end_bytes": mark["allocated_bytes"],
                "peak_bytes": peak,
            }
        )
        begin, before = end, mark["allocated_bytes"]
        if host_clock and "resumed_us" in mark:
            begin = (mark["resumed_us"] - started_us) / 1e3
    return rows


def saved_by_module(saved: dict[int, tuple[int, str, bool]]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for nbytes, path, _ in saved.values():
        out[path] += nbytes
    return dict(out)


def _thin(curve: list[tuple[float, int]], most: int = 4000) -> list[list[float]]:
    """At most ``most`` points, the extremes of each stretch kept (the peak is never lost)."""
    if len(curve) <= most:
        return [[round(t, 4), b] for t, b in curve]
    width = len(curve) / (most // 2)
    out: list[list[float]] = []
    for k in range(most // 2):
        chunk = curve[int(k * width) : int((k + 1) * width)] or curve[-1:]
        lo, hi = min(chunk, key=lambda p: p[1]), max(chunk, key=lambda p: p[1])
        out += [[round(p[0], 4), p[1]] for p in sorted({lo, hi})]
    return out


def graph_pool_bytes(device: torch.device) -> int:
    """Bytes reserved in CUDA graphs' private pools (whole-step graph, reduce-overhead)."""
    from workloads.runner import graph_pools

    return graph_pools(device)[0]


# --- step 2: MemTracker per module ----------------------------------------------------------


def module_peaks(step: Callable[[], Any], owners: dict[str, list[Any]]) -> dict[str, Any]:
    """Per module path, MemTracker's peak bytes by category in forward and in backward."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    try:
        # a torch optimizer as itself (its states are OPT), a flat one as its tensors
        external = [
            t
            for o in owners["optimizers"]
            for t in ([o] if isinstance(o, torch.optim.Optimizer) else optimizer_tensors(o))
        ]
        tracker.track_external(*owners["modules"], *external)
        with tracker:
            step()
        stats = tracker.memory_tracking
    except Exception as err:  # noqa: BLE001 - compiled code, custom optimizers: say why
        return {"error": f"{type(err).__name__}: {err}"[:300]}
    paths = {id(m): path for root in owners["modules"] for path, m in named_modules(root)}
    rows: dict[str, Any] = {}
    for module, mod_stats in list(stats.items()):
        path = paths.get(id(module))
        if path is None:
            continue
        rows[path] = {state: _by_category(snap) for state, snap in _states(mod_stats).items()}
    return {"modules": rows}


def _states(mod_stats: Any) -> dict[str, Any]:
    """MemTracker's last snapshot of each state (Pre-Forward, Peak-Forward, Peak-Backward,
    ...) of one module, keyed by the state's name."""
    snaps = getattr(mod_stats, "snapshots", {})
    return {
        str(getattr(state, "value", state)): values[-1] for state, values in snaps.items() if values
    }


def _by_category(snap: dict[Any, dict[Any, int]]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for per_device in snap.values():
        for kind, nbytes in per_device.items():
            out[str(getattr(kind, "value", kind))] += int(nbytes)
    return dict(out)


# --- step 3: the profiler's memory events per ATen op ---------------------------------------


def op_memory(step: Callable[[], Any], device: torch.device) -> list[dict[str, Any]]:
    """Per ATen op: calls, and of its allocations (self: made by the op itself; total: by it
    and the ops it called) their count, bytes and the net size increase, as the TensorBoard
    plugin computes them from the profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, profile_memory=True) as prof:
        step()
        synchronize(device)
    return op_table(prof.profiler.kineto_results.events(), device)


def op_table(events: list[Any], device: torch.device) -> list[dict[str, Any]]:
    """The operator memory table from kineto events (ops and ``[memory]`` records): each
    memory record belongs to the innermost op open on its thread (self) and to every op
    around it (total). An op nested alone in one of the same name (``aten::div`` calling
    ``aten::div``) is one op, as torch.profiler counts it (``EventList._remove_dup_nodes``)."""
    want = "CUDA" if device.type == "cuda" else "CPU"
    ops: dict[int, list[OpNode]] = defaultdict(list)
    memory = []
    for e in events:
        if e.name() == "[memory]":
            if want in str(e.device_type()):
                memory.append((e.start_ns(), e.start_thread_id(), e.nbytes()))
        elif e.name().startswith("aten::") and "CPU" in str(e.device_type()):
            ops[e.start_thread_id()].append(
                OpNode(e.name(), e.start_ns(), e.start_ns() + e.duration_ns())
            )
    roots = {thread: op_tree(nodes) for thread, nodes in ops.items()}
    rows: dict[str, dict[str, Any]] = {}
    for tree in roots.values():
        for node in _walk(tree):
            _row(rows, node.name)["calls"] += 1
    for ts, thread, nbytes in memory:
        stack = enclosing(roots.get(thread, []), ts)
        for k, node in enumerate(stack):
            for scope in ("total", "self") if k == len(stack) - 1 else ("total",):
                row = _row(rows, node.name)
                row[f"{scope}_size_increase_bytes"] += nbytes
                if nbytes > 0:
                    row[f"{scope}_allocation_count"] += 1
                    row[f"{scope}_allocation_bytes"] += nbytes
    return sorted(rows.values(), key=lambda r: -r["total_allocation_bytes"])


class OpNode:
    """One op call: its name, interval and the calls inside it."""

    __slots__ = ("children", "end", "name", "start")

    def __init__(self, name: str, start: int, end: int) -> None:
        self.name, self.start, self.end = name, start, end
        self.children: list[OpNode] = []


def op_tree(nodes: list[OpNode]) -> list[OpNode]:
    """The calls of one thread nested by interval; a lone same-name child merged away."""
    roots: list[OpNode] = []
    stack: list[OpNode] = []
    for node in sorted(nodes, key=lambda n: (n.start, -n.end)):
        while stack and node.start > stack[-1].end:
            stack.pop()
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    for node in _walk(roots):
        while len(node.children) == 1 and node.children[0].name == node.name:
            node.children = node.children[0].children
    return roots


def _walk(nodes: list[OpNode]) -> Iterator[OpNode]:
    for node in nodes:
        yield node
        yield from _walk(node.children)


def enclosing(roots: list[OpNode], ts: int) -> list[OpNode]:
    """The ops open at ``ts``, outermost first."""
    stack, level = [], roots
    while level:
        i = bisect.bisect_right([n.start for n in level], ts) - 1
        if i < 0 or level[i].end < ts:
            break
        stack.append(level[i])
        level = level[i].children
    return stack


def _row(rows: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    return rows.setdefault(
        name,
        {
            "op": name,
            "calls": 0,
            **{
                f"{scope}_{what}": 0
                for scope in ("self", "total")
                for what in ("allocation_count", "allocation_bytes", "size_increase_bytes")
            },
        },
    )
