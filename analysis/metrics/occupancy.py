"""Launch configuration -> estimated SM efficiency and occupancy (vectorized).

Definitions follow the PyTorch profiler (Kineto ``CuptiActivity``/``DeviceProperties`` and
the TensorBoard plugin's ``gpu_metrics_parser``):

* blocks per SM = gridX*gridY*gridZ / SM count
* est. SM efficiency = min(blocks per SM, 1)
* theoretical occupancy = active warps per SM / max warps per SM, where active blocks per
  SM come from the CUDA occupancy calculator (``cuda_occupancy.h``:
  ``cudaOccMaxActiveBlocksPerMultiprocessor`` with default device state, i.e. the
  maximum shared-memory carveout) limited by warps, registers and shared memory
* est. achieved occupancy (Kineto's ``est. achieved occupancy %``) =
  min(active blocks, blocks per SM) * threads per block / max threads per SM

The GPU limits come from ``TARGET_INFO_GPU`` (smCount, maxWarpsPerSm, maxBlocksPerSm,
maxRegistersPerSm, maxRegistersPerBlock, maxShmemPerSm, threadsPerWarp); per-architecture
allocation granularities that the export does not carry are those of cuda_occupancy.h.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GpuLimits:
    """Per-SM limits of the profiled GPU (one TARGET_INFO_GPU row)."""

    name: str
    cc_major: int
    cc_minor: int
    sm_count: int
    warp_size: int = 32
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    regs_per_sm: int = 65536
    regs_per_block: int = 65536
    smem_per_sm: int = 233472

    @property
    def compute_capability(self) -> str:
        return f"{self.cc_major}.{self.cc_minor}"

    @property
    def reg_alloc_unit(self) -> int:
        return 256

    @property
    def max_regs_per_thread(self) -> int:
        return 255

    @property
    def sub_partitions(self) -> int:
        # cudaOccSubPartitionsPerMultiprocessor: 2 on sm_60, 4 elsewhere
        return 2 if (self.cc_major, self.cc_minor) == (6, 0) else 4

    @property
    def smem_alloc_unit(self) -> int:
        # cudaOccSMemAllocationGranularity: 128 B from Ampere on, 256 B before
        return 128 if self.cc_major >= 8 else 256

    @property
    def smem_reserved_per_block(self) -> int:
        # cudaDeviceProp.reservedSharedMemPerBlock: 1 KiB from sm_80 on
        return 1024 if self.cc_major >= 8 else 0

    @classmethod
    def from_target_info(cls, row: dict[str, object]) -> GpuLimits:
        def get(key: str, default: int) -> int:
            v = row.get(key)
            return int(v) if v is not None else default  # type: ignore[call-overload]

        return cls(
            name=str(row.get("name") or ""),
            cc_major=get("computeMajor", 0),
            cc_minor=get("computeMinor", 0),
            sm_count=get("smCount", 0),
            warp_size=get("threadsPerWarp", 32),
            max_warps_per_sm=get("maxWarpsPerSm", 64),
            max_blocks_per_sm=get("maxBlocksPerSm", 32),
            regs_per_sm=get("maxRegistersPerSm", 65536),
            regs_per_block=get("maxRegistersPerBlock", 65536),
            smem_per_sm=get("maxShmemPerSm", 0),
        )


@dataclass
class Occupancy:
    blocks_per_sm: np.ndarray  # float
    sm_efficiency: np.ndarray  # float in [0, 1]
    active_blocks: np.ndarray  # int, theoretical active blocks per SM
    theoretical: np.ndarray  # float in [0, 1]
    achieved_est: np.ndarray  # float in [0, 1]
    limiter: list[str]  # 'warps' / 'registers' / 'shared memory' / 'blocks'


def _round_up(x: np.ndarray, unit: int) -> np.ndarray:
    return -(-x // unit) * unit


def occupancy(
    gpu: GpuLimits,
    blocks: np.ndarray,
    threads: np.ndarray,
    regs: np.ndarray,
    smem: np.ndarray,
) -> Occupancy:
    """Vectorized cudaOccMaxActiveBlocksPerMultiprocessor + the Kineto estimates.

    ``blocks`` = grid size, ``threads`` = block size, ``regs`` = registers per thread,
    ``smem`` = static + dynamic shared memory per block (bytes).
    """
    blocks = np.asarray(blocks, np.int64)
    threads = np.maximum(np.asarray(threads, np.int64), 1)
    regs = np.asarray(regs, np.int64)
    smem = np.asarray(smem, np.int64)
    big = np.iinfo(np.int64).max
    warps = -(-threads // gpu.warp_size)
    lim_warps = np.minimum(gpu.max_blocks_per_sm, gpu.max_warps_per_sm // warps)
    # registers: per-warp allocation, split across the SM's sub-partitions
    regs_warp = _round_up(regs * gpu.warp_size, gpu.reg_alloc_unit)
    regs_block = regs_warp * warps
    per_sub = gpu.regs_per_sm // gpu.sub_partitions
    with np.errstate(divide="ignore"):
        warps_sm = np.where(regs_warp > 0, (per_sub // np.maximum(regs_warp, 1)), 0)
    lim_regs = np.where(regs_warp > 0, warps_sm * gpu.sub_partitions // warps, big)
    lim_regs = np.where(
        (regs_block > gpu.regs_per_block) | (regs > gpu.max_regs_per_thread), 0, lim_regs
    )
    # shared memory: allocation granularity + the per-block reservation
    smem_block = _round_up(smem + gpu.smem_reserved_per_block, gpu.smem_alloc_unit)
    lim_smem = np.where(smem_block > 0, gpu.smem_per_sm // np.maximum(smem_block, 1), big)
    stacked = np.stack([lim_warps, lim_regs, lim_smem, np.full_like(lim_warps, big)])
    active = stacked.min(axis=0)
    which = stacked.argmin(axis=0)
    names = np.array(["warps", "registers", "shared memory", "blocks"])
    limiter = names[which].tolist()
    theoretical = active * warps / gpu.max_warps_per_sm
    if gpu.sm_count > 0:
        bps = blocks / gpu.sm_count
    else:
        bps = np.full(blocks.shape, np.nan)
    sm_eff = np.minimum(bps, 1.0)
    max_threads_sm = gpu.max_warps_per_sm * gpu.warp_size
    achieved = np.minimum(active, bps) * threads / max_threads_sm
    return Occupancy(bps, sm_eff, active, theoretical, achieved, limiter)
