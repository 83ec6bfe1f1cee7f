"""The operator table of a compiled run, from its kernel map (compiled_ops.csv): each compiled
kernel under the ATen ops Inductor generated it from, on the real H100 captures."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from compiled_fixtures import COMPILED, H100, sql_ops, sql_phase_ns
from conftest import REPO

from analysis.metrics.kernelmap import OUTSIDE_COMPILED, site_op_label


@pytest.fixture(scope="module", params=COMPILED)
def tables(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[str, pd.DataFrame, pd.DataFrame]:
    stem = request.param
    out = tmp_path_factory.mktemp(stem)
    subprocess.run([sys.executable, "-m", "analysis", "all", str(H100 / f"{stem}.sqlite"),
                    "-o", str(out), "--record", str(H100 / f"{stem}.json"),
                    "--torch-trace", str(H100 / f"{stem}_torch_trace")],
                   cwd=REPO, check=True, capture_output=True)
    return stem, pd.read_csv(out / "compiled_ops.csv"), pd.read_csv(out / "kernel_map.csv")


def test_rows_add_up_to_the_steps_gpu_time(tables) -> None:
    stem, ops, _ = tables
    step_ns = sql_phase_ns(H100 / f"{stem}.sqlite", "profiled_step")
    assert ops["GPU Self (ns)"].sum() == step_ns
    assert ops["GPU Share of Step"].sum() == pytest.approx(1.0, abs=1e-3)


def test_gemms_are_aten_mm_with_their_kernels(tables) -> None:
    """Every nvjet (cuBLASLt) kernel of the step is under aten::mm, which has little else (the
    few small ops its calls also launch)."""
    stem, ops, _ = tables
    gemm_ns = sum(dur for dur, name, _, _ in sql_ops(H100 / f"{stem}.sqlite")
                  if name.startswith("nvjet"))
    mm = ops.set_index("Op").loc["aten::mm"]
    assert gemm_ns <= mm["GPU Self (ns)"] < 1.01 * gemm_ns
    assert mm["Kernels/Call"] == pytest.approx(1.0, abs=0.01)


def test_fused_adamw_update_is_one_row_of_its_ops(tables) -> None:
    _, ops, kmap = tables
    adamw = [op for op in ops["Op"] if "aten::lerp" in op and "aten::sqrt" in op]
    assert adamw, list(ops["Op"])
    # its time is what the kernel map gives the AdamW call sites
    sites = kmap[kmap["Original ATen"].str.contains("aten.lerp", na=False)]
    assert sum(ops.set_index("Op").loc[a, "GPU Self (ns)"] for a in adamw) == sites[
        "GPU Time (ns)"].sum()


def test_labels() -> None:
    assert site_op_label("extern_kernels.mm", ("aten.t", "aten.mm")) == "aten::mm"
    assert site_op_label("torch.ops.aten._scaled_dot_product_cudnn_attention.default", ()) == (
        "aten::_scaled_dot_product_cudnn_attention")
    assert site_op_label("triton_poi_fused_add_view_0", ("aten.add", "aten.view")) == "aten::add"
    assert site_op_label("triton_poi_fused_mul_silu_1", ("aten.silu", "aten.mul")) == (
        "fused(aten::mul, aten::silu)")
    assert site_op_label("triton_poi_fused_view_2", ("aten.view",)) == "aten::view"


def test_outside_compiled_code_is_the_eager_glue(tables) -> None:
    _, ops, _ = tables
    row = ops.set_index("Op").loc[OUTSIDE_COMPILED]
    assert row["GPU Share of Step"] < 0.1 and row["Calls"] == 0


