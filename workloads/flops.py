"""Model FLOPs per step and MFU (model FLOPs utilization).

Convention (Kaplan et al. / PaLM): a matmul of an (m x k) by a (k x n) matrix is 2mkn FLOPs;
the backward pass costs twice the forward; attention scores and the probability-weighted sum
are counted in full (causal kernels skip about half, so MFU slightly understates them);
element-wise ops, norms, softmax and the optimizer are not counted.
"""

from workloads.gpt import GPTConfig

# Dense peak TFLOP/s by device-name substring and dtype (fp32 = no TF32, torch's default).
# NVIDIA datasheets (dense, no sparsity): H100/H200 SXM 989.4 bf16/fp16, 494.7 tf32,
# 66.9 fp32; H100 PCIe 756 / 378 / 51.2.
_SXM = {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100", _SXM),
    ("H200", _SXM),
]

# Datasheet memory bandwidth (GB/s) by device-name substring, first match: H100 SXM 3.35 TB/s,
# PCIe 2.0, NVL 3.9; H200 4.8 (NVIDIA H100 / H200 datasheets). The optimizer roofline uses
# the calibrated copy bandwidth when there is one (docs/findings.md).
PEAK_MEMORY_GBPS: list[tuple[str, float]] = [
    ("H100 PCIe", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),
    ("H200", 4800.0),
]

# Backward of attention_core relative to its forward: dS = dO V^T and dV = P^T dO (2 matmuls),
# dQ = dS K and dK = dS^T Q (2 more), plus the recomputation of S = Q K^T that fused kernels
# (flash, cuDNN) do: 5 matmuls of the forward's 2, i.e. 2.5x (FlashAttention-2's convention).
ATTENTION_BACKWARD_FACTOR = 2.5

# Forward FLOPs times this gives the step's FLOPs.
MODE_MULTIPLIER = {"forward": 1, "forward_backward": 3, "train": 3}


def gpt_forward_flops(cfg: GPTConfig, batch: int, seq: int) -> int:
    """Forward FLOPs of :class:`workloads.gpt.GPT` on a (batch, seq) token block."""
    tokens = batch * seq
    d = cfg.d_model
    matmul_params = cfg.n_layers * (4 * d * d + 3 * d * cfg.d_ff) + cfg.vocab_size * d
    attention = cfg.n_layers * 2 * (2 * batch * seq * seq * d)  # q k^T and probs @ v
    return 2 * matmul_params * tokens + attention


def attention_forward_flops(batch: int, seq: int, embed: int) -> int:
    """Forward FLOPs of :class:`workloads.attention.Attention` (independent of head count)."""
    projections = 3 * 2 * batch * seq * embed * embed
    core = 2 * (2 * batch * seq * seq * embed)
    return projections + core


def attention_core_forward_flops(
    batch: int, heads: int, seq: int, head_dim: int, causal: bool
) -> int:
    """Forward FLOPs of softmax(q k^T) v on (batch, heads, seq, head_dim) tensors.

    Two matmuls of 2·S·S·D each per (batch, head): 4·B·H·S²·D; halved when causal (a causal
    kernel skips the masked half), as in FlashAttention's benchmarks.
    """
    full = 4 * batch * heads * seq * seq * head_dim
    return full // 2 if causal else full


def attention_core_step_flops(forward_flops: int, mode: str) -> int:
    """forward: the forward; forward_backward: forward + 2.5 x forward for the backward."""
    if mode == "forward":
        return forward_flops
    if mode == "forward_backward":
        return int(forward_flops * (1 + ATTENTION_BACKWARD_FACTOR))
    raise ValueError(f"unknown mode {mode!r} for attention_core")


def step_flops(forward_flops: int, mode: str) -> int:
    return forward_flops * MODE_MULTIPLIER[mode]


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """Datasheet peak of a known GPU, or None (CPU, unknown GPU)."""
    for pattern, peaks in PEAK_TFLOPS:
        if pattern in device_name:
            return peaks.get(dtype)
    return None


def peak_memory_gbps(device_name: str) -> float | None:
    """Datasheet memory bandwidth of a known GPU, or None (CPU, unknown GPU)."""
    for pattern, gbps in PEAK_MEMORY_GBPS:
        if pattern in device_name:
            return gbps
    return None


def mfu(flops_per_step: int, step_seconds: float, peak: float | None) -> float | None:
    """Achieved / peak FLOP/s, or None without a peak."""
    if peak is None or step_seconds <= 0:
        return None
    return flops_per_step / step_seconds / (peak * 1e12)
