"""The optimizer step against the memory roofline: the bytes it must move over its GPU time,
compared with what this GPU's memory can move.

* bytes per step: the workload's ``optimizer_bytes_per_step`` (``workloads/optim.py``:
  torch AdamW reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq,
  7 x the parameters' bytes; ``adamw_master`` adds its gradient gathers and bf16 copy).
  Records written before that field: 7 x 4 bytes x ``params_count`` for the torch AdamWs
  (fp32 parameters), none for ``adamw_master``;
* time: the GPU time of the ``optimizer_step`` phase (``phase_gpu_ms_optimizer_step``);
* reference: the calibrated copy bandwidth (``calibration.json`` ``copy_gbps``, bytes read
  plus written, like the bytes above), else the GPU's datasheet bandwidth (the record's
  ``peak_memory_gbps``), else none.

At ``ROOFLINE_SHARE`` or more of the reference the step is memory-bound as written: fusing
its kernels further cannot make it faster; moving fewer bytes can.
"""

from __future__ import annotations

from typing import Any

ROOFLINE_SHARE = 0.8
TORCH_ADAMW_BYTES_PER_PARAM = 7 * 4  # fp32 parameters, gradients and state
TORCH_ADAMWS = ("adamw_foreach", "adamw_fused")


def optimizer_bytes(record: dict[str, Any], params: dict[str, Any]) -> int | None:
    """Bytes one optimizer step must move, from the run's record and parameters."""
    if params.get("mode") != "train":
        return None
    recorded = record.get("optimizer_bytes_per_step")
    if recorded:
        return int(recorded)
    count = record.get("params_count")
    if params.get("optimizer", "adamw_foreach") in TORCH_ADAMWS and count:
        return int(count) * TORCH_ADAMW_BYTES_PER_PARAM
    return None


def memory_reference(calibration: dict[str, Any] | None,
                     record: dict[str, Any]) -> tuple[float | None, str | None]:
    """(GB/s, where it comes from): the calibrated copy, else the datasheet, else none."""
    if calibration and calibration.get("status", "ok") == "ok" and calibration.get("copy_gbps"):
        return float(calibration["copy_gbps"]), "calibrated copy"
    if record.get("peak_memory_gbps"):
        return float(record["peak_memory_gbps"]), "datasheet"
    return None, None


def optimizer_roofline(nbytes: int | None, optimizer_ms: float | None,
                       reference_gbps: float | None) -> dict[str, float | None]:
    """The optimizer's achieved GB/s and its share of the reference bandwidth."""
    gbps = nbytes / (optimizer_ms / 1e3) / 1e9 if nbytes and optimizer_ms else None
    return {
        "optimizer_bytes_per_step": nbytes,
        "optimizer_gbps": gbps,
        "optimizer_roofline": gbps / reference_gbps if gbps and reference_gbps else None,
    }
