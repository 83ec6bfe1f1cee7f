"""``compile_blocks`` on the GPT, by the builder every model goes through
(workloads/models/builder.py): the block compiled once for every layer (a nested compile
region, workloads/models/parts.py: compile_once), each layer's block compiled on its own
(regional compilation: compile_regional) or every layer traced into one flat graph (the
default). CPU, real torch.compile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from workloads.gpt import GPT, Block, config_for
from workloads.models.builder import CAPTURE_ENV, build_gpt, compile_regional
from workloads.models.parts import compile_once
from workloads.module_ranges import ModuleRanges
from workloads.steps import NESTED_REGION_OPTIONS, Speed, compile_callable

REPO = Path(__file__).resolve().parents[1]


def _model(blocks: str, layers: int) -> GPT:
    torch.manual_seed(0)
    model = GPT(config_for("tiny", context_length=32, vocab_size=512, n_layers=layers))
    if blocks == "once":
        compile_once(list(model.layers))
    return model


def compile_regions(model: GPT, mode: str) -> None:
    compile_regional(list(model.layers), mode)


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
    assert type(each.layers[0]) is Block
    assert type(once.layers[0]).__name__ == "BlockCompiledOnce"
    assert isinstance(once.layers[0], Block)
    assert torch.equal(each(_tokens()), once(_tokens()))  # a no-op outside torch.compile


def test_once_traces_the_block_once_whatever_the_depth() -> None:
    each = {n: _calls_traced("each", n) for n in (2, 4)}
    once = {n: _calls_traced("once", n) for n in (2, 4)}
    per_layer_each = (each[4] - each[2]) / 2
    per_layer_once = (once[4] - once[2]) / 2
    assert per_layer_each > 20  # every op of the block, again in every layer
    assert per_layer_once <= 3  # one call of the compiled region per extra layer
    assert once[4] < each[4] / 5


def _frames_traced(layers: int) -> tuple[int, int]:
    """(ops Dynamo traced, graphs it made) while compiling a regional model's forward and
    backward."""
    torch._dynamo.reset()
    counters.clear()
    model = _model("regional", layers)
    compile_regions(model, "default")
    with torch._dynamo.config.patch(cache_size_limit=2):  # a recompile per layer would show
        model(_tokens()).sum().backward()
    return counters["stats"]["calls_captured"], counters["stats"]["unique_graphs"]


def test_regional_traces_one_block_whatever_the_depth() -> None:
    shallow, deep = _frames_traced(2), _frames_traced(6)
    assert deep == shallow  # the blocks after the first reuse its code: no tracing per layer
    assert shallow[1] == 1  # one graph for the block (the final norm runs eagerly)
    assert not counters["recompiles"]  # no block failed the first one's guards


def _graphs_under_capture_hooks(layers: int, skip_regions: bool) -> int:
    """Graphs Dynamo made of a regional model's block with the capture's module ranges
    installed as the builder installs them (module_ranges.ModuleRanges)."""
    torch._dynamo.reset()
    counters.clear()
    model = _model("regional", layers)
    regions = list(model.layers)
    ranges = ModuleRanges(model, 3, regions if skip_regions else [])
    compile_regions(model, "default")
    model(_tokens()).sum().backward()
    ranges.close_open()
    ranges.remove()
    return counters["stats"]["unique_graphs"]


def test_capture_hooks_leave_a_regional_block_compiled_once() -> None:
    # hooks inside the block are per-instance guards: each layer recompiled the block's code,
    # and past recompile_limit (8) the capture ran the remaining layers eagerly
    assert _graphs_under_capture_hooks(3, skip_regions=False) == 3
    assert _graphs_under_capture_hooks(3, skip_regions=True) == 1


def _graphs_of_regional_gpt(monkeypatch: pytest.MonkeyPatch, capture: str) -> int:
    monkeypatch.setenv(CAPTURE_ENV, capture)
    torch._dynamo.reset()
    counters.clear()
    workload = build_gpt(size="tiny", context=32, batch=2, vocab=512, mode="train",
                         dtype="fp32", attention="sdpa", device=torch.device("cpu"), seed=0,
                         speed=Speed(compile="default", compile_blocks="regional"))
    for _ in range(2):
        workload.step()
    return counters["stats"]["unique_graphs"]


def test_a_captured_regional_gpt_compiles_as_the_timed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture process (PROFBENCH_CAPTURE=1) runs the timed program: the builder keeps the
    module ranges out of the compiled layers (with them, one more graph per layer)."""
    assert _graphs_of_regional_gpt(monkeypatch, "1") == _graphs_of_regional_gpt(monkeypatch, "0")


