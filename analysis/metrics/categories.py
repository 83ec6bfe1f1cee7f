"""Kernel categories and tensor-core detection from kernel names.

Both are name heuristics (the export has no instruction mix).  Rules are ordered regular
expressions over the demangled kernel name; the first match wins.  They were written
against real H100 (sm_90) kernel names from PyTorch, cuBLAS/cuBLASLt (``sm90_xmma``,
``nvjet``), CUTLASS, cuDNN, FlashAttention and NCCL; see docs/analysis.md.
"""

from __future__ import annotations

import re

CATEGORIES: tuple[str, ...] = (
    "GEMM",
    "Attention",
    "Softmax",
    "Normalization",
    "Optimizer",
    "Communication",
    "CopyMemset",
    "Reduction",
    "Elementwise",
    "Other",
)

# (category, pattern) in priority order.  Attention before GEMM: flash/fmha kernels are
# GEMM-like but belong to attention; communication before copy: NCCL kernels copy too.
_CATEGORY_RULES: tuple[tuple[str, str], ...] = (
    ("Communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|sendrecv|alltoall"),
    (
        "Attention",
        r"flash|fmha|attention|attn|mha_|_mha|sdpa|cudnn_generated_fort_native_sdpa",
    ),
    ("Softmax", r"softmax"),
    (
        "Normalization",
        r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|"
        r"\bnorm_kernel|welford",
    ),
    (
        "Optimizer",
        r"multi_tensor|multitensor|\badam|adamw|fused_adam|\bsgd\b|sgd_|lamb_|_lamb\b|"
        r"fused_optim|optimizer|foreach",
    ),
    (
        "GEMM",
        r"gemm|gemv|xmma|nvjet|cutlass|cublas|matmul|wgmma|hmma|\bmma_|"
        r"s\d{3,5}gemm|h\d{3,5}gemm|implicit_gemm|conv(?!ert)|fprop|dgrad|wgrad|"
        r"dot_kernel|splitk",
    ),
    (
        "CopyMemset",
        r"copy|memcpy|memset|fill|cat_?array|catarray|transpose|permute|"
        # embedding forward/backward are gather / scatter-add over rows
        r"gather_kernel|scatter_kernel|index_select|\bindex_kernel|embedding",
    ),
    ("Reduction", r"reduce|reduction|sum_kernel|mean_kernel|argmax|argmin|max_kernel|cumsum|scan"),
    ("Elementwise", r"elementwise|vectorized|pointwise|triton_poi|unary|binary"),
)
_COMPILED = tuple((c, re.compile(p, re.IGNORECASE)) for c, p in _CATEGORY_RULES)

#: category used for CUPTI memcpy / memset activities (not kernels)
MEMOP_CATEGORY = "CopyMemset"


def categorize(name: str | None) -> str:
    """Category of one kernel name (first matching rule, else 'Other')."""
    if not name:
        return "Other"
    for category, rx in _COMPILED:
        if rx.search(name):
            return category
    return "Other"


# Tensor cores.  Negative rules first: FP32 SIMT/FFMA GEMMs (e.g. cuBLAS
# ``sm80_xmma_gemm_f32f32_..._ffma_...`` and CUTLASS ``cutlass_80_simt_sgemm``) do not use
# tensor cores even though they are GEMMs.
_TC_NEGATIVE = re.compile(
    r"simt|_ffma|ffma_|sgemm(?!.*tensorop)|dgemm(?!.*tensorop)|gemv|fmha\w*_f32|_fp32_|f32f32_f32f32_f32",
    re.IGNORECASE,
)
_TC_POSITIVE: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (label, re.compile(p, re.IGNORECASE))
    for label, p in (
        ("wgmma/gmma (Hopper warpgroup MMA)", r"wgmma|gmma"),
        ("nvjet (cuBLASLt Hopper JIT GEMM)", r"nvjet"),
        ("hmma/imma/tensorop", r"hmma|imma|tensorop|tensor_op|wmma"),
        ("flash/fmha attention", r"flash|fmha|mha_fwd|mha_bwd"),
        ("MMA shape (s16816, h1688, ...)", r"[hsi](?:884|1688|16816|8816|16832)"),
        (
            "xmma/cutlass with low-precision types",
            r"(?:xmma|cutlass|gemm|conv).*(?:bf16|f16|fp16|tf32|e4m3|e5m2|fp8|int8|i8i8|s8s8|_s8_)",
        ),
        ("sm90 xmma (Hopper cuBLAS/cuDNN)", r"sm9\d_xmma"),
    )
)


def tensor_core_rule(name: str | None) -> str | None:
    """Label of the rule that marks ``name`` as a tensor-core kernel, or None."""
    if not name or _TC_NEGATIVE.search(name):
        return None
    for label, rx in _TC_POSITIVE:
        if rx.search(name):
            return label
    return None


def uses_tensor_cores(name: str | None) -> bool:
    return tensor_core_rule(name) is not None
