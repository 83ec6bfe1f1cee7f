"""Kernel categories and tensor-core detection.

Library and eager PyTorch kernels are categorised by name (the export has no instruction
mix): ordered regular expressions over the demangled name, the first match wins, written
against real H100 (sm_90) names from PyTorch, cuBLAS/cuBLASLt (``sm90_xmma``, ``nvjet``),
CUTLASS, cuDNN, FlashAttention and NCCL.  A Triton kernel of Inductor is categorised by the
ATen ops fused into it: from the kernel map's ``Original ATen`` list when the run has one,
else from its name, ``triton_{poi,red,per,tem,for}_fused_<ops>_<n>``.  Per launched op
(:func:`categorize_op`), the phase counts too: every non-GEMM kernel launched in
``optimizer_step`` is Optimizer.  See docs/analysis.md.

FP8 training (run key ``float8``, torchao) gets two categories of its own. ``FP8GEMM``: GEMMs
on FP8 operands, by name: cuBLAS's ``sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_...`` (forward) and
``..._e4m3e5m2bf16_...`` (gradients in e5m2), cuBLASLt's ``nvjet_sm90_qqtst_...`` (``qq``:
two e4m3 operands; ``qr``: e4m3 and e5m2, the gradients' GEMMs; a bf16 one is
``nvjet_sm90_tst_...``), CUTLASS's row-wise kernel (its template names ``float_e4m3_t``),
and an Inductor GEMM template over ``_scaled_mm``.
``FP8Cast``: the scaling around them, torchao's dynamic scales as Inductor compiles them: the
amax reduction (``abs`` and ``max`` in one reduction, e.g. ``triton_red_fused_abs_max_0``) and
the scale-and-cast (``clamp`` to the FP8 range with the scale's ``reciprocal``, or feeding
``_scaled_mm``: ``triton_poi_fused__scaled_mm__to_copy_clamp_mul_reciprocal_t_view_4``), and
eager kernels on ``c10::Float8_e4m3fn``/``Float8_e5m2`` tensors. Inductor fuses a cast into
its producer (an activation, an addition): such a kernel counts whole as FP8Cast, so the
category's time bounds the casts' cost from above.
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
    # last, so the categories before keep their colours (analysis/outputs/style.py)
    "FP8GEMM",
    "FP8Cast",
)

# (category, pattern) in priority order.  Attention before GEMM: flash/fmha kernels are
# GEMM-like but belong to attention; communication before copy: NCCL kernels copy too.
_CATEGORY_RULES: tuple[tuple[str, str], ...] = (
    ("Communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|sendrecv|alltoall"),
    (
        "Attention",
        # dot_do_o / convert_dq: the helper kernels of cuDNN's SDPA backward
        r"flash|fmha|attention|attn|mha_|_mha|sdpa|cudnn_generated_fort_native_sdpa|"
        r"dot_do_o|convert_dq_to",
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
    # before GEMM: an FP8 GEMM is a GEMM (and a CUTLASS one) whose operands are e4m3/e5m2
    (
        "FP8GEMM",
        r"nvjet_(?:sm\d+_)?[qr][qr]|"
        r"(?:gemm|xmma|cutlass|matmul|wgmma|scaled_mm).*(?:e4m3|e5m2|float8|fp8|f8f8)|"
        r"(?:e4m3|e5m2|float8|fp8|f8f8).*(?:gemm|xmma|cutlass|matmul|wgmma|scaled_mm)",
    ),
    (
        "GEMM",
        r"gemm|gemv|xmma|nvjet|cutlass|cublas|matmul|wgmma|hmma|\bmma_|"
        r"s\d{3,5}gemm|h\d{3,5}gemm|implicit_gemm|conv(?!ert)|fprop|dgrad|wgrad|"
        r"dot_kernel|splitk",
    ),
    # eager casts to or from FP8 (PyTorch's elementwise kernels on its float8 types)
    ("FP8Cast", r"float8_e4m3|float8_e5m2"),
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


# -- Inductor's Triton kernels: by the ATen ops fused into them --------------------------------
TRITON_NAME = re.compile(r"^triton_(poi|red|per|tem|for|mix|spl)_(?:fused_)?(.*?)(?:_\d+)?$")
OPTIMIZER_PHASE = "optimizer_step"
# Ops that only move, cast or lay out data (incl. the embedding gather/scatter, which the
# name rules file under CopyMemset as well): a kernel fusing nothing else is CopyMemset.
COPY_OPS = frozenset((
    "_to_copy", "copy", "copy_", "clone", "contiguous", "view", "_unsafe_view", "reshape",
    "permute", "transpose", "t", "expand", "expand_as", "slice", "slice_scatter",
    "slice_backward", "select", "select_scatter", "select_backward", "narrow", "cat", "stack",
    "unsqueeze", "squeeze", "as_strided", "as_strided_scatter", "convert_element_type",
    "alias", "split", "split_with_sizes", "unbind", "detach", "lift_fresh", "flip", "roll",
    "repeat", "constant_pad_nd", "pad", "embedding", "embedding_dense_backward", "index",
    "_unsafe_index", "index_select", "gather", "scatter", "scatter_add", "index_put",
    "_unsafe_index_put", "index_add", "full", "full_like", "zeros", "zeros_like", "ones",
    "ones_like", "empty", "empty_like", "new_zeros", "new_ones", "new_empty", "new_full",
    "fill", "fill_", "zero", "zero_", "scalar_tensor", "device_put", "diagonal", "unfold",
    "iota", "arange",
))
_GEMM_OPS = frozenset(("mm", "bmm", "addmm", "baddbmm", "addmv", "_scaled_mm", "_int_mm",
                       "convolution", "convolution_backward", "matmul", "dot"))
_REDUCTION_OPS = frozenset(("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin",
                            "prod", "var", "std", "any", "all", "cumsum", "cumprod",
                            "logsumexp", "norm", "linalg_vector_norm", "nll_loss_forward"))
_NORM_NAMES = re.compile(r"layer_norm|rms_norm|batch_norm|group_norm|instance_norm|var_mean")


def triton_ops(name: str, aten_ops: tuple[str, ...] | list[str] | None = None
               ) -> tuple[str, frozenset[str]] | None:
    """(Triton kernel kind, ops fused into it) of an Inductor kernel name, else None.

    ``aten_ops`` (``aten.mm``, ``prims.convert_element_type``, ...) come from the kernel map;
    without them the ops are read from the name.  A name lists at most 10 ops, joined by
    ``_`` (op names contain ``_`` too), so there every ``_``-separated word counts as an op
    and :func:`_copy_only_name` decides copy-only by segmenting the name.
    """
    m = TRITON_NAME.match(name)
    if m is None:
        return None
    if aten_ops:
        return m.group(1), frozenset(op.split(".")[1] if "." in op else op for op in aten_ops)
    copies = _split_into(m.group(2), COPY_OPS)
    words = frozenset(w for w in m.group(2).split("_") if w)
    return m.group(1), frozenset(copies) if copies is not None else words


def _split_into(fused: str, vocabulary: frozenset[str]) -> list[str] | None:
    """``fused`` (e.g. ``_unsafe_view_clone_transpose_view``) as ``_``-joined words of
    ``vocabulary``, or None when it is not made of them only."""
    n = len(fused)
    prev: dict[int, tuple[int, str]] = {0: (-1, "")}  # reachable start -> how
    for i in range(n + 1):
        if i not in prev:
            continue
        for op in vocabulary:
            j = i + len(op)
            if fused.startswith(op, i) and (j == n or fused[j] == "_"):
                nxt = j if j == n else j + 1
                prev.setdefault(nxt, (i, op))
    if not fused or n not in prev:
        return None
    ops, at = [], n
    while at > 0:
        at, op = prev[at]
        ops.append(op)
    return ops[::-1]


def is_fp8_scaling(kind: str, ops: frozenset[str]) -> bool:
    """Whether a fused (non-template) Triton kernel computes FP8 scales or casts: an amax
    (abs and max reduced together), or a clamp to the FP8 range with the scale's reciprocal
    or feeding ``_scaled_mm`` (torchao's dynamic scaling, see the module docstring)."""
    if kind == "tem":
        return False
    # a name's words lose the op's leading "_": `_scaled_mm` reads as "scaled", "mm"
    scaled_mm = "_scaled_mm" in ops or {"scaled", "mm"} <= ops
    amax = "abs" in ops and bool(ops & {"max", "amax"}) and kind in ("red", "per")
    cast = "clamp" in ops and bool(ops & {"reciprocal", "abs"})
    return amax or cast or scaled_mm


def categorize_ops(kind: str, ops: frozenset[str], name: str = "") -> str:
    """Category of a kernel from the ops fused into it (see the module docstring)."""
    if kind == "tem":
        if "attention" in name:
            return "Attention"
        return "FP8GEMM" if "_scaled_mm" in ops or "scaled_mm" in name else "GEMM"
    if any("attention" in op or "sdpa" in op for op in ops):
        return "Attention"
    if is_fp8_scaling(kind, ops):
        return "FP8Cast"
    if ops & _GEMM_OPS:
        return "GEMM"
    if any("softmax" in op for op in ops):
        return "Softmax"
    if (
        ("rsqrt" in ops and ops & {"mean", "sum", "var", "var_mean"})
        or any(_NORM_NAMES.search(op) for op in ops)
        # RMSNorm backward: the gradient through x * rsqrt(mean(x^2)) (pow, sum, div, mul)
        or {"pow", "sum", "div", "mul"} <= ops
    ):
        return "Normalization"
    if ops and ops <= COPY_OPS:
        return "CopyMemset"
    if kind in ("red", "per") or ops & _REDUCTION_OPS:
        return "Reduction"
    return "Elementwise"


def categorize_op(name: str | None, phase: str | None = None,
                  aten_ops: tuple[str, ...] | list[str] | None = None) -> str:
    """Category of one launched kernel: Triton kernels by their ops, others by name (an
    extern library kernel the name rules miss by its call site's ATen ops); any non-GEMM,
    non-communication kernel launched in ``optimizer_step`` is Optimizer, and a foreach
    (multi-tensor) kernel launched in another phase is not (e.g. CUDA-graph input copies)."""
    triton = triton_ops(name or "", aten_ops)
    if triton is not None:
        category = categorize_ops(*triton, name=name or "")
    else:
        category = categorize(name)
        if category == "Other" and aten_ops:
            ops = frozenset(op.split(".")[1] if "." in op else op for op in aten_ops)
            category = categorize_ops("", ops)
    if phase == OPTIMIZER_PHASE and category not in ("GEMM", "FP8GEMM", "Communication"):
        return "Optimizer"
    if phase is not None and phase != OPTIMIZER_PHASE and category == "Optimizer":
        return "Elementwise"
    return category


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
