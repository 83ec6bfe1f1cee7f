"""Optimizers of the ``train`` mode.

* ``adamw_foreach``: ``torch.optim.AdamW`` with its default multi-tensor (foreach) kernels;
* ``adamw_fused``: ``torch.optim.AdamW(fused=True)``, one fused CUDA kernel per chunk;
* ``adamw_master``: the same AdamW math on ONE flat fp32 master buffer. Under bf16/fp16
  autocast the model's ``nn.Linear`` weights become low-precision segments of one flat buffer
  that the optimizer refreshes from the masters after each update (each segment a storage of
  its own, so that a nested compile region takes them as the separate tensors they are).
  Autocast would cast these weights to the same values on every forward anyway, so the math
  is unchanged; what goes is the per-step cast (read fp32, write bf16), the bf16->fp32 cast
  of every weight gradient, and half the gradient bytes the optimizer reads. With
  ``compile`` on, the update is one compiled elementwise kernel over the flat buffers.
"""

from collections.abc import Callable

import torch
from torch import nn

OPTIMIZERS = ("adamw_foreach", "adamw_fused", "adamw_master")
# The update is one bandwidth-bound elementwise kernel per segment. Inductor would benchmark
# its launch configs on the real buffers, cloning the ones it mutates for every config: on
# the H100, 80-105 s of 2.7B's cold compile, for a step no faster.
SEGMENT_COMPILE_OPTIONS = {"triton.autotune_pointwise": False}
# Inductor's alignment assumption for GPU inputs (torch._inductor.utils.GPU_ALIGN_BYTES).
INDUCTOR_ALIGNMENT = 16


