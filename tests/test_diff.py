"""`python -m analysis diff OLD NEW`: run matching, verdicts, explanations, layouts, exit code.

Results folders are built from real pieces: timing records with known step-time
distributions (tests/timing_records.py: the workloads' own record code, step times drawn
with a fixed seed, so every verdict below follows from the distributions, never from this
CPU's noise), stats from real H100 exports (tests/fixtures/h100) analysed by `python -m
analysis all`, and the published H100 results folders (two runs of the standard config on
the same GPU and software, whose differences are noise). The noise rule itself is also tested
on synthetic numbers. The acceptance test (marked slow) diffs two real pipeline runs of the
sleep workload, whose step times differ eightfold by construction.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import LEAN_NSYS, REPO, snakemake
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox
from PIL import Image
from timing_records import normal_processes, write_timing

from analysis.metrics.timing import summarize
from analysis.outputs import diff, diff_rerun, style
from analysis.outputs.diff_noise import (
    MAX_PROCESSES,
    Side,
    noise_floor,
    process_gap,
    process_noise,
    process_spread,
    processes_needed,
    t_quantile_995,
    verdict,
)
from analysis.outputs.diff_plot import (
    X_LABEL,
    plain_ratio,
    plot_ratios,
    ratio_ticks,
    ratios_figure,
)
from analysis.outputs.diff_verdicts import params_changed
from analysis.outputs.runs import read_timing

H100 = REPO / "tests" / "fixtures" / "h100"
PUBLISHED = REPO / "tests" / "fixtures" / "published" / "h100-subfolders"
# Two runs of the standard config, same GPU, driver, torch, CUDA, cuDNN and nsys: every
# difference between them is noise (the commit differs, in the pipeline, not the workloads).
STANDARD_OLD = REPO / "tests" / "fixtures" / "published" / "h100-standard-efb5638"
STANDARD_NEW = REPO / "published" / "h100" / "standard"
needs_standard = pytest.mark.skipif(not (STANDARD_OLD.is_dir() and STANDARD_NEW.is_dir()),
                                    reason="published H100 standard runs not in checkout")
STEPS = "--warmup 2 --steps 8"
ATTENTION = f"attention --batch 2 --seq 512 --embed 64 --heads 2 --mode forward {STEPS}"
GPT = f"gpt --size tiny --mode forward --context 32 --batch 2 {STEPS}"
PROCESSES = 2
# Step-time distributions, N(mean, sd) in ms: attention 4x faster with SDPA (far beyond the
# 20% threshold, the CIs of 2 x 8 steps at 2% sd nowhere near 1), GPT unchanged (both sides
# drawn from one distribution).
ATTENTION_MS = {"naive": (40.0, 0.8), "sdpa": (10.0, 0.2)}
GPT_MS = (20.0, 0.4)


def analyse(export: Path, stats: Path) -> None:
    """The run's stats/ as the pipeline writes them: `analysis all` plus the phase table."""
    subprocess.run([sys.executable, "-m", "analysis", "all", str(export), "-o", str(stats)],
                   cwd=REPO, check=True, capture_output=True)
    if not (stats / "phase_gpu_time.csv").exists():
        from analysis.export import Export

        from analysis.metrics.phases import phase_table

        with Export(export) as ex:
            pd.DataFrame(phase_table(ex)).to_csv(stats / "phase_gpu_time.csv", index=False)


def write_summary(root: Path) -> None:
    """``root/summary.csv`` as the pipeline's aggregate starts it: one row per run folder with
    its status and untraced step time with CI (what marks a finished results folder)."""
    rows = []
    for run_dir in sorted(p for p in root.iterdir() if (p / "timing").is_dir()):
        timing = read_timing(run_dir)
        row = {"run": run_dir.name, "status": timing.status}
        if timing.per_process_ms:
            s = summarize(timing.per_process_ms)
            row.update(step_ms=s.median_ms, step_ci_low_ms=s.ci_low_ms,
                       step_ci_high_ms=s.ci_high_ms)
        rows.append(row)
    pd.DataFrame(rows).to_csv(root / "summary.csv", index=False)


def build_side(root: Path, impl: str, seed: int, attention_stats: Path, gpt_stats: Path) -> None:
    """Two untraced processes per run, the traced times.json (the first process's record, as
    a capture of the same steps would be), the real stats of both runs and the summary."""
    write_timing(root / "attn", f"{ATTENTION} --impl {impl}",
                 normal_processes(seed, *ATTENTION_MS[impl], PROCESSES, 8))
    write_timing(root / "gpt", GPT, normal_processes(seed + 1, *GPT_MS, PROCESSES, 8))
    for run, stats in (("attn", attention_stats), ("gpt", gpt_stats)):
        shutil.copy(root / run / "timing" / "r0.json", root / run / "times.json")
        shutil.copytree(stats, root / run / "stats")
    write_summary(root)


def subset(src: Path, dest: Path, runs: list[str], summary: bool = True) -> Path:
    """A results folder holding only ``runs`` of ``src``: their folders, and the summary's rows
    of those runs (none with ``summary=False``)."""
    dest.mkdir(parents=True)
    for run in runs:
        shutil.copytree(src / run, dest / run)
    if summary:
        table = pd.read_csv(src / "summary.csv")
        table[table["run"].isin(runs)].to_csv(dest / "summary.csv", index=False)
    return dest


