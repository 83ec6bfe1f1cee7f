"""Measured peaks of this device: large-matmul TFLOP/s per dtype and device-to-device copy GB/s.

Datasheet peaks are leads; MFU against a measured matmul peak says how far a workload is from
what this GPU, driver and torch actually reach. Results are cached per device under
``$PROFBENCH_CACHE/calibration/<key>.json`` (key = device name + driver + torch version).
"""

import json
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workloads import flops
from workloads.cachedir import cache_dir as profbench_cache
from workloads.device import DTYPES, device_name, synchronize
from workloads.jsonfile import write_whole
from workloads.provenance import provenance

# Matmul edge and copy size: large enough to fill an H100; small on CPU so tests stay fast.
MATMUL_N = {"cuda": 8192, "cpu": 256}
COPY_BYTES = {"cuda": 1 << 30, "cpu": 16 << 20}
REPEATS = {"cuda": 20, "cpu": 5}


def cache_dir() -> Path:
    return profbench_cache() / "calibration"


def device_key(device: torch.device) -> str:
    """File-name-safe key: device name, driver, torch version."""
    raw = f"{device_name(device)}-driver{_driver_version(device)}-torch{torch.__version__}"
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", raw).strip("_")


def calibrate(device: torch.device, dtypes: list[str], refresh: bool = False) -> dict[str, Any]:
    """Measured peaks of ``device``, from the cache unless ``refresh`` or a dtype is missing."""
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
    key = device_key(device)
    path = cache_dir() / f"{key}.json"
    if path.is_file() and not refresh:
        cached = json.loads(path.read_text())
        if set(dtypes) <= set(cached["matmul_tflops"]):
            return {**cached, "cached": True}
    name = device_name(device)
    result = {
        "device_name": name,
        "key": key,
        "matmul_tflops": {d: matmul_tflops(device, d) for d in dtypes},
        "copy_gbps": copy_gbps(device),
        "datasheet_tflops": {d: flops.peak_tflops(name, d) for d in dtypes},
        "matmul_n": MATMUL_N[device.type],
        "copy_bytes": COPY_BYTES[device.type],
        "cached": False,
        "provenance": provenance(),
    }
    # whole: a pipeline running beside this one (the test suite runs several at once) reads
    # the old file or the new one, never half of one
    write_whole(path, result)
    return result


def matmul_tflops(device: torch.device, dtype: str) -> float:
    """Median TFLOP/s of an n x n x n matmul (2n^3 FLOPs) on random data."""
    n = MATMUL_N[device.type]
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    a, b = (torch.randn(n, n, device=device).to(torch_dtype) for _ in range(2))
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        ms = median_ms(lambda: torch.mm(a, b), device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2 * n**3 / (ms / 1e3) / 1e12


def copy_gbps(device: torch.device) -> float:
    """Median GB/s of a device-to-device copy, counting bytes read plus bytes written."""
    nbytes = COPY_BYTES[device.type]
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device)
    return 2 * nbytes / (ms / 1e3) / 1e9


def median_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Median time of ``fn`` over repeated calls: CUDA events on CUDA, host clock on CPU."""
    for _ in range(3):
        fn()
    synchronize(device)
    times = []
    for _ in range(REPEATS[device.type]):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _driver_version(device: torch.device) -> str:
    if device.type != "cuda":
        return "none"
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - no NVML: the CUDA runtime version still separates builds
        return f"cuda{torch.version.cuda}"
