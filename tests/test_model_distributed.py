"""`workload: model` under DDP and FSDP2 on the CPU: the CS336 example and a user's CNN from a
factory file outside the repository, each as 2 gloo ranks under torchrun (pipeline/launch.py)
through the real workload; and the wrapping itself (workloads/parallel.py:
DistributedRun.wrap) on a one-rank process group: FSDP2 shards the structure's layers, then
the root; DDP broadcasts the buffers unless the factory declares them constant."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule

from workloads.gpt import GPT, config_for
from workloads.models import RunSettings, cs336_lm, options_of
from workloads.models import model as model_workload
from workloads.parallel import DistributedRun
from workloads.steps import Speed

REPO = Path(__file__).resolve().parent.parent
RANKS = 2
STEPS = 2
CS336_TINY = dict(d_model=32, d_ff=64, num_layers=2, num_heads=4, vocab_size=97,
                  context_length=16)

# A user's model in a file of its own: BatchNorm, whose running statistics every forward
# changes, so DDP must broadcast rank 0's buffers; no structure (the run names the layers).
USER_CNN = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from torch import nn


    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.conv = nn.Conv2d(width, width, 3, padding=1)
            self.bn = nn.BatchNorm2d(width)

        def forward(self, x):
            return x + F.relu(self.bn(self.conv(x)))


    class Net(nn.Module):
        def __init__(self, width=4):
            super().__init__()
            self.stem = nn.Conv2d(3, width, 3, padding=1)
            self.blocks = nn.Sequential(Block(width), Block(width))
            self.head = nn.Linear(width, 10)

        def forward(self, x):
            return self.head(self.blocks(self.stem(x)).mean((2, 3)))


    def make(width=4):
        def batch(n, device):
            g = torch.Generator().manual_seed(0)
            images = torch.randn(n, 3, 8, 8, generator=g)
            return images.to(device), torch.randint(0, 10, (n,), generator=g).to(device)

        return Net(width), batch, lambda out, labels: F.cross_entropy(out, labels)
""")


def _launch(out: Path, parallel: str, *workload: str) -> subprocess.Popen:
    """One run: RANKS gloo processes under torchrun, the workload as the pipeline starts it."""
    command = [sys.executable, "-m", "pipeline.launch", "--ranks", str(RANKS), "--device",
               "cpu", "--out", str(out), "--", sys.executable, "-m", "workloads", "model",
               *workload, "--mode", "train", "--parallel", parallel, "--gpus", str(RANKS),
               "--device", "cpu", "--warmup", "1", "--steps", str(STEPS), "--out", str(out)]
    log = out.with_suffix(".log").open("w")
    return subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict]:
    """(model, parallel) -> rank 0's record; the four runs start together (each mostly
    imports: on two cores, two at a time take as long as one after the other)."""
    tmp = tmp_path_factory.mktemp("model_distributed")
    (tmp / "user_cnn.py").write_text(USER_CNN)
    models = {
        "cs336": ["--factory", "workloads/models/cs336_lm.py:make", "--kwargs",
                  json.dumps(CS336_TINY), "--batch", "2"],
        "user_cnn": ["--factory", f"{tmp / 'user_cnn.py'}:make", "--layers", "blocks.*",
                     "--batch", "4"],
    }
    started = {(name, parallel): _launch(tmp / f"{name}_{parallel}.json", parallel, *args)
               for name, args in models.items() for parallel in ("ddp", "fsdp")}
    out = {}
    for (name, parallel), process in started.items():
        process.wait(timeout=300)
        path = tmp / f"{name}_{parallel}.json"
        log = path.with_suffix(".log").read_text()
        assert process.returncode == 0, log[-3000:]
        out[name, parallel] = json.loads(path.read_text())
    return out


def _layer_bytes(layer: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in layer.parameters())


def _per_step(record: dict, op: str) -> dict[int, float]:
    return {c["bytes"]: c["per_step"] for c in record["collectives"] if c["op"] == op}


@pytest.mark.parametrize("name", ["cs336", "user_cnn"])
def test_ddp_and_fsdp_train_a_model_on_two_ranks(records: dict, name: str) -> None:
    ddp, fsdp = records[name, "ddp"], records[name, "fsdp"]
    for parallel, record in (("ddp", ddp), ("fsdp", fsdp)):
        assert record["status"] == "ok", record["message"]
        assert record["distributed"]["parallel"] == parallel
        assert record["distributed"]["world_size"] == RANKS
        assert [len(s) for s in record["rank_step_ms"]] == [STEPS] * RANKS
        assert record["losses"][-1] < record["losses"][0]  # the optimizer steps
    # every rank sees the same batch: both average the same gradients, step for step
    assert fsdp["losses"] == pytest.approx(ddp["losses"], rel=1e-5)
    # DDP: one bucket of all fp32 gradients (the tiny models are under its 25 MB cap)
    assert ddp["collectives"] == [{"op": "all_reduce", "bytes": 4 * ddp["params_count"],
                                   "per_step": 1.0}]


