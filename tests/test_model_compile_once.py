"""``compile_blocks: once`` for `workload: model`: the structure's layers share one nested
compile region (workloads/models/parts.py: compile_once), traced once whatever the depth,
computing what eager computes; layers of several classes are refused, naming them. CPU, real
torch.compile, the CS336 example model."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from pipeline.config import resolve
from workloads.models import RunSettings, cs336_lm, options_of
from workloads.models import model as model_workload
from workloads.models.parts import compile_once
from workloads.status import Unsupported
from workloads.steps import Speed

CS336_TINY = dict(d_model=32, d_ff=64, num_layers=2, num_heads=4, vocab_size=97,
                  context_length=16)
FACTORY = "workloads/models/cs336_lm.py:make"


def _parts(layers: int = 2) -> cs336_lm.ModelParts:
    torch.manual_seed(0)
    return cs336_lm.make(**{**CS336_TINY, "num_layers": layers})


def test_once_gives_every_layer_one_region_class_and_eager_is_unchanged() -> None:
    parts = _parts()
    tokens, _ = parts.make_batch(2, torch.device("cpu"))
    before = parts.model(tokens)
    layers = parts.structure.layer_modules(parts.model)
    compile_once(layers)
    region = type(layers[0])
    assert all(type(layer) is region for layer in layers)
    assert issubclass(region, cs336_lm.TransformerBlock) and region is not (
        cs336_lm.TransformerBlock)
    assert torch.equal(parts.model(tokens), before)  # a no-op outside torch.compile
    # the module paths, and so the module table's rows, stay the same
    assert [p for p, _ in parts.model.named_modules()] == [
        p for p, _ in _parts().model.named_modules()]


def _calls_traced(layers: int, once: bool) -> int:
    """Calls Dynamo put into graphs tracing the model's forward (its own backend: no code
    generated)."""
    torch._dynamo.reset()
    counters.clear()
    parts = _parts(layers)
    if once:
        compile_once(parts.structure.layer_modules(parts.model))
    tokens, _ = parts.make_batch(2, torch.device("cpu"))
    torch.compile(parts.model, backend="eager")(tokens)
    return counters["stats"]["calls_captured"]


def test_once_traces_the_layer_once_whatever_the_depth() -> None:
    each = _calls_traced(3, once=False) - _calls_traced(2, once=False)
    once = _calls_traced(3, once=True) - _calls_traced(2, once=True)
    assert each > 20  # every op of the layer, again in every layer
    assert once <= 3  # one call of the compiled region per extra layer


def _loss(compile: str, blocks: str) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward + backward step of the CS336 model built by the workload: its loss and
    the gradients the step left."""
    torch._dynamo.reset()
    options = options_of("model", {"factory": FACTORY, "kwargs": CS336_TINY, "batch": 2,
                                   "mode": "forward_backward", "compile_blocks": blocks})
    run = RunSettings("fp32", torch.device("cpu"), 0, Speed(compile=compile,
                                                            compile_blocks=blocks))
    built: list[torch.nn.Module] = []

    def keep(model: torch.nn.Module, **_: object) -> torch.nn.Module:
        built.append(model)  # the model the step trains (DDP/FSDP's place: no wrapper)
        return model

    run.wrap = keep
    step = model_workload.build(options, run).step
    loss = float(step().detach())
    return loss, {n: p.grad.clone() for n, p in built[0].named_parameters()}


def test_once_compiled_by_inductor_computes_the_eager_loss_and_gradients() -> None:
    """Inductor, two layers: the region's code runs twice in forward and in backward (with
    buffer reuse, torch once broke all but the last layer's gradients: NESTED_REGION_OPTIONS
    in workloads/steps.py)."""
    eager_loss, eager_grads = _loss("off", "each")
    once_loss, once_grads = _loss("default", "once")
    assert once_loss == pytest.approx(eager_loss, rel=1e-5)
    assert once_grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        torch.testing.assert_close(once_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_once_refuses_layers_of_several_classes_naming_them() -> None:
    # `layers` naming the blocks and the LM head: two classes, no one region for both
    options = options_of("model", {"factory": FACTORY, "kwargs": CS336_TINY, "batch": 2,
                                   "compile_blocks": "once", "layers": "layers.*|lm_head"})
    run = RunSettings("fp32", torch.device("cpu"), 0, Speed(compile="default"))
    with pytest.raises(Unsupported, match=r"2 classes \(Linear, TransformerBlock\)"):
        model_workload.build(options, run)
    with pytest.raises(ValueError, match="compile_blocks once needs layers"):
        compile_once([])


def test_a_config_takes_once_for_a_model() -> None:
    run = {"workload": "model", "factory": FACTORY, "compile": "default",
           "compile_blocks": "once"}
    assert resolve({"results": "r", "runs": {"m": run}}).runs["m"]["compile_blocks"] == "once"
