"""``compile_blocks``: the GPT block compiled once for every layer (a nested compile region,
workloads/gpt.py) or every layer traced into one flat graph (the default). CPU, real
torch.compile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from workloads.gpt import GPT, Block, BlockCompiledOnce, config_for
from workloads.status import Unsupported
from workloads.steps import NESTED_REGION_OPTIONS, Speed, build_gpt, compile_callable

REPO = Path(__file__).resolve().parents[1]


def _model(blocks: str, layers: int) -> GPT:
    torch.manual_seed(0)
    return GPT(config_for("tiny", context_length=32, vocab_size=512, compile_blocks=blocks,
                          n_layers=layers))


def _tokens() -> torch.Tensor:
    return torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(1))


def _calls_traced(blocks: str, layers: int) -> int:
    """Calls Dynamo put into graphs while compiling forward and backward of the model."""
    torch._dynamo.reset()
    counters.clear()
    torch.compile(_model(blocks, layers), backend="aot_eager")(_tokens()).sum().backward()
    return counters["stats"]["calls_captured"]


def test_each_setting_builds_its_block_and_eager_outputs_are_the_same() -> None:
    each, once = _model("each", 2), _model("once", 2)
    assert type(each.layers[0]) is Block and type(once.layers[0]) is BlockCompiledOnce
    assert torch.equal(each(_tokens()), once(_tokens()))  # a no-op outside torch.compile
    with pytest.raises(ValueError, match="compile_blocks"):
        config_for("tiny", compile_blocks="twice")


def test_once_traces_the_block_once_whatever_the_depth() -> None:
    each = {n: _calls_traced("each", n) for n in (2, 4)}
    once = {n: _calls_traced("once", n) for n in (2, 4)}
    per_layer_each = (each[4] - each[2]) / 2
    per_layer_once = (once[4] - once[2]) / 2
    assert per_layer_each > 20  # every op of the block, again in every layer
    assert per_layer_once <= 3  # one call of the compiled region per extra layer
    assert once[4] < each[4] / 5


def test_once_gradients_equal_eager_ones() -> None:
    """Three layers, Inductor: the region's code runs three times in the backward, where
    torch's buffer reuse broke the gradients of all but the last layer (steps.py,
    NESTED_REGION_OPTIONS)."""
    torch._dynamo.reset()
    model = _model("once", 3)
    grads = []
    for fn in (model, compile_callable(model, "default", NESTED_REGION_OPTIONS)):
        model.zero_grad(set_to_none=True)
        logits = fn(_tokens())
        F.cross_entropy(logits.flatten(0, 1), _tokens().flatten()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    eager, compiled = grads
    for name, g in eager.items():
        torch.testing.assert_close(compiled[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_once_with_master_weights_is_unsupported() -> None:
    """adamw_master's weights alias one flat buffer: the region would refuse them (H100,
    torch 2.11: 'Input-to-input aliasing'). Without compile, or without training, it runs."""
    def build(**speed: str) -> None:
        build_gpt(size="tiny", context=32, batch=2, vocab=512, mode=speed.pop("mode", "train"),
                  dtype="fp32", attention="sdpa", device=torch.device("cpu"), seed=0,
                  speed=Speed(optimizer="adamw_master", compile_blocks="once", **speed))

    with pytest.raises(Unsupported, match="compile_blocks once with optimizer adamw_master"):
        build(compile="default")
    build(compile="off")
    build(compile="default", mode="forward_backward")


def test_the_workload_records_its_setting_and_the_config_hash_of_each_is_unchanged(
        tmp_path: Path) -> None:
    """Compiled `once`: a new config hash; `each` is how compiled runs compiled before the
    key existed, and an uncompiled run ignores it: their hashes stay what they were."""
    def record(*flags: str) -> dict:
        out = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
        subprocess.run([sys.executable, "-m", "workloads", "gpt", "--size", "tiny",
                        "--context", "32", "--vocab", "512", "--mode", "train", "--warmup", "1",
                        "--steps", "2", "--device", "cpu", "--out", str(out), *flags],
                       cwd=REPO, check=True, capture_output=True)
        return json.loads(out.read_text())

    eager = record()
    eager_once = record("--compile_blocks", "once")
    assert eager["params"]["compile_blocks"] == "each"
    assert eager_once["params"]["compile_blocks"] == "once"
    assert eager_once["provenance"]["config_hash"] == eager["provenance"]["config_hash"]
    once = record("--compile", "default", "--compile_blocks", "once")
    each = record("--compile", "default")
    assert once["status"] == each["status"] == "ok"
    assert once["losses"] == pytest.approx(each["losses"], rel=1e-5)
    assert once["provenance"]["config_hash"] != each["provenance"]["config_hash"]
    without_key = dict(each["params"])
    del without_key["compile_blocks"]
    from workloads.provenance import config_hash

    hashed = {k: v for k, v in without_key.items()
              if k != "out" and (k, v) not in {("op_ranges", "off"), ("cuda_graph", "off")}}
    assert each["provenance"]["config_hash"] == config_hash(hashed)
