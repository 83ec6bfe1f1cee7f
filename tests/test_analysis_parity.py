"""Parity of ``python -m analysis stats`` with ``nsys stats`` on real exports.

Every export under tests/fixtures/{h100,h200x2,cpu,probe,nsys2025} is compared, report by
report and cell by cell, with the CSVs that ``nsys stats --report R --format csv`` printed
for it: tests/fixtures/nsys2025/<stem>/ (Nsight Systems 2025.3.1, the reference, run on
the H100 machine) and tests/fixtures/nsys2024/<stem>/ (2024.2.3, run on the CPU machine).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from analysis.reading import Export
from analysis.reports import REPORTS
from analysis.reports.nsys_stats import Context, run_reports
from tests.analysis_fixtures import FIXTURES, compare_report

ROOT = Path(__file__).resolve().parents[1]


def _exports() -> dict[str, Path]:
    found = {}
    for sub in ("h100", "h200x2", "cpu", "probe", "nsys2025"):
        for p in sorted((FIXTURES / sub).glob("*.sqlite")):
            found[p.stem] = p
    return found


EXPORTS = _exports()
CASES = [
    (stem, version)
    for version in ("2025", "2024")
    for stem in EXPORTS
    if (FIXTURES / f"nsys{version}" / stem / "nvtx_sum.csv").exists()
]


def _differences(out: Path, stem: str, version: str, reports: Sequence[str]) -> list[str]:
    """Differences of the CSVs in ``out`` from nsys ``version``'s CSVs for ``stem``."""
    problems = []
    for report in reports:
        ref = FIXTURES / f"nsys{version}" / stem / f"{report}.csv"
        problems += compare_report(out / f"{report}.csv", ref, report)
    return problems


def test_fixtures_present() -> None:
    # the reference (2025.3.1) CSVs must exist for every real H100 export
    for stem in (
        "attention_simple_vs_sdpa_nsys2024.2.3",
        "attention_simple_vs_sdpa_nsys2025.3.1",
        "attention_naive_b32_s100_e256",
        "attention_sdpa_b32_s1000_e256",
        "gpt_small_train_fp32_ctx512",
        "gpt_small_train_bf16_ctx512",
    ):
        assert (stem, "2025") in CASES
        assert (stem, "2024") in CASES
    # one rank's capture of a 2-GPU run (NCCL kernels; H200 x2, nsys 2025.3.1 on that host)
    for stem in ("gpt_small_ddp2_rank1", "gpt_small_fsdp2_rank0"):
        assert (stem, "2025") in CASES


@pytest.mark.parametrize("reader", ["file", "sql"])
@pytest.mark.parametrize(("stem", "version"), CASES, ids=[f"{s}-nsys{v}" for s, v in CASES])
def test_stats_parity(stem: str, version: str, reader: str, tmp_path: Path) -> None:
    # reader: big tables read from the file itself (default) or through SQL (fallback)
    with Export(EXPORTS[stem], nsys_version=version, read_pages=reader == "file") as ex:
        tables = run_reports(Context(ex))
    for report in REPORTS:
        tables[report].write(tmp_path / f"{report}.csv")
    problems = _differences(tmp_path, stem, version, REPORTS)
    assert not problems, "\n".join(problems)


def test_cli_stats_writes_seven_csvs(tmp_path: Path) -> None:
    stem = "attention_simple_vs_sdpa_nsys2025.3.1"
    out = tmp_path / "out"
    subprocess.run(
        [sys.executable, "-m", "analysis", "stats", str(EXPORTS[stem]), "-o", str(out)],
        check=True,
        cwd=ROOT,
    )
    problems = _differences(out, stem, "2025", REPORTS)
    assert not problems, "\n".join(problems)


def test_cli_single_report_with_prefetch(tmp_path: Path) -> None:
    # the forked API-table prefetch path, forced on a small export
    stem = "attention_simple_vs_sdpa_nsys2025.3.1"
    # the page decoder would load the table in a thread, without a fork
    with Export(EXPORTS[stem], read_pages=False) as ex:
        ex.prefetch_runtime(min_rows=0)
        table = run_reports(Context(ex), ("cuda_api_sum",))["cuda_api_sum"]
    table.write(tmp_path / "cuda_api_sum.csv")
    ref = FIXTURES / "nsys2025" / stem / "cuda_api_sum.csv"
    assert not compare_report(tmp_path / "cuda_api_sum.csv", ref, "cuda_api_sum")


def test_cpu_only_export_gives_header_only_csvs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    subprocess.run(
        [sys.executable, "-m", "analysis", "all", str(EXPORTS["cpu_no_nvtx"]), "-o", str(out)],
        check=True,
        cwd=ROOT,
    )
    for report in REPORTS:
        lines = (out / f"{report}.csv").read_text().splitlines()
        assert len(lines) == 1 and lines[0].count(",") >= 7, report


def test_cli_chosen_reports_only(tmp_path: Path) -> None:
    # --report (repeatable) writes just those reports, with the 2024.2.3 naming asked for
    stem, out = "attention_simple_vs_sdpa_nsys2024.2.3", tmp_path / "out"
    chosen = ["nvtx_sum", "cuda_gpu_mem_size_sum"]
    cmd = [sys.executable, "-m", "analysis", "stats", str(EXPORTS[stem]), "-o", str(out),
           "--nsys-version", "2024"]  # fmt: skip
    for r in chosen:
        cmd += ["--report", r]
    subprocess.run(cmd, check=True, cwd=ROOT)
    assert sorted(p.stem for p in out.iterdir()) == sorted(chosen)
    problems = _differences(out, stem, "2024", chosen)
    assert not problems, "\n".join(problems)


def test_cli_unknown_report_is_a_one_line_error(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "analysis", "stats", str(EXPORTS["cpu_no_nvtx"]), "-o",
         str(tmp_path), "--report", "cuda_gpu_kern"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert res.returncode == 2
    assert "invalid choice: 'cuda_gpu_kern'" in res.stderr and "Traceback" not in res.stderr
