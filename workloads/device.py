"""Device selection, synchronization and mixed-precision helpers."""

import contextlib
import platform
from pathlib import Path

import torch

DTYPES = ("fp32", "bf16")


def resolve_device(name: str) -> torch.device:
    """Map the CLI's ``auto``/``cpu``/``cuda`` to a torch device, failing clearly."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on ``device``; CPU ops are already synchronous."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """Human-readable name of the accelerator, or the CPU model on CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_model()


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Mixed precision for ``bf16`` (weights stay fp32 masters); nothing for ``fp32``."""
    if dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if dtype == "fp32":
        return contextlib.nullcontext()
    raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
