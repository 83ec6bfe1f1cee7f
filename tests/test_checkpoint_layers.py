"""``checkpoint: layers`` for `workload: model`: each of the structure's layers is recomputed in
backward (workloads/models/parts.py: checkpoint_layers), with the same loss and gradients as
without it, its recomputation read as such by the module ranges; the run key is checked by the
schema. CPU, real torch, the CS336 example model."""

from __future__ import annotations

import pytest
import torch

from pipeline.config import ConfigError, resolve
from workloads.models import cs336_lm
from workloads.models.parts import checkpoint_layers
from workloads.module_ranges import ModuleRanges

CS336_TINY = dict(d_model=32, d_ff=64, num_layers=2, num_heads=4, vocab_size=97,
                  context_length=16)


def _step(checkpointed: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[str]]:
    """Loss, gradients and the NVTX range names one train step pushes, with the module
    ranges on."""
    torch.manual_seed(0)
    parts = cs336_lm.make(**CS336_TINY)
    if checkpointed:
        checkpoint_layers(parts.structure.layer_modules(parts.model))
    pushed: list[str] = []
    ranges = ModuleRanges(parts.model, depth=3)
    import workloads.module_ranges as module_ranges

    real_push = module_ranges.nvtx.push_range
    module_ranges.nvtx.push_range = lambda name: (pushed.append(name), real_push(name))[1]
    try:
        tokens, targets = parts.make_batch(2, torch.device("cpu"))
        loss = parts.loss(parts.model(tokens), targets)
        loss.backward()
        ranges.close_open()
    finally:
        module_ranges.nvtx.push_range = real_push
        ranges.remove()
    return loss.detach(), {n: p.grad for n, p in parts.model.named_parameters()}, pushed


def test_checkpointed_layers_compute_the_same_step_and_recompute_in_backward() -> None:
    plain_loss, plain_grads, plain_ranges = _step(checkpointed=False)
    loss, grads, pushed = _step(checkpointed=True)
    assert torch.equal(loss, plain_loss)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    # the layer's forward is checkpointed, not its call: its children recompute, once each
    assert "recompute:layers.0" not in pushed
    assert pushed.count("recompute:layers.0.attn") == 1
    assert pushed.count("recompute:layers.1.ffn") == 1
    assert not any(n.startswith("recompute:") for n in plain_ranges)
    assert pushed.count("module:layers.0.attn") == plain_ranges.count("module:layers.0.attn")


def test_checkpoint_layers_keeps_the_module_paths() -> None:
    torch.manual_seed(0)
    parts = cs336_lm.make(**CS336_TINY)
    before = [p for p, _ in parts.model.named_modules()]
    layers = parts.structure.layer_modules(parts.model)
    checkpoint_layers(layers)
    assert [p for p, _ in parts.model.named_modules()] == before
    assert all(isinstance(layer, cs336_lm.TransformerBlock) for layer in layers)
    with pytest.raises(ValueError, match="needs layers"):
        checkpoint_layers([])


def test_the_run_key_is_checked() -> None:
    base = {"workload": "model", "factory": "workloads.models.cs336_lm:make", "mode": "train"}
    plan = resolve({"runs": {"ck": {**base, "checkpoint": "layers"}}})
    assert plan.runs["ck"]["checkpoint"] == "layers"
    with pytest.raises(ConfigError, match="checkpoint"):
        resolve({"runs": {"ck": {**base, "checkpoint": "blocks"}}})