class MasterAdamW:
    """AdamW (torch defaults: betas 0.9/0.999, eps 1e-8, weight decay 0.01) on flat buffers."""

    def __init__(
        self,
        model: nn.Module,
        *,
        lr: float,
        low_precision: torch.dtype | None,
        compile_mode: str = "off",
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        self.hyper = (lr, betas[0], betas[1], eps, weight_decay)
        slots = _parameter_slots(model)
        unique = list({id(s[2]): s for s in slots}.values())
        low = [s for s in unique if low_precision is not None and _is_linear_weight(s)]
        full = [s for s in unique if s not in low]
        ordered = [s[2] for s in low + full]  # flat order: low-precision group first
        device = ordered[0].device
        self.n_low = sum(p.numel() for p in ordered[: len(low)])
        self.n_low_params = len(low)
        self.master = torch.cat([p.detach().reshape(-1).float() for p in ordered])
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        self.step_count = torch.zeros(1, device=device)  # fp32: exact to 2**24 steps
        self.shadow = self.master[: self.n_low].to(low_precision) if low else None
        self.grad_low = torch.empty_like(self.shadow) if low else None
        self.grad_full = torch.empty(self.master.numel() - self.n_low, device=device)
        self.params = self._rebind(slots, ordered, len(low))
        # The gathers are two eager cat kernels (one launch each); only the elementwise
        # segment update is compiled. Gathering 100s of tensors inside inductor made many
        # kernels (slower on H100 at GPT small) and a full fp32 gradient copy.
        self._segment: Callable[..., None] = (
            _adamw_segment
            if compile_mode == "off"
            else torch.compile(_adamw_segment, fullgraph=True, dynamic=False,
                               options=SEGMENT_COMPILE_OPTIONS)
        )

    def _rebind(
        self, slots: list, ordered: list[nn.Parameter], n_low_params: int
    ) -> list[nn.Parameter]:
        """Make the model's parameters segments of the flat buffers (shared ones stay shared)."""
        new: dict[int, nn.Parameter] = {}
        offset = 0  # shadow covers [0, n_low) of the master; the rest lives in the master
        for index, param in enumerate(ordered):
            flat = self.shadow if index < n_low_params else self.master
            view = _own_storage(flat[offset : offset + param.numel()]).view(param.shape)
            new[id(param)] = nn.Parameter(view, requires_grad=param.requires_grad)
            offset += param.numel()
        for module, name, param in slots:
            module._parameters[name] = new[id(param)]
        return [new[id(p)] for p in ordered]

    def bytes_per_step(self) -> int:
        """Device bytes of one step: the two gradient gathers (read + write each gradient),
        then per element read master, exp_avg, exp_avg_sq and the gradient, write master,
        exp_avg, exp_avg_sq, and the low-precision copy where there is one."""
        n_full = self.master.numel() - self.n_low
        low = self.shadow.element_size() if self.shadow is not None else 0
        state = 6 * self.master.element_size()  # master, exp_avg, exp_avg_sq: read + write
        per_low = 2 * low + state + low + low  # gather, state, gradient read, copy write
        per_full = 2 * 4 + state + 4  # gather (fp32), state, gradient read
        return self.n_low * per_low + n_full * per_full

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            raise RuntimeError("adamw_master: a parameter got no gradient this step")
        low, full = grads[: self.n_low_params], grads[self.n_low_params :]
        # One eager cat per group (one kernel each) gives the update flat gradients.
        if low:
            torch.cat([g.reshape(-1) for g in low], out=self.grad_low)
        torch.cat([g.reshape(-1) for g in full], out=self.grad_full)
        _adamw_update(
            self.master, self.exp_avg, self.exp_avg_sq, self.shadow, self.grad_low,
            self.grad_full, self.step_count, *self.hyper, segment=self._segment,
        )


def _adamw_update(
    master: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    shadow: torch.Tensor | None,
    grad_low: torch.Tensor | None,
    grad_full: torch.Tensor,
    step: torch.Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    *,
    segment: Callable[..., None] | None = None,
) -> None:
    """torch.optim.AdamW's update (decoupled decay, bias correction) on the flat buffers.

    The low-precision segment [0, n_low) and the fp32 rest are separate calls of
    ``segment`` on views: compiled code then mutates its inputs in place, whereas slicing
    inside it made inductor write a full-size copy of the master (12.7 GiB on 2.7B).
    """
    segment = segment or _adamw_segment
    step.add_(1)
    n_low = 0 if grad_low is None else grad_low.numel()
    hyper = (lr, beta1, beta2, eps, weight_decay)
    if grad_low is not None:
        segment(master[:n_low], exp_avg[:n_low], exp_avg_sq[:n_low], grad_low, shadow, step,
                *hyper)
    segment(master[n_low:], exp_avg[n_low:], exp_avg_sq[n_low:], grad_full, None, step, *hyper)


def _adamw_segment(
    param: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    grad: torch.Tensor,
    shadow: torch.Tensor | None,
    step: torch.Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """One AdamW update of a flat segment; refreshes its low-precision copy if any."""
    # Bias corrections on the device (as AdamW(capturable=True) does): no host sync, no
    # recompilation as the step count changes.
    step_size = lr / (1 - torch.pow(beta1, step))
    bias_correction2_sqrt = torch.sqrt(1 - torch.pow(beta2, step))
    grad = grad.float()
    param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.sub_(exp_avg / denom * step_size)
    if shadow is not None:
        shadow.copy_(param)


# AdamW reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq: seven
# tensors of the parameters' size per step, however well the kernels are fused.
ADAMW_TENSOR_PASSES = 7


def optimizer_bytes_per_step(optimizer: torch.optim.Optimizer | MasterAdamW | None) -> int | None:
    """Bytes one optimizer step must move through device memory (read + written): what a
    perfectly fused kernel would still move (docs/findings.md, optimizer at the roofline)."""
    if isinstance(optimizer, MasterAdamW):
        return optimizer.bytes_per_step()
    if isinstance(optimizer, torch.optim.AdamW):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        # FSDP's parameters are DTensors: this rank updates its own shard only
        size = sum(_local(p).numel() * p.element_size() for p in params)
        return ADAMW_TENSOR_PASSES * size
    return None


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter: a DTensor's local shard, else the tensor itself."""
    to_local = getattr(param, "to_local", None)
    return to_local() if callable(to_local) else param


def build_optimizer(
    name: str,
    model: nn.Module,
    *,
    lr: float,
    low_precision: torch.dtype | None,
    compile_mode: str = "off",
    capturable: bool = False,
) -> torch.optim.Optimizer | MasterAdamW:
    """The optimizer ``name`` over ``model``'s parameters (see the module docstring).

    ``capturable``: torch's AdamW keeps its step count on the device (no host sync), so the
    step can be captured into a CUDA graph (``cuda_graph: step``); MasterAdamW always does.
    """
    if name == "adamw_foreach":
        return torch.optim.AdamW(model.parameters(), lr=lr, foreach=True, capturable=capturable)
    if name == "adamw_fused":
        return torch.optim.AdamW(model.parameters(), lr=lr, fused=True, capturable=capturable)
    if name == "adamw_master":
        return MasterAdamW(model, lr=lr, low_precision=low_precision, compile_mode=compile_mode)
    raise ValueError(f"unknown optimizer {name!r}; expected one of {OPTIMIZERS}")


def _own_storage(segment: torch.Tensor) -> torch.Tensor:
    """``segment``'s memory as a tensor with a storage object of its own (DLPack keeps the
    flat buffer alive). The segments of one flat buffer never overlap, but as views of one
    storage torch takes them for aliases of each other, and a nested compile region
    (``compile_blocks: once``) refuses aliased inputs. Only for a 16-byte aligned segment:
    Inductor takes a parameter whose storage offset is 0 for aligned and never checks it."""
    from torch.utils.dlpack import from_dlpack, to_dlpack

    if segment.data_ptr() % INDUCTOR_ALIGNMENT:
        return segment  # an alias: correct, but refused by a nested compile region
    return from_dlpack(to_dlpack(segment))


def _parameter_slots(model: nn.Module) -> list[tuple[nn.Module, str, nn.Parameter]]:
    """(module, attribute, parameter) for every registered parameter, in module order."""
    return [
        (module, name, param)
        for module in model.modules()
        for name, param in module._parameters.items()
        if param is not None
    ]


def _is_linear_weight(slot: tuple[nn.Module, str, nn.Parameter]) -> bool:
    # Autocast casts exactly these (matmul operands); norms and embeddings stay fp32.
    module, name, _ = slot
    return isinstance(module, nn.Linear) and name == "weight"
