"""GPU state around the measured steps, read through NVML (``pynvml`` from nvidia-ml-py).

Clocks, temperature, power, throttle reasons and the other processes on the GPU are read
before and after the measured steps, so a slow run can be told apart from a throttled or a
shared GPU. Without NVML (CPU runs, no library, no GPU) the state is
``{"available": false, "reason": ...}``, never an error.
"""

import os
from typing import Any

import torch

# NVML's clock-throttle reason bits (pynvml constant suffix -> name in the JSON).
REASONS = (
    ("GpuIdle", "gpu_idle"),
    ("ApplicationsClocksSetting", "applications_clocks_setting"),
    ("SwPowerCap", "sw_power_cap"),
    ("HwSlowdown", "hw_slowdown"),
    ("SyncBoost", "sync_boost"),
    ("SwThermalSlowdown", "sw_thermal_slowdown"),
    ("HwThermalSlowdown", "hw_thermal_slowdown"),
    ("HwPowerBrakeSlowdown", "hw_power_brake_slowdown"),
    ("DisplayClockSetting", "display_clock_setting"),
)
# Reasons that mean the GPU ran below the clocks it was asked for: power, thermal, hardware.
# A software power cap is the normal state of a GPU at full load (it trims clocks to stay
# within the power limit): reported as `power_capped`, not as a throttled (misleading) run.
SLOWDOWNS = {
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
}


def decode_reasons(mask: int, nvml: Any) -> list[str]:
    """Names of the throttle-reason bits set in ``mask`` (``nvml``: the pynvml module)."""
    names = []
    for suffix, name in REASONS:
        bit = getattr(nvml, f"nvmlClocksThrottleReason{suffix}", None)
        if bit is None:  # newer NVML names them "clocks event reasons"
            bit = getattr(nvml, f"nvmlClocksEventReason{suffix}", None)
        if bit is not None and mask & bit:
            names.append(name)
    return names


def flags(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``throttled`` if a slowdown reason was active, ``shared_gpu`` if another process ran."""
    snapshots = (before, after)
    out = []
    if any(SLOWDOWNS & set(s.get("throttle_reasons") or []) for s in snapshots):
        out.append("throttled")
    if any("sw_power_cap" in (s.get("throttle_reasons") or []) for s in snapshots):
        out.append("power_capped")
    if any(s.get("other_processes") for s in snapshots):
        out.append("shared_gpu")
    return out


class GpuStateRecorder:
    """Takes :meth:`snapshot` before/after the measured steps; :meth:`result` is the JSON."""

    def __init__(self, device: torch.device) -> None:
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.nvml, self.handle, self.reason = None, None, None
        if device.type != "cuda":
            self.reason = f"device is {device.type}, not a GPU"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = _handle(pynvml, device)
            self.nvml = pynvml
        except ImportError:
            self.reason = "pynvml (nvidia-ml-py) is not installed"
        except Exception as err:  # noqa: BLE001 - any NVML failure means "not available"
            self.reason = f"NVML unavailable: {type(err).__name__}: {err}"

    def snapshot(self, when: str) -> None:
        if self.nvml is not None:
            self.snapshots[when] = read_state(self.nvml, self.handle)

    def result(self) -> dict[str, Any]:
        if self.nvml is None:
            return {"available": False, "reason": self.reason}
        before, after = self.snapshots.get("before", {}), self.snapshots.get("after", {})
        return {"available": True, "driver_version": _query(self.driver_version),
                "before": before, "after": after, "flags": flags(before, after)}

    def driver_version(self) -> str:
        version = self.nvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)


def read_state(nvml: Any, handle: Any) -> dict[str, Any]:
    """One snapshot; a field the GPU does not report is None."""
    sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
    mask = _query(lambda: _throttle_mask(nvml, handle))
    return {
        "sm_clock_mhz": _query(lambda: nvml.nvmlDeviceGetClockInfo(handle, sm)),
        "mem_clock_mhz": _query(lambda: nvml.nvmlDeviceGetClockInfo(handle, mem)),
        "max_sm_clock_mhz": _query(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, sm)),
        "max_mem_clock_mhz": _query(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, mem)),
        "temperature_c": _query(
            lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        ),
        "power_w": _query(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1e3),
        "power_limit_w": _query(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3),
        "throttle_reasons": None if mask is None else decode_reasons(mask, nvml),
        "other_processes": _other_processes(nvml, handle),
    }


def _throttle_mask(nvml: Any, handle: Any) -> int:
    reader = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    reader = reader or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(reader(handle))


def _other_processes(nvml: Any, handle: Any) -> list[dict[str, Any]] | None:
    """Processes on this GPU other than this one (pid, used memory in bytes)."""
    procs = _query(lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle))
    if procs is None:
        return None
    graphics = _query(lambda: nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)) or []
    own = os.getpid()
    seen = {p.pid: p for p in [*procs, *graphics] if p.pid != own}
    return [{"pid": pid, "used_memory_bytes": p.usedGpuMemory} for pid, p in sorted(seen.items())]


def _handle(nvml: Any, device: torch.device) -> Any:
    """NVML handle of the torch device (by UUID: NVML and CUDA may number GPUs differently)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", ""))
    if uuid:
        try:
            name = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            return nvml.nvmlDeviceGetHandleByUUID(name)
        except Exception:  # noqa: BLE001 - fall back to the index
            pass
    return nvml.nvmlDeviceGetHandleByIndex(index)


def _query(read: Any) -> Any:
    try:
        return read()
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: field unknown
        return None