def cli(*args: object) -> subprocess.CompletedProcess:
    """`python -m analysis diff ARGS`, as CI calls it."""
    return subprocess.run([sys.executable, "-m", "analysis", "diff", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True)


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """OLD: attention naive; NEW: attention SDPA; the GPT run unchanged."""
    base = tmp_path_factory.mktemp("diff")
    stats = {name: base / "stats" / name for name in ("naive", "sdpa", "gpt")}
    analyse(H100 / "attention_naive_b32_s100_e256.sqlite", stats["naive"])
    analyse(H100 / "attention_sdpa_b32_s1000_e256.sqlite", stats["sdpa"])
    analyse(H100 / "gpt_small_train_fp32_ctx512.sqlite", stats["gpt"])
    old, new = base / "old", base / "new"
    build_side(old, "naive", 1, stats["naive"], stats["gpt"])
    build_side(new, "sdpa", 11, stats["sdpa"], stats["gpt"])
    return old, new


def test_changed_run_faster_unchanged_within_noise(sides: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    old, new = sides
    assert diff.write_diff(old, new, tmp_path, threshold_pct=20) == 0
    runs = pd.read_csv(tmp_path / "runs.csv").set_index("run")
    assert runs.loc["attn", "verdict"] == "faster"
    assert runs.loc["attn", "speedup_ci_low"] > 1
    assert runs.loc["attn", "speedup"] == pytest.approx(4.0, rel=0.05)  # 40 ms / 10 ms
    assert runs.loc["attn", "params_changed"] == "impl: naive->sdpa"
    assert runs.loc["attn", "old_timing_source"] == "untraced"
    assert runs.loc["attn", "old_processes"] == 2
    assert bool(runs.loc["attn", "cis_separate"])
    assert runs.loc["attn", "noise_floor_pct"] >= 20  # the threshold at least
    assert runs.loc["gpt", "verdict"] == "within noise"
    assert pd.isna(runs.loc["gpt", "params_changed"])


def test_explanation_from_the_kernel_tables(sides: tuple[Path, Path], tmp_path: Path) -> None:
    """naive attention has no Attention-category kernel and a softmax; SDPA the reverse."""
    diff.write_diff(*sides, tmp_path, threshold_pct=20)
    cats = pd.read_csv(tmp_path / "categories.csv").set_index("category")
    assert set(cats["run"]) == {"attn"}  # the unchanged run is not explained
    assert cats.loc["Attention", "old_ms_per_step"] == 0
    assert cats.loc["Attention", "new_ms_per_step"] > 0
    assert cats.loc["Softmax", "old_ms_per_step"] > 0
    assert cats.loc["Softmax", "new_ms_per_step"] == 0
    ranges = pd.read_csv(tmp_path / "ranges.csv").set_index("range")
    assert (ranges["basis"] == "gpu").all()
    # the naive-only ranges are not on the new side: not comparable, not a -100% change
    assert ranges.loc["computing softmax", "old_ms_per_step"] > 0
    assert pd.isna(ranges.loc["computing softmax", "new_ms_per_step"])
    assert pd.isna(ranges.loc["computing softmax", "delta_ms_per_step"])
    assert ranges.loc["computing softmax", "comparable"] == (
        "not comparable (no such range in new: its code does not open it)")
    kernels = pd.read_csv(tmp_path / "kernels.csv")
    deltas = kernels["delta_ms_per_step"].abs()
    assert list(deltas) == sorted(deltas, reverse=True)


def test_fail_on_slower_exit_code(sides: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = sides
    cli = [sys.executable, "-m", "analysis.outputs.diff"]

    def exit_code(a: Path, b: Path, out: str) -> int:
        args = [*cli, str(a), str(b), "-o", str(tmp_path / out), "--threshold", "20",
                "--fail-on-slower", "10"]
        return subprocess.run(args, cwd=REPO, capture_output=True).returncode

    assert exit_code(old, new, "forward") == 0  # attention got faster
    assert exit_code(new, old, "backward") == 1  # the same pair reversed: slower
    runs = pd.read_csv(tmp_path / "backward" / "runs.csv").set_index("run")
    assert runs.loc["attn", "verdict"] == "slower"
    assert runs.loc["attn", "change_pct"] > 10


def test_markdown_layout(sides: tuple[Path, Path], tmp_path: Path) -> None:
    diff.write_diff(*sides, tmp_path, threshold_pct=20)
    text = (tmp_path / "summary.md").read_text()
    sections = [line for line in text.splitlines() if line.startswith("### ")]
    assert sections[:2] == ["### Provenance differences", "### Step time per run"]
    assert "### `attn`: faster" in sections[2]
    assert "Indicative only" not in text  # both sides untraced
    assert (tmp_path / "ratios.png").stat().st_size > 1000


def test_runs_only_on_one_side_and_traced_fallback(sides: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    """A published-style side: runs/<run>/ with times.json and the CSVs beside it, no timing/."""
    old, new = sides
    published = tmp_path / "published" / "sub" / "runs"
    for run in ("attn", "gone", "dropped"):
        (published / run).mkdir(parents=True)
        shutil.copy(old / "attn" / "times.json", published / run / "times.json")
        for csv in (old / "attn" / "stats").glob("*.csv"):
            shutil.copy(csv, published / run / csv.name)
    # as published has it; "dropped" is a folder its summary does not list (a run the config
    # has since dropped): not a run of that side
    summary = pd.read_csv(old / "summary.csv")
    summary["run"] = summary["run"].replace({"gpt": "gone"})
    summary.to_csv(published.parent / "summary.csv", index=False)
    out = tmp_path / "out"
    diff.write_diff(tmp_path / "published", new, out, threshold_pct=20)
    runs = pd.read_csv(out / "runs.csv").set_index("run")
    assert runs.loc["attn", "old_timing_source"] == "traced"
    assert runs.loc["attn", "new_timing_source"] == "untraced"
    # one traced process (8 steps at 40 ms) against two untraced ones at 10 ms: still faster
    assert runs.loc["attn", "verdict"] == "faster" and runs.loc["attn", "speedup_ci_low"] > 1
    assert runs.loc["attn", "old_processes"] == 1
    assert runs.loc["gone", "presence"] == "old_only"
    assert runs.loc["gpt", "presence"] == "new_only"
    assert "dropped" not in runs.index
    text = (out / "summary.md").read_text()
    assert "mixes traced and untraced" in text
    assert "**Only in old** (1): `gone`" in text


def test_provenance_difference_listed_first(sides: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = sides
    moved = tmp_path / "new"
    shutil.copytree(new, moved)
    for record in moved.glob("*/timing/r*.json"):
        data = json.loads(record.read_text())
        data["provenance"]["versions"]["torch"] = "9.9.9"
        record.write_text(json.dumps(data))
    diff.write_diff(old, moved, tmp_path / "out", threshold_pct=20)
    prov = pd.read_csv(tmp_path / "out" / "provenance.csv")
    assert prov.iloc[0].to_dict()["field"] == "torch"
    assert prov.iloc[0]["new"] == "9.9.9" and bool(prov.iloc[0]["differs"])
    assert prov["differs"].sum() == 1
    # the nsys that made the captures, from their metadata (metrics.json)
    made_by = json.loads((old / "attn" / "stats" / "metrics.json").read_text())["nsys_version"]
    assert prov.set_index("field").loc["nsys", "old"] == made_by
    assert "| torch |" in (tmp_path / "out" / "summary.md").read_text()


def test_bad_folder_is_a_one_line_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "analysis.outputs.diff", str(tmp_path),
                           str(tmp_path / "missing"), "-o", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {tmp_path}: no runs found "
                                                "(no <run>/times.json or <run>/timing/)"]


@pytest.mark.skipif(not PUBLISHED.is_dir(), reason="published H100 results not in checkout")
def test_published_layout_merges_sub_folders(tmp_path: Path) -> None:
    """The committed H100 results against themselves: every run found once, none changed;
    the train fp32 runs present in both sub-folders pool their two traced processes. A run
    whose one traced process scatters by more than the threshold (or whose two processes
    spread) cannot show a 5% change: inconclusive, with the processes that would judge it."""
    assert diff.write_diff(PUBLISHED, PUBLISHED, tmp_path, fail_on_slower=0) == 0
    runs = pd.read_csv(tmp_path / "runs.csv").set_index("run")
    assert len(runs) == 24
    assert runs["verdict"].isin(["within noise", "inconclusive"]).all()
    judged = runs[runs["verdict"] == "within noise"]
    unjudged = runs[runs["verdict"] == "inconclusive"]
    assert len(judged) >= 10 and len(unjudged) >= 10
    assert (judged["noise_floor_pct"] == diff.DEFAULT_THRESHOLD_PCT).all()
    assert judged["processes_needed"].isna().all()
    assert (unjudged["noise_floor_pct"] > diff.DEFAULT_THRESHOLD_PCT).all()
    assert (unjudged["processes_needed"] > unjudged["old_processes"]).all()
    assert runs.loc["gpt_small_train_fp32_ctx512", "old_folders"] == 2
    assert runs.loc["gpt_small_train_fp32_ctx512", "old_processes"] == 2
    assert (runs["old_timing_source"] == "traced").all()


# --- the noise rule, on synthetic numbers ------------------------------------------------------


def quiet(ms: float) -> Side:
    """A run of three processes within 0.2% of each other, CI +-0.5%."""
    return Side(ms, ms * 0.995, ms * 1.005, (ms * 0.998, ms, ms * 1.002))


def test_noise_rule_on_synthetic_numbers() -> None:
    # quiet runs: the threshold is the floor, an 8% change with separate CIs is a verdict
    assert noise_floor(quiet(10), quiet(10.8), 0.05) == 0.05
    assert verdict(quiet(10), quiet(10.8), 0.05) == "slower"
    assert verdict(quiet(10.8), quiet(10), 0.05) == "faster"
    assert verdict(quiet(10), quiet(10.8), 0.10) == "within noise"  # under the threshold
    # a big change whose CIs overlap, on sides that scatter by more than the threshold:
    # not shown changed, and no 5% change could have been: inconclusive
    wide = Side(13.0, 11.0, 13.5, (11.0, 13.0, 13.4))
    assert verdict(Side(10.0, 9.0, 11.5, (9.2, 10.0, 11.4)), wide, 0.05) == "inconclusive"
    # processes apart, by less than the step noise (a CI half-width of 25%): inconclusive
    assert verdict(Side(10.0, 7.5, 12.5, (10.0, 10.0, 10.0)),
                   Side(12.0, 11.5, 12.5, (12.0, 12.0, 12.0)), 0.05) == "inconclusive"
    # quiet sides whose CIs overlap: within noise (a change above 5% would have shown)
    assert verdict(quiet(10), quiet(10.05), 0.05) == "within noise"
    # separate CIs (a bootstrap over three processes can be narrow) but processes 10% apart:
    # the process noise is t(0.995, 2) * sd / sqrt(3) = 9.925 * 1 / 1.732 / 10 = 57%
    scattered = Side(10.0, 9.9, 10.1, (9.0, 10.0, 11.0))
    assert process_noise(scattered.process_medians_ms, 10.0) == pytest.approx(0.573, abs=1e-3)
    assert noise_floor(scattered, quiet(12), 0.05) == pytest.approx(0.573, abs=1e-3)
    overlapping = Side(11.5, 11.4, 11.6, (10.9, 11.5, 12.1))  # +15% < 57%, processes mixed
    assert process_gap(scattered, overlapping) == 0
    assert verdict(scattered, overlapping, 0.05) == "inconclusive"
    assert verdict(scattered, quiet(16), 0.05) == "slower"  # +60%
    assert verdict(quiet(16), scattered, 0.05) == "faster"  # a factor of 1.6 either way
    # step noise: the CI half-width counts too
    assert noise_floor(quiet(10), Side(11, 9.9, 12.1, (11.0, 11.0)), 0.05) == pytest.approx(0.1)
    # one process: no process noise to measure; the floor is the threshold and the CIs
    assert process_noise((10.0,), 10.0) == 0
    one = Side(20.0, 19.9, 20.1, (20.0,))
    assert noise_floor(one, quiet(10), 0.05) == 0.05 and verdict(one, quiet(10), 0.05) == "faster"


def test_processes_apart_by_more_than_the_threshold_are_a_verdict() -> None:
    """The issue's GPT-2 pair (H200, bf16 eager, without and with gradient checkpointing):
    +17%, every new process slower than every old one by 15%, but the old side's processes
    spread 4%: a floor of 18% (Student's t over three medians). The processes' own gap
    decides: slower; reversed, faster. Apart by less than the threshold, or one process a
    side: the floor still decides."""
    old = Side(67.3, 64.3, 68.7, (64.4, 67.3, 68.5))
    new = Side(79.0, 78.0, 81.1, (78.6, 79.0, 79.2))
    assert noise_floor(old, new, 0.05) == pytest.approx(0.18, abs=0.01)
    assert process_gap(old, new) == pytest.approx(78.6 / 68.5 - 1)
    assert verdict(old, new, 0.05) == "slower" and verdict(new, old, 0.05) == "faster"
    # apart by 14.7%, not more than 15%, and the floor is 18%: no 15% change could show
    assert verdict(old, new, 0.15) == "inconclusive"
    assert process_gap(Side(67.3, 64.3, 68.7, (67.3,)), new) == 0  # one process: no gap
    # apart by 12% (every new process slower), but the old processes spread by 21% among
    # themselves: what moved them (the host) may have moved the gap too; not a verdict
    spread_old = Side(62.0, 57.0, 71.0, (58.0, 62.0, 70.0))
    assert process_gap(spread_old, new) == pytest.approx(78.6 / 70 - 1)
    assert process_spread(spread_old) == pytest.approx(70 / 58 - 1)
    assert verdict(spread_old, new, 0.05) == "inconclusive"


def test_inconclusive_says_how_many_processes_would_judge_it() -> None:
    """The GPT-2 pair's old side against itself: three processes spread 6% (64.4-68.5 ms,
    sd 2.107 ms, 3.13% of 67.3), a floor of 18%: no 5% change could show, so it is
    inconclusive, not within noise. The processes that would bring the floor to 5%: the
    first N with t(0.995, N-1) * 3.13% / sqrt(N) <= 5%: N = 6 gives 4.032 / 2.449 * 3.13% =
    5.15%, N = 7 gives 3.707 / 2.646 * 3.13% = 4.39%."""
    old = Side(67.3, 64.3, 68.7, (64.4, 67.3, 68.5))
    assert verdict(old, old, 0.05) == "inconclusive"
    assert processes_needed(old, old, 0.05) == 7
    assert processes_needed(old, quiet(67.3), 0.05) == 7  # the noisier side decides
    assert processes_needed(old, old, 0.20) == 3  # a 20% change it can show already
    assert verdict(old, old, 0.20) == "within noise"
    # a quiet pair is judgeable with its own three
    assert processes_needed(quiet(10), quiet(10), 0.05) == 3
    # one traced process whose steps scatter (CI half-width 8%): its CI narrows as
    # 1 / sqrt(N), 8% / sqrt(3) = 4.6%
    traced = Side(10.0, 9.2, 10.8, (10.0,))
    assert verdict(traced, traced, 0.05) == "inconclusive"
    assert processes_needed(traced, quiet(10), 0.05) == 3
    # processes twice apart: more than MAX_PROCESSES, no count
    wild = Side(10.0, 5.0, 20.0, (5.0, 10.0, 20.0))
    assert processes_needed(wild, quiet(10), 0.05) is None


def test_t_quantiles() -> None:
    """The table, and the expansion past it (exact values: 2.750 at 30, 2.744 at 31, 2.576
    in the limit)."""
    assert t_quantile_995(1) == 63.657 and t_quantile_995(2) == 9.925
    assert t_quantile_995(31) == pytest.approx(2.744, abs=1e-3)
    assert t_quantile_995(10_000) == pytest.approx(2.576, abs=1e-3)
    with pytest.raises(ValueError):
        t_quantile_995(0)


# --- unusable input, one-sided runs: exit codes and what is listed -------------------------------

ATTENTION_RUNS = ["attention_naive_b32_s100_e256", "attention_sdpa_b32_s100_e256"]
FA_RUNS = ["fa_flash_b4_h16_s4096_d128_causalTrue_forward",
           "fa_cudnn_b4_h16_s4096_d128_causalTrue_forward"]


@needs_standard
def test_disjoint_folders_exit_2(tmp_path: Path) -> None:
    """No run in common: exit 2 (not the 1 of a slowdown) and one line naming the problem,
    whatever --fail-on-slower says; nothing written."""
    old = subset(STANDARD_OLD, tmp_path / "old", ATTENTION_RUNS)
    new = subset(STANDARD_NEW, tmp_path / "new", FA_RUNS)
    done = cli(old, new, "-o", tmp_path / "out", "--fail-on-slower", 0)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: no run in common: old {old} has 2 runs, new {new} 2, none of the same name "
        "(--pair OLD_RUN=NEW_RUN compares renamed runs)"]
    assert not (tmp_path / "out").exists()
    # a --pair makes them comparable
    pair = f"{ATTENTION_RUNS[0]}={FA_RUNS[0]}"
    assert cli(old, new, "-o", tmp_path / "paired", "--pair", pair).returncode == 0


@needs_standard
def test_partial_overlap_lists_one_sided_runs(tmp_path: Path) -> None:
    """Runs of one side only are listed (printed and in summary.md); the common ones are
    compared; exit 0."""
    old = subset(STANDARD_OLD, tmp_path / "old", ATTENTION_RUNS + FA_RUNS[:1])
    new = subset(STANDARD_NEW, tmp_path / "new", ATTENTION_RUNS[1:] + FA_RUNS)
    out = tmp_path / "out"
    done = cli(old, new, "-o", out, "--fail-on-slower", 0)
    assert done.returncode == 0, done.stderr
    assert f"only in old (1): {ATTENTION_RUNS[0]}" in done.stdout.splitlines()
    assert f"only in new (1): {FA_RUNS[1]}" in done.stdout.splitlines()
    assert "2 runs matched" in done.stdout
    text = (out / "summary.md").read_text()
    assert f"**Only in old** (1): `{ATTENTION_RUNS[0]}`" in text
    assert f"**Only in new** (1): `{FA_RUNS[1]}`" in text
    runs = pd.read_csv(out / "runs.csv").set_index("run")
    assert runs.loc[ATTENTION_RUNS[0], "presence"] == "old_only"
    assert runs.loc[FA_RUNS[1], "presence"] == "new_only"
    assert set(runs.loc[runs["presence"] == "both", "verdict"]) <= {"within noise",
                                                                     "inconclusive"}


@needs_standard
def test_only_failed_runs_in_common(tmp_path: Path) -> None:
    """The one common run ran out of memory on both sides: no step time anywhere, still a
    report (no crash on the empty columns) and exit 0."""
    oom = "gpt_small_train_fp32_b256_ctx1024"
    old = subset(STANDARD_OLD, tmp_path / "old", [oom, ATTENTION_RUNS[0]])
    new = subset(STANDARD_NEW, tmp_path / "new", [oom])
    done = cli(old, new, "-o", tmp_path / "out", "--fail-on-slower", 0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"wrote {tmp_path / 'out'}: 1 run matched: 0 slower, 0 faster, 0 within noise, 0 "
        "inconclusive, 1 failed on both sides; 1 only in old, 0 only in new.",
        f"only in old (1): {ATTENTION_RUNS[0]}"]
    runs = pd.read_csv(tmp_path / "out" / "runs.csv").set_index("run")
    assert runs.loc[oom, "status"] == "old: oom; new: oom" and pd.isna(runs.loc[oom, "verdict"])
    assert "failed (old: oom; new: oom)" in (tmp_path / "out" / "summary.md").read_text()


@needs_standard
def test_unusable_folders_exit_2(tmp_path: Path) -> None:
    """A folder without summary.csv (a pipeline cut short), a missing folder, a folder with no
    run: exit 2 and one line each."""
    good = subset(STANDARD_OLD, tmp_path / "good", ATTENTION_RUNS)
    bare = subset(STANDARD_NEW, tmp_path / "bare", ATTENTION_RUNS, summary=False)
    nested = tmp_path / "nested"  # one sub-folder with its summary, one without
    subset(STANDARD_NEW, nested / "done", ATTENTION_RUNS)
    subset(STANDARD_NEW, nested / "cut", FA_RUNS, summary=False)
    (tmp_path / "empty").mkdir()
    expected = {
        bare: f"error: new folder {bare}: no summary.csv (not a finished results folder)",
        nested: f"error: new folder {nested}: no summary.csv over the runs in cut/ (not a "
                "finished results folder)",
        tmp_path / "missing": f"error: {tmp_path / 'missing'}: not a results folder (no such "
                              "folder)",
        tmp_path / "empty": f"error: {tmp_path / 'empty'}: no runs found (no <run>/times.json "
                            "or <run>/timing/)",
    }
    for new, message in expected.items():
        done = cli(good, new, "-o", tmp_path / "out", "--fail-on-slower", 0)
        assert (done.returncode, done.stderr.strip().splitlines()) == (2, [message])


def test_a_crash_is_not_a_slowdown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Any unexpected error exits 2 with an `error:` line last, never the gate's 1."""
    def broken(*args: object, **kwargs: object) -> int:
        raise TypeError("bad operand type for abs(): 'NoneType'")

    monkeypatch.setattr(diff, "write_diff", broken)
    code = diff.main([str(tmp_path), str(tmp_path), "-o", str(tmp_path / "out"),
                      "--fail-on-slower", "0"])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: analysis diff failed (TypeError: bad operand type for abs(): 'NoneType'); "
        "no verdict")


# --- the published standard runs: noise is within noise, a real change is not --------------------

# What the diff called `slower` before the noise floor (a CI test alone): +62% for a 0.7 ms
# attention step with three processes, and six more.
FORMERLY_SLOWER = [
    "cs336_attn_naive_d64_s1024_forward_backward", "cs336_attn_sdpa_d128_s1024_forward_backward",
    "gpt_train_small_5_compile", "gpt_train_small_1_tf32",
    "fa_cudnn_b16_h16_s1024_d128_causalTrue_forward_backward",
    "cs336_attn_sdpa_d128_s1024_forward", "attention_sdpa_b32_s100_e256",
]  # fmt: skip


# The A/A pair of the two standard runs whose processes are apart: GPT small's TF32 eager
# train rung is host-bound, its processes follow the host's speed (24% apart between the two
# runs, more than their CIs' half-widths), but the old side's own processes spread by 26%.
PROCESSES_APART = "gpt_train_small_1_tf32"


@needs_standard
def test_published_standard_runs_are_within_noise(tmp_path: Path) -> None:
    """Two runs of the standard config on the same GPU and software (90 A/A pairs): no
    false verdict in either direction (docs/diff.md); the runs a CI test alone calls slower
    and the host-bound run whose processes are apart are not changed."""
    for old, new, out in ((STANDARD_OLD, STANDARD_NEW, "forward"),
                          (STANDARD_NEW, STANDARD_OLD, "backward")):
        diff.write_diff(old, new, tmp_path / out)
        runs = pd.read_csv(tmp_path / out / "runs.csv").set_index("run")
        both = runs[runs["presence"] == "both"]
        assert len(both) == 91  # and the run that ran out of memory on both sides
        assert both["status"].ne("ok").sum() == 1
        changed = set(both.index[both["verdict"].isin(["slower", "faster"])])
        assert changed == set()
        # apart by more than the threshold, less than a side's own spread: the host moved
        host = both.loc[PROCESSES_APART]
        assert abs(host["process_gap_pct"]) > diff.DEFAULT_THRESHOLD_PCT
        assert host["verdict"] == "inconclusive"
        assert both.loc[FORMERLY_SLOWER, "verdict"].isin(["within noise",
                                                          "inconclusive"]).all()
        # not changed: within noise where a 5% change would have shown (the floor is the
        # threshold), inconclusive elsewhere, with the processes that would judge it
        ok = both[both["status"] == "ok"]
        judged = ok[ok["verdict"] == "within noise"]
        unjudged = ok[ok["verdict"] == "inconclusive"]
        assert len(judged) + len(unjudged) == 90 and len(judged) >= 30
        assert (judged["noise_floor_pct"] == diff.DEFAULT_THRESHOLD_PCT).all()
        assert (unjudged["noise_floor_pct"] > diff.DEFAULT_THRESHOLD_PCT).all()
        # more than three, or more than MAX_PROCESSES (empty: the steps scatter too much)
        assert (unjudged["processes_needed"].fillna(MAX_PROCESSES + 1) > 3).all()
        # CIs apart is not enough: each such run changed less than its noise floor (the
        # spread of a side's own processes), e.g. GPT small's TF32 rung by about 30%
        apart = both[both["cis_separate"].astype(bool) & both["change_pct"].notna()]
        assert len(apart) >= 5
        assert (apart["change_pct"].abs() < apart["noise_floor_pct"]).all()
        assert (apart["change_pct"].abs() > diff.DEFAULT_THRESHOLD_PCT).any()
    # quiet runs keep a floor at the threshold: the rule is not blind everywhere
    assert (both["noise_floor_pct"] == diff.DEFAULT_THRESHOLD_PCT).sum() >= 20


@needs_standard
def test_published_real_change_is_caught() -> None:
    """The same published folders, a real change: naive attention at head dimension 64 vs
    128 (sequence 16384, forward), 41 vs 50 ms, process noise 2% and 0.5%: slower by 23%."""
    d64, d128 = "cs336_attn_naive_d64_s16384_forward", "cs336_attn_naive_d128_s16384_forward"
    result = diff.compare(STANDARD_OLD, STANDARD_NEW, pairs={d64: d128})
    row = result.runs.set_index("run").loc[f"{d64}={d128}"]
    assert row["verdict"] == "slower" and bool(row["cis_separate"])
    assert row["change_pct"] == pytest.approx(22.6, abs=0.5)
    assert row["noise_floor_pct"] == diff.DEFAULT_THRESHOLD_PCT
    assert row["params_changed"] == "head_dim: 64->128"


# --- real CPU runs, the same config twice and with known delays ---------------------------------
# A subset of benchmarks/diff_cpu_runs.py's folders (tests/fixtures/diff-cpu): three untraced
# timing processes per run, on a 2-core machine shared with other work. The sleep runs (10 and
# 40 ms steps) are quiet and their delays exact; the MLP runs train a small model on the CPU,
# and the others' load moved their processes' step times by up to twice.
CPU_RUNS = REPO / "tests" / "fixtures" / "diff-cpu"
SLEEP_RUNS = ["sleep_10", "sleep_40"]
MLP_RUNS = ["mlp_128", "mlp_768"]


def cpu_diff(old: str, new: str, out: Path) -> pd.DataFrame:
    diff.write_diff(CPU_RUNS / old, CPU_RUNS / new, out)
    return pd.read_csv(out / "runs.csv").set_index("run")


def test_cpu_runs_a_a_pairs_are_not_changed(tmp_path: Path) -> None:
    """The same config run twice, both ways: no run slower or faster. The quiet sleep runs are
    within noise (their floor is the 5% threshold); the MLP runs, whose processes the
    machine's other work spread, are not judged: inconclusive, floor above 5%."""
    for old, new in (("aa1", "aa2"), ("aa2", "aa1")):
        runs = cpu_diff(old, new, tmp_path / f"{old}-{new}")
        assert (runs.loc[SLEEP_RUNS, "verdict"] == "within noise").all()
        assert (runs.loc[SLEEP_RUNS, "noise_floor_pct"] == diff.DEFAULT_THRESHOLD_PCT).all()
        mlp = runs.loc[MLP_RUNS]
        assert (mlp["verdict"] == "inconclusive").all()
        assert (mlp["noise_floor_pct"] > diff.DEFAULT_THRESHOLD_PCT).all()
        assert (mlp["processes_needed"].fillna(MAX_PROCESSES + 1) > 3).all()


def test_cpu_runs_known_delays_are_slower(tmp_path: Path) -> None:
    """Each A/A folder against the runs whose steps take 10% and 20% longer: every sleep run
    slower by that much; no MLP run is called faster. Through the command line CI calls:
    exit 1 with --fail-on-slower 5, the sleep runs among those named."""
    for delayed, pct in (("d10", 10), ("d20", 20)):
        for base in ("aa1", "aa2"):
            runs = cpu_diff(base, delayed, tmp_path / f"{base}-{delayed}")
            sleep = runs.loc[SLEEP_RUNS]
            assert (sleep["verdict"] == "slower").all()
            assert sleep["change_pct"].between(pct - 1, pct + 1).all()
            assert not (runs.loc[MLP_RUNS, "verdict"] == "faster").any()
    done = cli(CPU_RUNS / "aa1", CPU_RUNS / "d10", "-o", tmp_path / "cli",
               "--fail-on-slower", 5)
    assert done.returncode == 1, done.stderr
    named = done.stderr.strip().splitlines()[-1].removeprefix("slower by more than 5%: ")
    assert set(SLEEP_RUNS) <= set(named.split(", ")), done.stderr


def cpu_runs_config(folder: Path, out: Path) -> Path:
    """The config the CPU runs were made with (their plan.json's runs, as a user's config
    names them), for the fixture's runs."""
    plan = json.loads((folder / "plan.json").read_text())
    runs = {name: {**plan["runs"][name]["params"], "profile": False}
            for name in [*SLEEP_RUNS, *MLP_RUNS]}
    config = {"results": "results", "calibrate": False, "container": {"variant": "cpu"},
              "timing": {"repeats": 3}, "runs": runs}
    out.write_text(yaml.safe_dump(config))
    return out


def test_rerun_advice_caps_names_pairs_and_skips_what_has_enough() -> None:
    """The advice from runs.csv's columns: the largest need, capped; a --pair row selects
    both its names; a run whose sides already have the capped count is left out; nothing to
    rerun, no advice."""
    runs = pd.DataFrame({
        "run": ["a", "old_b=new_b", "c", "d", "e"],
        "presence": ["both"] * 4 + ["old_only"],
        "verdict": ["inconclusive", "inconclusive", "inconclusive", "within noise", None],
        "processes_needed": [7, None, 30, None, None],
        "old_processes": [3, 3, 12, 3, None], "new_processes": [3, 3, 12, 3, None]})
    advice = diff_rerun.advice(runs, max_repeats=12)
    assert advice.repeats == 12 and advice.select == ["a", "old_b", "new_b"]
    assert advice.needs == {"a": 7, "old_b=new_b": None} and advice.capped == ["old_b=new_b"]
    assert advice.left_out == ["c"]
    assert diff_rerun.advice(runs.iloc[:1], max_repeats=12).repeats == 7
    assert diff_rerun.advice(runs.iloc[2:], max_repeats=12) is None


def test_inconclusive_runs_get_a_rerun_fragment_the_pipeline_takes(tmp_path: Path) -> None:
    """A/A CPU folders: the MLP runs are inconclusive, and the diff writes rerun.yaml, the
    config fragment that reruns exactly them with the processes that would judge them (their
    largest `processes_needed`, capped by --max-repeats) and says so on the console and in
    summary.md. The pipeline takes it as a second --configfile: a dry run of the runs' own
    config and the fragment, as the advice says (--forcerun time_run: this copy has no
    Snakemake records), plans the timing jobs of those runs only. A diff with nothing
    inconclusive (a 1000% threshold) leaves no rerun.yaml behind."""
    out = tmp_path / "diff"
    done = cli(CPU_RUNS / "aa1", CPU_RUNS / "aa2", "-o", out, "--max-repeats", 12)
    assert done.returncode == 0, done.stderr
    runs = pd.read_csv(out / "runs.csv").set_index("run")
    unjudged = runs[runs["verdict"] == "inconclusive"]
    keys = yaml.safe_load((out / "rerun.yaml").read_text())
    assert sorted(keys["select"]) == sorted(unjudged.index) == sorted(MLP_RUNS)
    needs = unjudged["processes_needed"].fillna(MAX_PROCESSES + 1)
    assert keys["timing"] == {"repeats": int(min(12, needs.max()))}
    assert f"with {keys['timing']['repeats']} timing processes a side" in done.stdout
    assert f"--configfile CONFIG {out / 'rerun.yaml'} --forcerun time_run" in done.stdout
    assert "`rerun.yaml` (beside this file) reruns 2 of them" in (out / "summary.md").read_text()
    work = tmp_path / "work"
    shutil.copytree(CPU_RUNS / "aa1", work / "results")
    config = cpu_runs_config(CPU_RUNS / "aa1", tmp_path / "config.yaml")
    planned = snakemake(work, "-n", "--cores", "2", "--configfile", str(config),
                        str(out / "rerun.yaml"), "--forcerun", "time_run", "--",
                        "results/summary.csv")
    jobs = re.findall(r"rule time_run:.*?wildcards: run=(\w+)", planned.stdout, re.S)
    assert sorted(jobs) == sorted(MLP_RUNS), planned.stdout
    diff.write_diff(CPU_RUNS / "aa1", CPU_RUNS / "aa2", out, threshold_pct=1000)
    assert not (out / "rerun.yaml").exists()


# The on-demand loop on real records (tests/fixtures/diff-cpu-rerun, benchmarks/diff_cpu_runs.py
# --rerun-fixture): mlp_128 of two A/A folders and of the 20% delay, with three processes, and
# the records of its rerun with ten (processes run one after another, so following an advice of
# N processes is the rerun's first N records).
CPU_RERUN = REPO / "tests" / "fixtures" / "diff-cpu-rerun"


def followed(folder: str, advice: Path, dest: Path) -> Path:
    """The folder as a user holds it after running ``advice`` (a rerun.yaml) on it."""
    keys = yaml.safe_load(advice.read_text())
    shutil.copytree(CPU_RERUN / folder, dest)
    for run in keys["select"]:
        timing = dest / run / "timing"
        shutil.rmtree(timing)
        timing.mkdir()
        for i in range(keys["timing"]["repeats"]):
            shutil.copy(CPU_RERUN / "rerun" / folder / run / "timing" / f"r{i}.json", timing)
    return dest


def test_following_the_rerun_advice_judges_the_runs(tmp_path: Path) -> None:
    """Inconclusive with three processes, the pairs are judged once the advice is followed
    (at most 10 processes): the A/A pair asks for 5, still spreads too much with them and asks
    for more, and reads within noise with 10; the 20% delay reads slower by 35% with 10."""
    rounds: dict[tuple[str, str], list[str]] = {}
    for old, new in (("aa1", "aa3"), ("aa3", "d20")):
        sides = (CPU_RERUN / old, CPU_RERUN / new)
        readings = rounds.setdefault((old, new), [])
        for i in range(3):
            out = tmp_path / f"{old}-{new}-{i}"
            diff.write_diff(*sides, out, max_repeats=10)
            row = pd.read_csv(out / "runs.csv").set_index("run").loc["mlp_128"]
            readings.append(f"{row['verdict']} @{row['old_processes']}+{row['new_processes']}")
            if not (out / "rerun.yaml").exists():
                break
            sides = (followed(old, out / "rerun.yaml", out / "old"),
                     followed(new, out / "rerun.yaml", out / "new"))
    assert rounds[("aa1", "aa3")] == ["inconclusive @3+3", "inconclusive @5+5",
                                      "within noise @10+10"]
    assert rounds[("aa3", "d20")] == ["inconclusive @3+3", "slower @10+10"]
    assert row["change_pct"] == pytest.approx(34.7, abs=0.1)


# --- acceptance: two real pipeline runs with one change ----------------------------------------
# The sleep workload makes the change certain: every step of `step` sleeps 80 ms on the old
# side and 10 ms on the new one (the new side's steps would have to wake up 70 ms late to
# reverse it); `steady` sleeps 50 ms on both, and at a 100% threshold (a factor of 2) it could
# only be called faster or slower if most steps of one side woke up 50 ms late. Three
# processes per run (the noise floor's Student t is 9.9 with three, 63.7 with two): the factor
# of 8 clears the floor unless the per-process medians of a side scatter (sd) by more than 1.2
# times their own step time.
PIPELINE_RUNS = ["step", "steady"]
PIPELINE_REPEATS = 3


def pipeline_config(step_ms: float) -> dict:
    return {
        "results": "results",
        "timing": {"repeats": PIPELINE_REPEATS},
        "calibrate": False,
        "nsys": LEAN_NSYS,
        # six timing processes of a sleep: starting them costs less than starting the three
        # fork servers, which preload torch and Inductor (tests/test_warm.py tests those)
        "launcher": "process",
        "defaults": {"device": "auto", "warmup": 1, "steps": 5, "seed": 0},
        "runs": {
            "step": {"workload": "sleep", "step_ms": step_ms},
            "steady": {"workload": "sleep", "step_ms": 50, "profile": False},
        },
        "container": {"variant": "cpu"},
    }


def pipeline_targets() -> list[str]:
    """What the diff reads: the timing records, the capture's stats (its times.json too) and
    the summary that marks a finished results folder."""
    targets = ["results/plan.json", "results/step/stats/metrics.json", "results/summary.csv"]
    return targets + [f"results/{run}/timing/r{i}.json" for run in PIPELINE_RUNS
                      for i in range(PIPELINE_REPEATS)]


@pytest.mark.slow
def test_pipeline_runs_differ_in_one_run(tmp_path: Path, nsys: str) -> None:
    """OLD sleeps 80 ms per step, NEW 10 ms: `step` is faster (CI above 1), `steady` is
    `within noise`, and the NVTX range that explains the change is the one around the sleep;
    reversed, `step` is slower and --fail-on-slower exits 1."""
    def run_side(side: str, step_ms: float) -> Path:
        config = tmp_path / f"{side}.yaml"
        config.write_text(yaml.safe_dump(pipeline_config(step_ms)))
        snakemake(tmp_path / side, *pipeline_targets(), "--cores", "2",
                  "--configfile", str(config))
        return tmp_path / side / "results"

    # the two sides side by side: separate working folders (each its own device lock), and
    # steps that sleep, so neither measures the other's load
    with ThreadPoolExecutor(2) as pool:
        made = {side: pool.submit(run_side, side, ms) for side, ms in (("old", 80), ("new", 10))}
        results = {side: future.result() for side, future in made.items()}
    out = tmp_path / "diff"
    assert diff.write_diff(results["old"], results["new"], out, fail_on_slower=10,
                           threshold_pct=100) == 0
    runs = pd.read_csv(out / "runs.csv").set_index("run")
    assert runs.loc["step", "verdict"] == "faster" and runs.loc["step", "speedup_ci_low"] > 1
    assert runs.loc["step", "params_changed"] == "step_ms: 80.0->10.0"
    assert runs.loc["step", "old_processes"] == PIPELINE_REPEATS
    assert runs.loc["steady", "verdict"] == "within noise"
    assert pd.isna(runs.loc["steady", "params_changed"])
    ranges = pd.read_csv(out / "ranges.csv")
    assert set(ranges["run"]) == {"step"}  # the unchanged run is not explained
    ranges = ranges.rename(columns={"range": "key"})
    assert diff.top_range(ranges) == "sleep"
    assert ranges.set_index("key").loc["sleep", "delta_ms_per_step"] < 0
    assert diff.write_diff(results["new"], results["old"], out / "reverse",
                           fail_on_slower=10, threshold_pct=100) == 1
    reverse = pd.read_csv(out / "reverse" / "runs.csv").set_index("run")
    assert reverse.loc["step", "verdict"] == "slower"
    assert reverse.loc["step", "change_pct"] > reverse.loc["step", "noise_floor_pct"]
    assert reverse.loc["steady", "verdict"] == "within noise"
    # and through the command line CI calls, with its exit status
    done = cli(results["new"], results["old"], "-o", out / "cli", "--threshold", 100,
               "--fail-on-slower", 10)
    assert done.returncode == 1, done.stderr
    assert "slower by more than 10%: step" in done.stderr


def test_pair_compares_renamed_runs() -> None:
    """--pair OLD=NEW: two differently named runs of the published H100 folder (fp32 vs bf16
    train step of GPT small) compared as one row, their parameter change named."""
    side = PUBLISHED / "train-fp32-vs-bf16"
    pairs = {"gpt_small_train_fp32_ctx512": "gpt_small_train_bf16_ctx512"}
    result = diff.compare(side, side, pairs=pairs)
    label = "gpt_small_train_fp32_ctx512=gpt_small_train_bf16_ctx512"
    row = result.runs.set_index("run").loc[label]
    assert row["presence"] == "both"
    assert "dtype" in row["params_changed"]
    times = {name: json.loads((side / "runs" / name / "times.json").read_text())["median_ms"]
             for name in ("gpt_small_train_fp32_ctx512", "gpt_small_train_bf16_ctx512")}
    assert row["speedup"] == pytest.approx(
        times["gpt_small_train_fp32_ctx512"] / times["gpt_small_train_bf16_ctx512"], rel=0.05)
    with pytest.raises(ValueError, match="no run 'nope' in the old folder"):
        diff.compare(side, side, pairs={"nope": "gpt_small_train_bf16_ctx512"})


# --- the figure: report width, full labels, plain ratios ------------------------------------------


def text_extents(fig: Figure) -> list[tuple[str, Bbox]]:
    """Every visible, non-empty text of the drawn figure with its extent in pixels."""
    renderer = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip()]


def test_ratios_figure_fills_the_width_with_full_labels(tmp_path: Path) -> None:
    """The two published standard runs and one real change (--pair): a figure at report
    width whose axes take most of it, no text outside the canvas, the x label whole, ratio
    ticks as plain numbers, the verdict colours from the style's palette."""
    d64, d128 = "cs336_attn_naive_d64_s16384_forward", "cs336_attn_naive_d128_s16384_forward"
    runs = diff.compare(STANDARD_OLD, STANDARD_NEW, pairs={d64: d128}).runs
    fig = ratios_figure(runs)
    fig.set_dpi(style.DPI)  # as saved
    fig.canvas.draw()
    width, height = fig.bbox.width, fig.bbox.height
    assert width == style.WIDTH_IN * style.DPI
    canvas = Bbox.from_bounds(0, 0, width, height)
    texts = text_extents(fig)
    outside = [t for t, box in texts if not (canvas.x0 <= box.x0 and box.x1 <= canvas.x1
                                             and canvas.y0 <= box.y0 and box.y1 <= canvas.y1)]
    assert outside == []
    ax = fig.axes[0]
    assert ax.get_xlabel() == X_LABEL and X_LABEL in [t for t, _ in texts]
    # every run named in full, one row each
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert sorted(names) == sorted(runs.loc[runs["speedup"].notna(), "run"])
    # the axes and the run names beside them span the width
    left = min(box.x0 for t, box in texts if t in names)
    assert ax.get_position().width >= 0.5
    assert (ax.get_window_extent().x1 - left) / width >= 0.9
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(ticks) >= 3 and all(re.fullmatch(r"\d+(\.\d+)?", t) for t in ticks), ticks
    assert "1" in ticks
    colors = {to_hex(line.get_color()) for line in ax.get_lines() if line.get_marker() == "o"}
    assert colors <= {c.lower() for c in style.PALETTE}
    # the real change is labelled with its number
    slower = runs.set_index("run").loc[f"{d64}={d128}"]
    assert slower["verdict"] == "slower"
    assert f"{slower['change_pct']:+.0f}%" in [t for t, _ in texts]
    # the saved PNG: report width, drawn across it
    path = plot_ratios(runs, tmp_path / "ratios.png")
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("L"))
    assert pixels.shape[1] == width
    drawn = np.flatnonzero((pixels < 250).any(axis=0))
    assert (drawn[-1] - drawn[0]) / pixels.shape[1] >= 0.9


