"""Kernel categories of compiled code (analysis/metrics/categories.py) on the real compiled
H100 captures: a fused Triton kernel by the ops fused into it and the phase it runs in."""

from __future__ import annotations

import numpy as np
import pytest
from compiled_fixtures import COMPILED, compiled_run, sql_ops, sql_phase_ns

from analysis.metrics.categories import CATEGORIES, categorize_op, triton_ops
from analysis.metrics.extras import RunInputs, compute_extras, op_categories
from analysis.reading.export import Export

ADAMW = "triton_poi_fused__to_copy_add_copy_copy__div_lerp_mul_pow_reciprocal_rsub_sqrt_sub_0"


@pytest.fixture(scope="module", params=COMPILED)
def run(request: pytest.FixtureRequest):
    return compiled_run(request.param)


def _categories(run, with_map: bool) -> dict[str, set[str]]:
    """Kernel name -> the categories its launches got."""
    category = op_categories(run.ops, run.phases, run.attribution if with_map else None)
    out: dict[str, set[str]] = {}
    for i in range(run.ops.size):
        out.setdefault(run.ops.name(i), set()).add(CATEGORIES[int(category[i])])
    return out


@pytest.mark.parametrize("with_map", [True, False], ids=["kernel-map", "names-only"])
def test_real_compiled_kernels(run, with_map: bool) -> None:
    cats = _categories(run, with_map)

    def of(pattern: str) -> set[str]:
        found = [c for n, c in cats.items() if pattern in n]
        assert found, pattern
        return set().union(*found)

    assert cats[ADAMW] == {"Optimizer"}  # the fused AdamW update, in optimizer_step
    assert of("CatArrayBatchedCopy") == {"Optimizer"}  # the optimizer's gradient gathers
    # RMSNorm: forward (rsqrt of a mean) and backward (pow, sum, div), Triton-fused
    assert of("_add_mean_mul_pow_rsqrt_") == {"Normalization"}
    assert of("_add_div_expand_mul_pow_sum_view_") == {"Normalization"}
    assert of("cudnn_generated_fort_native_sdpa") == {"Attention"}  # cuDNN SDPA fprop/bprop
    assert of("compute_dot_do_o") == of("convert_dq_to_16bits") == {"Attention"}
    assert of("nvjet_sm90") == {"GEMM"}
    assert of("triton_poi_fused_clone_transpose_") == {"CopyMemset"}  # copy-only
    assert of("_log_softmax_") == {"Softmax"}  # the loss, forward and backward
    assert of("silu") == {"Elementwise"}


def test_optimizer_and_copy_shares(run) -> None:
    """Optimizer time = the optimizer_step phase (no GEMM there); casts/copies stay small."""
    extras = compute_extras(Export(run.sqlite), run=RunInputs(run.record, run.trace))
    metrics = extras.metrics
    total = sum(d for d, *_ in sql_ops(run.sqlite))
    optimizer = metrics["category_time_ns.Optimizer"]
    assert sum(metrics[f"category_time_ns.{c}"] for c in CATEGORIES) == total
    assert optimizer == sql_phase_ns(run.sqlite, "optimizer_step")
    assert metrics["category_time_ns.CopyMemset"] < 0.10 * total
    assert optimizer / total > 0.2  # the AdamW update is a fifth of this step


def test_phase_decides_for_non_gemm_kernels() -> None:
    assert categorize_op(ADAMW) == "Elementwise"  # outside any phase: by its ops
    assert categorize_op(ADAMW, "optimizer_step") == "Optimizer"
    assert categorize_op("nvjet_sm90_tst_96x128_64x7_2x1_v_bz_TNN", "optimizer_step") == "GEMM"
    # a foreach kernel outside the optimizer (CUDA-graph input copies of reduce-overhead)
    mta = "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::Ten"
    assert categorize_op(mta) == "Optimizer"
    assert categorize_op(mta, "forward_pass") == "Elementwise"


def test_kernel_map_ops_take_precedence_over_the_name(run) -> None:
    """The name lists at most 10 ops; the kernel map's Original ATen list is complete."""
    for graph in run.graphs:
        for site in graph.sites:
            if site.is_triton:
                kind, from_map = triton_ops(site.kernel, site.aten_ops)
                _, from_name = triton_ops(site.kernel)
                assert kind in ("poi", "red", "per")
                assert from_map == {a.split(".")[1] for a in site.aten_ops}
                assert from_name  # the name parses too


def test_every_op_has_a_category(run) -> None:
    category = op_categories(run.ops, run.phases, run.attribution)
    assert category.size == run.ops.size
    assert not np.any(category == CATEGORIES.index("Other"))
