"""The report's figures and the per-run idle / kernel-duration tables, on real H100 data.

* ``tests/fixtures/results_h100_subset``: stats, timing and traced records of a partial H100
  pipeline run (one run has stats; ``plan.json`` was reconstructed from the run records);
* ``tests/fixtures/h100/*.sqlite``: real exports, for the extras (idle time, durations),
  checked against sums computed here straight from the SQLite file.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.cli import main as analysis_main
from analysis.metrics.durations import SHORT_KERNEL_NS, durations_table
from analysis.metrics.idle import CAUSES, idle_breakdown
from analysis.outputs.aggregate import summary_table
from analysis.outputs.figures import FIGURES, short_kernel, write_figures
from analysis.outputs.ladders import write_ladders
from analysis.outputs.runs import read_plan
from analysis.reading.export import Export
from tests.analysis_fixtures import FIXTURES, H100

SUBSET = FIXTURES / "results_h100_subset"
EXPORTS = ["gpt_small_train_bf16_ctx512", "attention_naive_b32_s100_e256"]
PNG = b"\x89PNG\r\n\x1a\n"
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
              "CUPTI_ACTIVITY_KIND_MEMSET")  # fmt: skip


def _sql_ops(path: Path) -> list[tuple[int, int, int]]:
    """(device, start, end) of every GPU op, read with sqlite3 (independent of Export)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    rows = []
    for t in GPU_TABLES:
        if t in tables:
            rows += con.execute(f"SELECT deviceId, start, end FROM {t}").fetchall()
    con.close()
    return rows


def _span_minus_busy(rows: list[tuple[int, int, int]]) -> dict[int, int]:
    """Per device: span - length of the union of [start, end), with a plain merge loop."""
    out = {}
    for dev in {r[0] for r in rows}:
        intervals = sorted((s, e) for d, s, e in rows if d == dev)
        busy, cur_s, cur_e = 0, *intervals[0]
        for s, e in intervals[1:]:
            if s > cur_e:
                busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        span = max(e for _, e in intervals) - intervals[0][0]
        out[dev] = span - busy
    return out


@pytest.mark.parametrize("name", EXPORTS)
def test_idle_causes_add_up_to_idle_time(name: str) -> None:
    path = H100 / f"{name}.sqlite"
    expected = _span_minus_busy(_sql_ops(path))
    with Export(path) as ex:
        b = idle_breakdown(ex)
    assert set(b.span_ns) == set(expected)
    for dev, idle in expected.items():
        ours = sum(b.idle_ns[(dev, c)] for c in CAUSES)
        assert ours == pytest.approx(idle, rel=0.01)
    assert all(v >= 0 for v in b.idle_ns.values())


@pytest.mark.parametrize("name", EXPORTS)
def test_kernel_duration_bins(name: str) -> None:
    path = H100 / f"{name}.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    total, short = con.execute(
        "SELECT count(*), sum(end - start < ?) FROM CUPTI_ACTIVITY_KIND_KERNEL",
        (SHORT_KERNEL_NS,),
    ).fetchone()
    con.close()
    with Export(path) as ex:
        table, metrics = durations_table(ex)
    frame = pd.DataFrame(table.rows, columns=table.header)
    assert frame["kernels"].astype(int).sum() == total
    assert metrics["kernels_under_10us_share"] == pytest.approx(short / total, abs=1e-12)
    under = frame[frame["bin_high_ns"].replace("inf", np.inf).astype(float) <= SHORT_KERNEL_NS]
    assert under["kernels"].astype(int).sum() == short  # 10 µs is a bin edge


