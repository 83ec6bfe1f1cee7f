"""The example model factories (workloads/models/cs336_lm.py, resnet.py, hf_causal_lm.py) at
tiny sizes on the CPU, and benchmarks/plain_models.py's CPU smoke. Real models, no mocks."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from workloads.models import cs336_lm, hf_causal_lm, resnet
from workloads.models.parts import ModelParts, Structure, import_torchvision

REPO = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")

CS336_TINY = dict(d_model=32, d_ff=64, num_layers=2, num_heads=4, vocab_size=97,
                  context_length=16)
RESNET_TINY = dict(depth=18, image_size=32, num_classes=10)
# beside this machine's CPU-only torch, PyPI's torchvision needs its import made to work
# (parts.import_torchvision); transformers' models import it
import_torchvision()

HF_TINY = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=101, context_length=16)


def _forward(parts: ModelParts, inputs: object) -> object:
    if isinstance(inputs, dict):
        return parts.model(**inputs)
    if isinstance(inputs, tuple):
        return parts.model(*inputs)
    return parts.model(inputs)


def _check_train_step(parts: ModelParts, batch_size: int = 2) -> torch.Tensor:
    """One forward, loss and backward: a finite scalar loss and a finite gradient for every
    parameter."""
    inputs, targets = parts.make_batch(batch_size, CPU)
    loss = parts.loss(_forward(parts, inputs), targets)
    assert loss.dim() == 0 and loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    for name, param in parts.model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
    return loss.detach()


def _check_batch_deterministic(parts: ModelParts) -> None:
    (x1, y1), (x2, y2) = parts.make_batch(3, CPU), parts.make_batch(3, CPU)
    tensors1 = list(x1.values()) if isinstance(x1, dict) else [x1]
    tensors2 = list(x2.values()) if isinstance(x2, dict) else [x2]
    for a, b in zip([*tensors1, y1], [*tensors2, y2], strict=True):
        assert a.device == CPU and a.shape[0] == 3
        assert torch.equal(a, b)
        assert a.count_nonzero() > a.numel() // 2  # random data, not zeros
    assert not torch.equal(tensors1[0][0], tensors1[0][1])  # the samples differ


def _layers(parts: ModelParts) -> set[str]:
    names = [name for name, _ in parts.model.named_modules()]
    return {layer for name in names if (layer := parts.structure.layer_of(name))}


# --- CS336 Transformer LM ---------------------------------------------------------------


def test_cs336_parts_and_batch() -> None:
    parts = cs336_lm.make(**CS336_TINY)
    assert isinstance(parts, ModelParts)
    assert parts.items_per_sample == 16
    tokens, targets = parts.make_batch(4, CPU)
    assert tokens.shape == targets.shape == (4, 16)
    assert tokens.dtype == targets.dtype == torch.int64
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 97
    _check_batch_deterministic(parts)
    assert parts.model(tokens).shape == (4, 16, 97)


def test_cs336_module_names_and_structure() -> None:
    parts = cs336_lm.make(**CS336_TINY)
    names = {name for name, _ in parts.model.named_modules()}
    expected = {"token_embeddings", "layers.0", "layers.1", "ln_final", "lm_head"}
    for i in (0, 1):
        expected |= {f"layers.{i}.{n}" for n in (
            "attn", "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.output_proj",
            "ffn", "ffn.w1", "ffn.w2", "ffn.w3", "ln1", "ln2")}
    assert expected <= names
    assert not any(n.endswith("bias") for n, _ in parts.model.named_parameters())
    # untied: the LM head has its own weight
    assert parts.model.lm_head.weight.data_ptr() != parts.model.token_embeddings.weight.data_ptr()

    s = parts.structure
    assert s == Structure(layers="layers.*", sublayers="attn|ffn|ln1|ln2")
    assert _layers(parts) == {"layers.0", "layers.1"}
    assert s.layer_of("layers") is None and s.layer_of("lm_head") is None
    assert s.layer_of("layers.1.attn.q_proj") == "layers.1"
    assert s.sublayer_of("layers.1.attn.q_proj") == "attn"
    assert s.sublayer_of("layers.0.ffn.w2") == "ffn"
    assert s.sublayer_of("layers.0.ln2") == "ln2"


@pytest.mark.parametrize("size", [
    CS336_TINY,
    dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12, vocab_size=10_000,
         context_length=512),  # the defaults: CS336's small
])
def test_cs336_parameter_count(size: dict) -> None:
    with torch.device("meta"):  # shapes only: no memory, no init time
        parts = cs336_lm.make(**size)
    counted = sum(p.numel() for p in parts.model.parameters())
    d, f, n, v = size["d_model"], size["d_ff"], size["num_layers"], size["vocab_size"]
    assert counted == cs336_lm.count_parameters(d, f, n, v)
    assert counted == 2 * v * d + n * (4 * d * d + 3 * d * f + 2 * d) + d
    if d == 768:
        assert counted == 128_625_408


def test_cs336_train_step_and_fp32_loss() -> None:
    torch.manual_seed(0)
    parts = cs336_lm.make(**CS336_TINY)
    loss = _check_train_step(parts)
    # random init: about ln(vocab)
    assert abs(float(loss) - torch.log(torch.tensor(97.0)).item()) < 1.0
    tokens, targets = parts.make_batch(2, CPU)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = parts.model(tokens)
        loss = parts.loss(logits, targets)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32


def test_cs336_is_causal() -> None:
    torch.manual_seed(0)
    parts = cs336_lm.make(**CS336_TINY)
    model = parts.model.eval()
    tokens, _ = parts.make_batch(1, CPU)
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 97
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_cs336_stands_alone_as_a_users_file(tmp_path: Path) -> None:
    """A copy anywhere imports by path (``factory: path/to/file.py:make``): torch and the
    factory contract only, none of profbench's own model code."""
    source = (REPO / "workloads" / "models" / "cs336_lm.py").read_text()
    imports = {line for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert {line for line in imports if "workloads" in line} == {
        "from workloads.models.parts import ModelParts, Structure"}
    copy = tmp_path / "my_lm.py"
    copy.write_text(source)
    spec = importlib.util.spec_from_file_location("my_lm", copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parts = module.make(**CS336_TINY)
    tokens, targets = parts.make_batch(2, CPU)
    assert parts.loss(parts.model(tokens), targets).dim() == 0


# --- torchvision ResNet -----------------------------------------------------------------


def test_resnet_parts_batch_and_train_step() -> None:
    parts = resnet.make(**RESNET_TINY)
    assert isinstance(parts, ModelParts) and parts.items_per_sample == 1
    images, labels = parts.make_batch(2, CPU)
    assert images.shape == (2, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (2,) and labels.dtype == torch.int64 and int(labels.max()) < 10
    _check_batch_deterministic(parts)
    _check_train_step(parts)
    # channels-last, as profbench sets it up when the run asks
    model = parts.model.to(memory_format=torch.channels_last)
    out = model(images.contiguous(memory_format=torch.channels_last))
    assert out.shape == (2, 10)


def test_resnet_structure() -> None:
    parts = resnet.make(**RESNET_TINY)
    s = parts.structure
    # resnet18: two basic blocks per stage
    assert _layers(parts) == {f"layer{i}.{j}" for i in (1, 2, 3, 4) for j in (0, 1)}
    assert s.layer_of("layer1") is None and s.layer_of("conv1") is None
    assert s.layer_of("fc") is None
    assert s.layer_of("layer1.0") == "layer1.0"
    assert s.layer_of("layer1.0.conv1") == "layer1.0"
    assert s.sublayer_of("layer1.0.conv1") == "conv1"
    assert s.sublayer_of("layer3.1.bn2") == "bn2"
    assert s.layer_of("layer2.0.downsample.0") == "layer2.0"
    assert s.sublayer_of("layer2.0.downsample.1") == "downsample"
    assert s.sublayer_of("layer1.0.relu") is None


def test_resnet50_is_torchvisions() -> None:
    with torch.device("meta"):
        parts = resnet.make()
    assert sum(p.numel() for p in parts.model.parameters()) == 25_557_032  # ResNet-50
    assert "layer4.2.conv3" in dict(parts.model.named_modules())
    assert parts.structure.layer_of("layer4.2.conv3") == "layer4.2"


def test_resnet_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="depth"):
        resnet.make(depth=42)
    with pytest.raises(ValueError, match="width_per_group"):
        resnet.make(depth=18, width_per_group=128)


# --- HuggingFace causal LM --------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hf_parts_batch_and_train_step(arch: str) -> None:
    torch.manual_seed(0)
    parts = hf_causal_lm.make(arch=arch, **HF_TINY)
    assert isinstance(parts, ModelParts) and parts.items_per_sample == 16
    assert parts.model.config.use_cache is False
    assert parts.model.config._attn_implementation == "sdpa"
    inputs, targets = parts.make_batch(2, CPU)
    assert set(inputs) == {"input_ids"}
    assert inputs["input_ids"].shape == targets.shape == (2, 16)
    assert inputs["input_ids"].dtype == targets.dtype == torch.int64
    _check_batch_deterministic(parts)
    loss = _check_train_step(parts)
    assert abs(float(loss) - torch.log(torch.tensor(101.0)).item()) < 1.0


@pytest.mark.parametrize("arch, path, layer, sublayer, n_layers", [
    ("gpt2", "transformer.h.0.attn.c_attn", "transformer.h.0", "attn", 2),
    ("gpt2", "transformer.h.1.mlp.c_fc", "transformer.h.1", "mlp", 2),
    ("gpt2", "transformer.h.1.ln_2", "transformer.h.1", "ln_2", 2),
    ("llama", "model.layers.1.self_attn.q_proj", "model.layers.1", "self_attn", 2),
    ("llama", "model.layers.0.mlp.gate_proj", "model.layers.0", "mlp", 2),
    ("llama", "model.layers.0.input_layernorm", "model.layers.0", "input_layernorm", 2),
])
def test_hf_structure(arch: str, path: str, layer: str, sublayer: str, n_layers: int) -> None:
    parts = hf_causal_lm.make(arch=arch, **HF_TINY)
    s = parts.structure
    assert path in dict(parts.model.named_modules())
    assert s.layer_of(path) == layer and s.sublayer_of(path) == sublayer
    stack = layer.rsplit(".", 1)[0]
    assert _layers(parts) == {f"{stack}.{i}" for i in range(n_layers)}
    assert s.layer_of(stack) is None and s.layer_of("lm_head") is None


def test_hf_defaults() -> None:
    with torch.device("meta"):
        gpt2 = hf_causal_lm.make()
    assert sum(p.numel() for p in gpt2.model.parameters()) == 124_439_808  # GPT-2 small
    assert gpt2.items_per_sample == 1024
    with torch.device("meta"):
        llama = hf_causal_lm.make(arch="llama")
    assert llama.model.config.intermediate_size == 2048  # 8/3 * 768, up to a multiple of 256
    assert llama.model.config.tie_word_embeddings is False
    with pytest.raises(ValueError, match="arch"):
        hf_causal_lm.make(arch="bert")


def test_hf_never_touches_the_network(tmp_path: Path) -> None:
    """Both architectures built and run in a fresh process whose sockets all fail, without
    HF_HUB_OFFLINE set by the caller (the factory sets it)."""
    script = textwrap.dedent(f"""
        import os, socket

        def refuse(*args, **kwargs):
            raise OSError("network access in a test")

        socket.socket.connect = socket.socket.connect_ex = refuse
        socket.getaddrinfo = socket.create_connection = refuse

        import torch
        from workloads.models import hf_causal_lm

        for arch in ("gpt2", "llama"):
            parts = hf_causal_lm.make(arch=arch, **{HF_TINY!r})
            inputs, targets = parts.make_batch(2, torch.device("cpu"))
            parts.loss(parts.model(**inputs), targets).backward()
        print("offline", os.environ["HF_HUB_OFFLINE"])
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty cache: nothing to find locally either
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("offline 1")


# --- benchmarks/plain_models.py ---------------------------------------------------------


@pytest.mark.parametrize("model, args", [
    ("resnet", ["--depth", "18", "--image-size", "32", "--num-classes", "10"]),
    ("gpt2", ["--n-layer", "2", "--n-embd", "32", "--n-head", "4", "--vocab-size", "101",
              "--context", "16"]),
])
def test_plain_models_cpu_smoke(tmp_path: Path, model: str, args: list[str]) -> None:
    out = tmp_path / "plain.json"
    # the script as it runs, after the CPU-only torch's torchvision fix (module docstring)
    launch = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
              "sys.argv[0] = sys.argv.pop(1); "
              "from workloads.models.parts import import_torchvision; import_torchvision(); "
              "runpy.run_path(sys.argv[0], run_name='__main__')")
    script = REPO / "benchmarks" / "plain_models.py"
    cmd = [sys.executable, "-c", launch, str(REPO), str(script), "--model", model, *args,
           "--batch", "2", "--steps", "2", "--warmup", "1", "--device", "cpu", "--no-compile",
           "--out", str(out)]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ms/step" in done.stdout
    result = json.loads(out.read_text())
    assert len(result["step_ms"]) == 2 and len(result["warmup_ms"]) == 1
    assert all(t > 0 for t in result["step_ms"])
    assert result["median_ms"] > 0 and result["timer"] == "wall"
    assert result["torch"] == torch.__version__
    assert result["args"]["batch"] == 2 and result["params"] > 0


def test_plain_models_stands_alone() -> None:
    """The baseline must not measure profbench's own code."""
    source = (REPO / "benchmarks" / "plain_models.py").read_text()
    assert "workloads" not in source