def test_regional_gradients_and_losses_equal_eager_ones() -> None:
    torch._dynamo.reset()
    model = _model("regional", 3)
    assert type(model.layers[0]) is Block
    grads, logits = [], []
    for compiled in (False, True):
        if compiled:
            compile_regions(model, "default")
        model.zero_grad(set_to_none=True)
        out = model(_tokens())
        F.cross_entropy(out.flatten(0, 1), _tokens().flatten()).backward()
        logits.append(out.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-5)
    eager, regional = grads
    for name, g in eager.items():
        torch.testing.assert_close(regional[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert all(type(layer).__name__ == "Block" for layer in model.layers)  # compiled in place
    assert "_orig_mod" not in "".join(dict(model.named_parameters()))  # names unchanged


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


def _master_losses(blocks: str, dtype: str, steps: int = 4) -> list[float]:
    torch._dynamo.reset()
    workload = build_gpt(size="tiny", context=32, batch=2, vocab=512, mode="train",
                         dtype=dtype, attention="sdpa", device=torch.device("cpu"), seed=0,
                         speed=Speed(optimizer="adamw_master", compile="default",
                                     compile_blocks=blocks))
    return [workload.step().item() for _ in range(steps)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_once_trains_with_master_weights_as_each_does(dtype: str) -> None:
    """adamw_master's weights are segments of one flat buffer. As views of one storage a
    nested compile region refused them ('Encountered aliasing during higher order op
    tracing'); each segment now has a storage of its own (workloads/optim.py)."""
    each, once = _master_losses("each", dtype), _master_losses("once", dtype)
    regional = _master_losses("regional", dtype)
    assert once[-1] < once[0]  # the optimizer's writes to the flat buffer reach the model
    assert once == pytest.approx(each, rel=1e-6 if dtype == "fp32" else 1e-4)
    assert regional == pytest.approx(each, rel=1e-6 if dtype == "fp32" else 1e-4)


def test_master_weights_are_separate_tensors_over_the_flat_buffers() -> None:
    from workloads.optim import MasterAdamW

    model = _model("each", 2)
    optimizer = MasterAdamW(model, lr=1e-3, low_precision=torch.bfloat16)
    storages = {p.untyped_storage()._cdata for p in model.parameters()}
    assert len(storages) == len(list(model.parameters()))  # no two share a storage
    weight = model.lm_head.weight  # a bf16 segment of the shadow buffer
    assert weight.data_ptr() in range(optimizer.shadow.data_ptr(),
                                      optimizer.shadow.data_ptr() + optimizer.shadow.nbytes)
    optimizer.shadow.fill_(0.5)
    assert torch.all(weight == 0.5)  # the same memory, not a copy


def test_the_workload_records_its_setting_and_the_config_hash_of_each_is_unchanged() -> None:
    """Compiled `once`: a new config hash; `each` is how compiled runs compiled before the
    key existed, and an uncompiled run ignores it: their hashes stay what they were. The
    record's params and hash as the workload computes them (workloads/__main__.py); that
    `once` and `each` compute the same step: test_once_gradients_equal_eager_ones."""
    from workloads.__main__ import build_parser, hashed_params, record_params
    from workloads.provenance import config_hash

    def record(*flags: str) -> tuple[dict, str]:
        args = build_parser().parse_args(
            ["gpt", "--size", "tiny", "--context", "32", "--vocab", "512", "--mode", "train",
             "--warmup", "1", "--steps", "2", "--device", "cpu", "--out", "r.json", *flags])
        params = record_params(args, torch.device("cpu"))
        return params, config_hash(hashed_params(params))

    (eager, eager_hash), (eager_once, eager_once_hash) = record(), record(
        "--compile_blocks", "once")
    assert eager["compile_blocks"] == "each" and eager_once["compile_blocks"] == "once"
    assert eager_once_hash == eager_hash
    (_, once_hash), (each, each_hash) = (record("--compile", "default", "--compile_blocks",
                                                "once"), record("--compile", "default"))
    assert once_hash != each_hash
    # `each` hashes as a compiled run did before the key existed
    # (nor do checkpoint and float8, the GPT's later keys, at their defaults)
    later = ("compile_blocks", "checkpoint", "float8")
    without_key = {k: v for k, v in each.items() if k not in later}
    hashed = {k: v for k, v in without_key.items()
              if k != "out" and (k, v) not in {("op_ranges", "off"), ("cuda_graph", "off")}}
    assert each_hash == config_hash(hashed)