def test_fsdp_shards_each_structural_layer_then_the_root(records: dict) -> None:
    """One reduce-scatter per FSDP unit and step: two layers and the root. The CS336 model's
    layers come from its factory's structure, the CNN's from the run's `layers` key."""
    layer = cs336_lm.make(**CS336_TINY).model.layers[0]
    cs336 = records["cs336", "fsdp"]
    assert cs336["structure"]["layers"] == "layers.*"
    assert sum(_per_step(cs336, "reduce_scatter").values()) == 3
    # each layer's parameters gathered in forward and again in backward (resharded)
    assert _per_step(cs336, "all_gather")[_layer_bytes(layer)] == 4
    cnn = records["user_cnn", "fsdp"]
    assert cnn["structure"]["layers"] == "blocks.*"
    assert sum(_per_step(cnn, "reduce_scatter").values()) == 3


# --- the wrapping, on a one-rank process group -----------------------------------------------


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _run(parallel: str) -> DistributedRun:
    args = argparse.Namespace(parallel=parallel, bucket_cap_mb=25.0, reshard_after_forward=True)
    return DistributedRun(args, torch.device("cpu"), 0, 0, 1, "gloo")


def _sharded(model: nn.Module) -> list[str]:
    return [path for path, m in model.named_modules() if isinstance(m, FSDPModule)]


def test_fsdp_units_are_the_structure_layers_and_the_root(one_rank: None) -> None:
    torch.manual_seed(0)
    gpt = _run("fsdp").wrap(GPT(config_for("tiny", context_length=16, vocab_size=64)))
    assert _sharded(gpt) == ["", "layers.0", "layers.1"]  # the GPT's, as before
    parts = cs336_lm.make(**CS336_TINY)
    model = _run("fsdp").wrap(parts.model, layers=parts.structure.layers)
    assert _sharded(model) == ["", "layers.0", "layers.1"]
    hf_style = nn.Sequential()
    hf_style.add_module("transformer", nn.Module())
    hf_style.transformer.add_module("h", nn.ModuleList(nn.Linear(4, 4) for _ in range(3)))
    hf_style.add_module("lm_head", nn.Linear(4, 8))
    wrapped = _run("fsdp").wrap(hf_style, layers="transformer.h.*")
    assert _sharded(wrapped) == ["", "transformer.h.0", "transformer.h.1", "transformer.h.2"]
    alone = _run("fsdp").wrap(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), layers="")
    assert _sharded(alone) == [""]  # no layers: one unit


def _wrapped_by_the_workload(factory: str, parallel: str) -> nn.Module:
    """The model the workload's build hands to DistributedRun.wrap, as wrapped there."""
    run, wrapped = _run(parallel), []

    def wrap(model: nn.Module, **how: object) -> nn.Module:
        wrapped.append(run.wrap(model, **how))
        return wrapped[-1]

    options = options_of("model", {"factory": factory, "batch": 2, "mode": "train",
                                   "parallel": parallel})
    model_workload.build(options, RunSettings("fp32", torch.device("cpu"), 0, Speed(), wrap))
    return wrapped[0]


def test_ddp_broadcasts_buffers_unless_the_factory_declares_them_constant(
        one_rank: None, tmp_path: Path) -> None:
    """BatchNorm's running statistics change in every forward: rank 0's must reach the
    others (DDP's default). The GPT's rotary tables, or a factory's declared constant ones,
    need no broadcast."""
    gpt = _run("ddp").wrap(GPT(config_for("tiny", context_length=16, vocab_size=64)))
    assert gpt.broadcast_buffers is False
    (tmp_path / "user_cnn.py").write_text(USER_CNN)
    cnn = _wrapped_by_the_workload(f"{tmp_path / 'user_cnn.py'}:make", "ddp")
    assert cnn.broadcast_buffers is True
    (tmp_path / "rope.py").write_text(textwrap.dedent(f"""
        import dataclasses
        from workloads.models import cs336_lm

        def make():
            parts = cs336_lm.make(**{CS336_TINY!r})
            return dataclasses.replace(parts, constant_buffers=True)
    """))
    rope = _wrapped_by_the_workload(f"{tmp_path / 'rope.py'}:make", "ddp")
    assert rope.broadcast_buffers is False
    # FSDP through the same build: the factory's structure names the units
    assert _sharded(_wrapped_by_the_workload(f"{tmp_path / 'rope.py'}:make", "fsdp")) == [
        "", "layers.0", "layers.1"]