def test_extras_write_idle_and_durations(tmp_path: Path) -> None:
    name = EXPORTS[1]
    analysis_main(["extras", str(H100 / f"{name}.sqlite"), "-o", str(tmp_path)])
    idle = pd.read_csv(tmp_path / "idle_time.csv")
    assert list(idle["cause"]) == list(CAUSES)
    util = pd.read_csv(tmp_path / "gpu_utilization.csv")
    assert idle["idle_ns"].sum() == util["Idle (ns)"].sum()
    metrics = pd.read_json(tmp_path / "metrics.json", typ="series")
    assert sum(metrics[f"idle_{c}_ns"] for c in CAUSES) == metrics["idle_gap_ns"]
    assert 0 <= metrics["kernels_under_10us_share"] <= 1


def _full_results(tmp_path: Path) -> Path:
    """The H100 subset plus two runs analysed here from real exports; summary and ladders."""
    results = tmp_path / "results"
    shutil.copytree(SUBSET, results)
    for name in EXPORTS:
        analysis_main(["all", str(H100 / f"{name}.sqlite"), "-o",
                       str(results / f"fixture_{name}" / "stats")])  # fmt: skip
    plan = read_plan(results)
    summary = summary_table(results, plan)
    summary.to_csv(results / "summary.csv", index=False)
    write_ladders(results, plan, summary, results / "ladders")
    return results


def _check_pngs(paths: list[Path], outdir: Path) -> None:
    assert [p.name for p in paths] == [f"{n}.png" for n in FIGURES]
    assert sorted(p.name for p in outdir.iterdir()) == sorted(f"{n}.png" for n in FIGURES)
    for p in paths:
        assert p.stat().st_size > 1000 and p.read_bytes()[:8] == PNG


def test_all_figures_from_real_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analysis.outputs.style import has_data

    results = _full_results(tmp_path)
    paths = write_figures(results / "summary.csv", results, results / "plots")
    _check_pngs(paths, results / "plots")
    assert "warning" not in capsys.readouterr().err  # no figure fell back to a placeholder
    assert all(has_data(p) for p in paths)
    # the partial run has failed rungs and runs: drawn as gaps, not dropped
    ladder = pd.read_csv(results / "ladders" / "gpt_train_small.csv")
    assert (ladder["status"] != "ok").any()


def test_figures_drawn_side_by_side_are_the_same_files(tmp_path: Path) -> None:
    """--jobs draws each figure in a forked process: the same PNGs, byte for byte."""
    results = _full_results(tmp_path)
    one = write_figures(results / "summary.csv", results, tmp_path / "one")
    four = write_figures(results / "summary.csv", results, tmp_path / "four", jobs=4)
    _check_pngs(four, tmp_path / "four")
    assert [p.read_bytes() for p in four] == [p.read_bytes() for p in one]


def test_failed_cells_do_not_break_figures(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    results = _full_results(tmp_path)
    summary = pd.read_csv(results / "summary.csv")
    attention = summary["workload"].isin(["attention", "attention_core"])
    summary.loc[attention, ["status", "tflops", "step_ms"]] = ["oom", None, None]
    summary.to_csv(results / "summary.csv", index=False)
    ladder = results / "ladders" / "gpt_train_small.csv"
    pd.read_csv(ladder).assign(status="unsupported", step_ms=None).to_csv(ladder, index=False)
    paths = write_figures(results / "summary.csv", results, results / "plots")
    _check_pngs(paths, results / "plots")
    assert "warning" not in capsys.readouterr().err


def test_all_figures_without_data(tmp_path: Path) -> None:
    from analysis.outputs.overview import key_figures
    from analysis.outputs.style import has_data

    results = tmp_path / "empty"
    results.mkdir()
    paths = write_figures(results / "summary.csv", results, results / "plots")
    _check_pngs(paths, results / "plots")
    # placeholders say so in the PNG itself, and the overview shows none of them
    assert not any(has_data(p) for p in paths)
    assert key_figures(results) == []


def test_short_kernel_names() -> None:
    name = ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add"
            "<float>, std::array<char *, (unsigned long)3>>(int, T2, T3)")
    assert short_kernel(name) == "vectorized_elementwise_kernel"
