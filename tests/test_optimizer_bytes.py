"""Bytes one optimizer step must move (workloads/optim.py), as the workload records them for
the optimizer roofline (analysis/metrics/roofline.py)."""

from __future__ import annotations

import torch
from torch import nn

from workloads.flops import peak_memory_gbps
from workloads.gpt import GPT, config_for
from workloads.models.builder import build_gpt
from workloads.steps import Speed

CPU = torch.device("cpu")


def _gpt(optimizer: str, dtype: str):
    return build_gpt(size="tiny", context=16, batch=1, vocab=1000, mode="train", dtype=dtype,
                     attention="naive", device=CPU, seed=0, speed=Speed(optimizer=optimizer))


def test_torch_adamw_moves_seven_fp32_tensors_per_parameter() -> None:
    for optimizer in ("adamw_foreach", "adamw_fused"):
        w = _gpt(optimizer, "fp32")
        assert w.optimizer_bytes_per_step == 7 * 4 * w.params_count


def test_master_adamw_adds_its_gathers_and_bf16_copies() -> None:
    w = _gpt("adamw_master", "bf16")
    model = GPT(config_for("tiny", context_length=16, vocab_size=1000, attention="naive"))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    rest = w.params_count - linear
    # bf16-shadowed weights: gather 2+2, state 24, gradient 2, copy 2; fp32 rest: 8 + 24 + 4
    assert w.optimizer_bytes_per_step == 32 * linear + 36 * rest
    assert _gpt("adamw_master", "fp32").optimizer_bytes_per_step == 36 * w.params_count


def test_datasheet_bandwidth_of_known_gpus() -> None:
    assert peak_memory_gbps("NVIDIA H100 80GB HBM3") == 3350.0
    assert peak_memory_gbps("NVIDIA H100 PCIe") == 2000.0
    assert peak_memory_gbps("NVIDIA H200") == 4800.0
    assert peak_memory_gbps("Intel(R) Xeon(R) Processor") is None