def test_ratio_ticks_are_round_numbers() -> None:
    assert ratio_ticks(0.37, 2.1) == [0.5, 0.7, 1, 1.5, 2]
    assert ratio_ticks(0.05, 30) == [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20]
    assert [plain_ratio(t) for t in ratio_ticks(0.37, 2.1)] == ["0.5", "0.7", "1", "1.5", "2"]


def test_ratios_figure_without_a_matched_run_is_a_placeholder(tmp_path: Path) -> None:
    runs = pd.DataFrame({"run": ["a"], "speedup": [None], "verdict": [None]})
    path = plot_ratios(runs, tmp_path / "ratios.png")
    assert not style.has_data(path)


H100_STANDARD = REPO / "published" / "h100" / "standard"
H200_STANDARD = REPO / "published" / "h200" / "standard"


def test_the_hardware_diff_is_the_one_published_and_stated(tmp_path: Path) -> None:
    """`analysis diff` of the H100 and H200 standard folders, run again: the verdicts equal
    the published `vs-h100/runs.csv`, the README states their counts, and no run reads as a
    changed config where an option added since the H100 run is at its default (the records
    at 44a4c13 have no `checkpoint` or `float8`)."""
    diff.write_diff(H100_STANDARD, H200_STANDARD, tmp_path / "vs")
    runs = pd.read_csv(tmp_path / "vs" / "runs.csv").set_index("run")
    published = pd.read_csv(H200_STANDARD / "vs-h100" / "runs.csv").set_index("run")
    assert runs["verdict"].equals(published["verdict"].loc[runs.index])
    assert runs["params_changed"].isna().all(), runs["params_changed"].dropna().head()
    counts = runs["verdict"].value_counts()
    stated = (f"{len(runs)} runs matched: {counts['faster']}\nfaster on the H200, "
              f"{counts['within noise']} within noise, {counts['inconclusive']} inconclusive, "
              f"{counts['slower']} slower")
    readme = (H200_STANDARD / "README.md").read_text()
    assert re.sub(r"\s+", " ", stated) in re.sub(r"\s+", " ", readme)
    # the bandwidth-bound 2.7B rung the README names, and a real config change still shows
    assert runs.loc["gpt_train_2.7B_2_bf16", "verdict"] == "faster"
    assert params_changed({"dtype": "fp32"}, {"dtype": "bf16", "float8": "none"}) == (
        "dtype: fp32->bf16")
    assert params_changed({}, {"float8": "tensorwise"}) == "float8: None->tensorwise"
