"""Device selection, synchronization, numeric precision and mixed-precision helpers."""

import contextlib
import platform
from pathlib import Path

import torch

# fp32: plain fp32 matmuls; tf32: fp32 tensors, TF32 tensor-core matmuls/convs;
# bf16 / fp16: autocast with fp32 master weights (fp16 adds a GradScaler when training).
DTYPES = ("fp32", "tf32", "bf16", "fp16")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


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


def configure_precision(dtype: str) -> None:
    """Process-wide matmul precision: TF32 only for ``tf32`` (torch's default is off)."""
    _check_dtype(dtype)
    tf32 = dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def compute_dtype(dtype: str) -> torch.dtype:
    """The dtype the matmuls see: the autocast dtype, else float32."""
    _check_dtype(dtype)
    return AUTOCAST_DTYPES.get(dtype, torch.float32)


def autocast(device: torch.device, dtype: str) -> contextlib.AbstractContextManager:
    """Mixed precision for ``bf16``/``fp16`` (weights stay fp32 masters); nothing otherwise."""
    _check_dtype(dtype)
    if dtype in AUTOCAST_DTYPES:
        return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[dtype])
    return contextlib.nullcontext()


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
