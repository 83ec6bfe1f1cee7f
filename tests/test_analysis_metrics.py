"""Extra metrics checked against values computed by hand from real export rows."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis.metrics.categories import categorize, tensor_core_rule, uses_tensor_cores
from analysis.metrics.extras import run_metrics, union_busy
from analysis.metrics.occupancy import GpuLimits, occupancy
from analysis.outputs.compare import compare
from analysis.reading import Export, ExportError
from tests.analysis_fixtures import CPU, H100

ROOT = Path(__file__).resolve().parents[1]
H100_2025 = H100 / "attention_simple_vs_sdpa_nsys2025.3.1.sqlite"


def _h100() -> GpuLimits:
    with Export(H100_2025) as ex:
        return GpuLimits.from_target_info(ex.gpu_info()[0])


def _launch(name_like: str, regs: int) -> tuple[int, int, int, int]:
    """(grid blocks, block threads, registers, shared memory) of a real kernel row."""
    con = sqlite3.connect(H100_2025)
    row = con.execute(
        "SELECT gridX*gridY*gridZ, blockX*blockY*blockZ, registersPerThread, "
        "staticSharedMemory + dynamicSharedMemory FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE ? AND registersPerThread = ?"
        " LIMIT 1",
        (name_like, regs),
    ).fetchone()
    con.close()
    assert row is not None
    return row


def test_h100_limits_from_target_info() -> None:
    gpu = _h100()
    assert (gpu.name, gpu.compute_capability, gpu.sm_count) == ("NVIDIA H100 80GB HBM3", "9.0", 132)
    assert (gpu.max_warps_per_sm, gpu.max_blocks_per_sm, gpu.smem_per_sm) == (64, 32, 233472)


@pytest.mark.parametrize(
    ("name", "regs", "active", "theoretical", "limiter"),
    [
        # cuBLAS FP32 GEMM: 128 threads = 4 warps, 255 regs -> 255*32 = 8160 -> 8192 regs/warp;
        # 65536/4 = 16384 regs per sub-partition -> 2 warps each -> 8 warps -> 2 blocks;
        # smem 33792 + 1024 reserved = 34816 -> 6 blocks; warps: 64/4 = 16 -> 2 blocks
        ("sm80_xmma_gemm%", 255, 2, 2 * 4 / 64, "registers"),
        # CUTLASS SIMT SGEMM: 256 threads = 8 warps, 202 regs -> 6464 -> 6656/warp ->
        # 2 warps per sub-partition -> 8 warps -> 1 block; smem 49152+1024 -> 4 blocks
        ("Kernel2", 202, 1, 1 * 8 / 64, "registers"),
        # softmax: 128 threads, 48 regs -> 1536/warp -> 10 warps per sub-partition ->
        # 40 warps -> 10 blocks (warps allow 16)
        ("softmax_warp_forward", 48, 10, 10 * 4 / 64, "registers"),
        # layer norm: 128 threads, 39 regs -> 1248 -> 1280/warp -> 12 -> 48 warps -> 12 blocks
        ("vectorized_layer_norm_kernel", 39, 12, 12 * 4 / 64, "registers"),
        # add: 128 threads, 32 regs -> 1024/warp -> 16 -> 64 warps -> 16 blocks = warp limit
        ("vectorized_elementwise_kernel", 32, 16, 1.0, "warps"),
    ],
)
def test_theoretical_occupancy_of_real_kernels(
    name: str, regs: int, active: int, theoretical: float, limiter: str
) -> None:
    blocks, threads, r, smem = _launch(name, regs)
    occ = occupancy(_h100(), np.array([blocks]), np.array([threads]), np.array([r]),
                    np.array([smem]))  # fmt: skip
    assert occ.active_blocks[0] == active
    assert occ.theoretical[0] == pytest.approx(theoretical)
    assert occ.limiter[0] == limiter


def test_sm_efficiency_and_achieved_occupancy() -> None:
    gpu = _h100()
    # FillFunctor launch in the export: grid 1x1x1, 128 threads, 16 regs
    blocks, threads, regs, smem = _launch("vectorized_elementwise_kernel", 16)
    occ = occupancy(gpu, np.array([blocks]), np.array([threads]), np.array([regs]),
                    np.array([smem]))  # fmt: skip
    assert blocks == 1
    assert occ.sm_efficiency[0] == pytest.approx(1 / 132)
    # Kineto: min(active blocks, blocks per SM) * threads / max threads per SM
    assert occ.achieved_est[0] == pytest.approx((1 / 132) * 128 / 2048)
    big = occupancy(gpu, np.array([500]), np.array([128]), np.array([255]), np.array([33792]))
    assert big.sm_efficiency[0] == 1.0 and big.blocks_per_sm[0] == pytest.approx(500 / 132)


REAL_TC_NAMES = {
    # tensor-core kernels seen in H100 (sm_90) PyTorch traces
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas": True,
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas": True,
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": True,
    "cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8_"
    "warpspecialized_cooperative_epi_tma": True,
    "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, "
    "4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, "
    "cutlass::bfloat16_t>>, false, true, false, false, true, true, false>"
    "(pytorch_flash::Flash_fwd_params)": True,
    "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<"
    "cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)": True,
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>"
    "(T1::Params)": True,
    "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_tn": True,
    # FP32 (no tensor cores): the two GEMMs of the H100 fixture and the f32 mem-eff attention
    "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_"
    "alignc4_execute_kernel__5x_cublas": False,
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)": False,
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
    "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)": False,
    "ampere_sgemm_128x64_tn": False,
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "std::array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3>)": False,
}


@pytest.mark.parametrize("name", list(REAL_TC_NAMES))
def test_tensor_core_rules(name: str) -> None:
    assert (tensor_core_rule(name) is not None) == REAL_TC_NAMES[name]


def test_categories_of_fixture_kernels() -> None:
    con = sqlite3.connect(H100_2025)
    names = [r[0] for r in con.execute(
        "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.demangledName")]  # fmt: skip
    con.close()
    cats = {categorize(n) for n in names}
    by = {n.split("<")[0].split("(")[0][-40:]: categorize(n) for n in names}
    assert cats <= {"GEMM", "Softmax", "Normalization", "Elementwise", "Reduction", "CopyMemset"}
    assert categorize(next(n for n in names if "softmax_warp_forward" in n)) == "Softmax"
    assert categorize(next(n for n in names if "layer_norm" in n)) == "Normalization"
    assert categorize(next(n for n in names if "reduce_kernel" in n)) == "Reduction"
    assert categorize(next(n for n in names if "sm80_xmma_gemm" in n)) == "GEMM"
    assert categorize(next(n for n in names if "MulFunctor" in n)) == "Elementwise", by
    assert categorize("void flash_fwd_kernel<Flash_fwd_kernel_traits<64>>") == "Attention"
    assert categorize("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096>)") \
        == "Communication"
    assert categorize("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<"
                      "FusedAdamMathFunctor>") == "Optimizer"



def _kernel_names(export: Path) -> list[str]:
    con = sqlite3.connect(export)
    names = [r[0] for r in con.execute(
        "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.demangledName")]  # fmt: skip
    con.close()
    return names


def test_categories_of_real_sdpa_kernels() -> None:
    # SDPA (fp32) on the H100: PyTorch's memory-efficient attention (CUTLASS fmha) kernel
    names = _kernel_names(H100 / "attention_sdpa_b32_s1000_e256.sqlite")
    fmha = [n for n in names if n.startswith("fmha_cutlass")]
    assert fmha and all(categorize(n) == "Attention" for n in fmha)
    assert all(tensor_core_rule(n) is None for n in fmha)  # f32 kernel: no tensor cores
    assert {categorize(n) for n in names} == {"Attention", "GEMM", "Normalization", "Elementwise"}


def test_categories_of_real_training_kernels() -> None:
    # GPT-small forward/backward/AdamW step on the H100 (fp32)
    names = _kernel_names(H100 / "gpt_small_train_fp32_ctx512.sqlite")
    by_cat: dict[str, list[str]] = {}
    for n in names:
        by_cat.setdefault(categorize(n), []).append(n)
    optim = [n for n in names if "multi_tensor_apply_kernel" in n]  # foreach AdamW kernels
    assert len(optim) >= 5 and sorted(by_cat["Optimizer"]) == sorted(optim)
    attn = [n for n in names if "PyTorchMemEffAttention" in n]  # forward + backward fmha
    assert any("AttentionBackwardKernel" in n for n in attn)
    assert sorted(by_cat["Attention"]) == sorted(attn)
    assert all(categorize(n) == "GEMM" for n in names if "xmma_gemm" in n or "sgemm" in n)
    assert all(categorize(n) == "Softmax" for n in names if "SoftMax" in n)
    assert categorize(next(n for n in names if "embedding_backward" in n)) == "CopyMemset"
    assert "Other" not in by_cat, by_cat.get("Other")
    assert not any(tensor_core_rule(n) for n in names)  # fp32 run: FFMA/SIMT GEMMs only
    m = run_metrics(H100 / "gpt_small_train_fp32_ctx512.sqlite")
    con = sqlite3.connect(H100 / "gpt_small_train_fp32_ctx512.sqlite")
    optim_ns = con.execute(
        "SELECT sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
        "ON s.id = k.demangledName WHERE s.value LIKE '%multi_tensor_apply_kernel%'").fetchone()[0]
    con.close()
    assert m["category_time_ns.Optimizer"] == optim_ns > 0


def test_run_metrics_from_real_rows() -> None:
    m = run_metrics(H100_2025)
    con = sqlite3.connect(H100_2025)
    k_time, k_count = con.execute(
        "SELECT sum(end - start), count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    m_time = con.execute("SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()[0]
    lo, hi = con.execute(
        "SELECT min(s), max(e) FROM (SELECT start s, end e FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY)").fetchone()
    # launch overhead of the first kernel: kernel start - its cudaLaunch* start
    con.close()
    assert m["kernel_time_ns"] == k_time and m["kernel_count"] == k_count == 116
    assert m["capture_span_ns"] == hi - lo
    # one stream, no overlap: busy union = kernel + memcpy time
    assert m["idle_gap_ns"] == (hi - lo) - (k_time + m_time)
    assert m["gpu_utilization"] == pytest.approx((k_time + m_time) / (hi - lo))
    assert m["tensor_core_share"] == 0.0  # fp32 FFMA/SIMT GEMMs only
    assert sum(m[f"category_time_ns.{c}"] for c in
               ("GEMM", "Softmax", "Normalization", "Elementwise", "Reduction", "CopyMemset")) \
        == k_time + m_time
    assert m["gpu_name"] == "NVIDIA H100 80GB HBM3" and m["compute_capability"] == "9.0"
    assert 0 < m["theoretical_occupancy"] < 1 and 0.99 < m["sm_efficiency"] <= 1
    assert m["launch_overhead_median_ns"] > 0


def test_launch_overhead_matches_sql() -> None:
    con = sqlite3.connect(H100_2025)
    rows = con.execute(
        "SELECT k.start - r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN "
        "CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
        "AND k.globalPid = (r.globalTid & -16777216)").fetchall()  # fmt: skip
    con.close()
    assert len(rows) == 116
    assert run_metrics(H100_2025)["launch_overhead_median_ns"] == float(
        np.median([r[0] for r in rows])
    )


def test_union_busy() -> None:
    busy, gaps = union_busy(np.array([0, 5, 20, 22]), np.array([10, 12, 25, 23]))
    assert busy == 12 + 5 and gaps.tolist() == [8]


def test_cpu_only_metrics_are_null() -> None:
    for name in ("cpu_no_nvtx.sqlite", "cpu_nvtx_domains.sqlite"):
        m = run_metrics(CPU / name)
        assert m["kernel_count"] == 0
        assert m["kernel_time_ns"] is None and m["gpu_utilization"] is None
        assert m["tensor_core_share"] is None and m["gpu_name"] is None
        assert m["category_time_ns.GEMM"] is None


def test_extras_cli_and_metrics_json(tmp_path: Path) -> None:
    out = tmp_path / "x"
    subprocess.run([sys.executable, "-m", "analysis", "extras", str(H100_2025), "-o", str(out)],
                   check=True, cwd=ROOT)  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    expected = run_metrics(H100_2025)
    assert {k: metrics[k] for k in expected} == expected
    # plus the phase attribution (tests/test_phases.py) and the nsys that made the export
    assert metrics["nsys_version"] == "2025.3.2.0"
    assert "phase_gpu_ms_forward_pass" in metrics and (out / "phase_gpu_time.csv").is_file()
    for name in ("kernel_categories", "nvtx_categories", "tensor_core", "kernel_occupancy",
                 "gpu_utilization", "launch_overhead"):  # fmt: skip
        assert (out / f"{name}.csv").stat().st_size > 0


def test_compare_two_runs(tmp_path: Path) -> None:
    a = tmp_path / "run_a"
    a.mkdir()
    (a / "profile.sqlite").symlink_to(H100 / "attention_simple_vs_sdpa_nsys2024.2.3.sqlite")
    res = subprocess.run(
        [sys.executable, "-m", "analysis", "compare", str(a), str(H100_2025), "-o",
         str(tmp_path / "cmp")],
        check=True, cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert "GEMM" in res.stdout and ":simple" in res.stdout
    rows = (tmp_path / "cmp" / "compare_categories.csv").read_text().splitlines()
    assert rows[0] == "Category,A (ns),B (ns),B/A" and rows[-1].startswith("Total,")


def test_compare_of_statistics_folders_equals_compare_of_the_exports(tmp_path: Path) -> None:
    # the pipeline compares the runs' stats/ folders (`analysis all`); same tables as from
    # the two real H100 exports, and the metrics plus the nsys that made each export
    exports = {"a": H100 / "attention_simple_vs_sdpa_nsys2024.2.3.sqlite", "b": H100_2025}
    for side, export in exports.items():
        subprocess.run([sys.executable, "-m", "analysis", "all", str(export), "-o",
                        str(tmp_path / side / "stats")], check=True, cwd=ROOT,
                       capture_output=True)
    from_exports = compare(exports["a"], exports["b"], tmp_path / "from_exports")
    from_stats = compare(tmp_path / "a" / "stats", tmp_path / "b", tmp_path / "from_stats")
    assert from_stats.categories.rows == from_exports.categories.rows
    assert from_stats.nvtx.rows == from_exports.nvtx.rows
    assert len(from_stats.nvtx.rows) > 5 and len(from_stats.categories.rows) > 2
    metrics = {row[0]: row[1:] for row in from_stats.metrics.rows}
    assert [metrics[row[0]] for row in from_exports.metrics.rows] == [
        row[1:] for row in from_exports.metrics.rows]
    assert metrics.pop("nsys_version")[:2] == ["2024.2.3.38", "2025.3.2.0"]
    assert set(metrics) == {row[0] for row in from_exports.metrics.rows}


def test_compare_names_a_folder_without_a_capture_or_statistics(tmp_path: Path) -> None:
    (tmp_path / "run" / "stats").mkdir(parents=True)
    (tmp_path / "run" / "stats" / "metrics.json").write_text("{}")
    with pytest.raises(ExportError, match="nvtx_sum.csv"):
        compare(tmp_path / "run", H100_2025, tmp_path / "cmp")


@pytest.mark.parametrize("kind", ["garbage", "truncated", "not_nsys", "missing"])
def test_bad_exports_raise_export_error(kind: str, tmp_path: Path) -> None:
    bad = tmp_path / f"{kind}.sqlite"
    if kind == "garbage":
        bad.write_bytes(b"this is not sqlite" * 100)
    elif kind == "truncated":
        bad.write_bytes(H100_2025.read_bytes()[: 300_000])
    elif kind == "not_nsys":
        con = sqlite3.connect(bad)
        con.execute("CREATE TABLE t(x)")
        con.commit()
        con.close()
    with pytest.raises(ExportError, match=str(bad.name)):
        run_metrics(bad)
    res = subprocess.run([sys.executable, "-m", "analysis", "stats", str(bad), "-o",
                          str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2
    assert bad.name in res.stderr and "Traceback" not in res.stderr


def test_bf16_training_capture_runs_on_tensor_cores() -> None:
    """The real H100 bf16-autocast train step: its cuBLAS GEMMs (nvjet / sm90 kernels) are
    tensor-core kernels, and they are the only GEMMs there."""
    con = sqlite3.connect(H100 / "gpt_small_train_bf16_ctx512.sqlite")
    names = [r[0] for r in con.execute(
        "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.demangledName")]  # fmt: skip
    con.close()
    gemms = [n for n in names if categorize(n) == "GEMM"]
    assert any(n.startswith("nvjet") for n in gemms), gemms
    assert gemms and all(uses_tensor_cores(n) for n in gemms), [
        n for n in gemms if not uses_tensor_cores(n)]
    share = run_metrics(H100 / "gpt_small_train_bf16_ctx512.sqlite")
    assert 0.05 < share["tensor_core_share"] < 1.0
