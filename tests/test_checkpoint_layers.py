"""``checkpoint: layers`` for `workload: model` and the GPT: each of the structure's layers is
recomputed in backward (workloads/models/parts.py: checkpoint_layers), with the same loss and
gradients as without it, its recomputation read as such by the module ranges; the run key is
checked by the schema. CPU, real torch, the CS336 example model and the tiny GPT."""

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


def _gpt_steps(checkpoint: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], list[str]]:
    """Losses of three train steps of the tiny GPT built by the models' builder, and the range
    names they push (a capture's module ranges on)."""
    import workloads.module_ranges as module_ranges
    from workloads.models.builder import CAPTURE_ENV, build_gpt
    from workloads.steps import Speed

    monkeypatch.setenv(CAPTURE_ENV, "1")
    workload = build_gpt(size="tiny", context=16, batch=2, vocab=97, mode="train", dtype="fp32",
                         attention="sdpa", device=torch.device("cpu"), seed=0,
                         speed=Speed(), checkpoint=checkpoint)
    pushed: list[str] = []
    real_push = module_ranges.nvtx.push_range
    module_ranges.nvtx.push_range = lambda name: (pushed.append(name), real_push(name))[1]
    try:
        losses = [workload.step().item() for _ in range(3)]
    finally:
        module_ranges.nvtx.push_range = real_push
    assert workload.structure.layers == "layers.*" and workload.module_depth == 3
    return losses, pushed


def test_the_gpt_checkpoints_its_blocks_as_any_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """``checkpoint: layers`` on the built-in GPT: the same losses step after step (the same
    gradients and updates), each block's parts recomputed once per step in backward."""
    plain, plain_pushed = _gpt_steps("none", monkeypatch)
    losses, pushed = _gpt_steps("layers", monkeypatch)
    assert losses == pytest.approx(plain, rel=1e-5)
    assert losses[2] < losses[0]
    assert pushed.count("recompute:layers.1.attn") == 3  # once in each step's backward
    assert pushed.count("module:layers.1.attn") == plain_pushed.count("module:layers.1.attn")
    assert not any(n.startswith("recompute:") for n in plain_pushed)
    plan = resolve({"runs": {"ck": {"workload": "gpt", "size": "tiny", "mode": "train",
                                    "checkpoint": "layers"}}})
    assert plan.runs["ck"]["checkpoint"] == "layers"
