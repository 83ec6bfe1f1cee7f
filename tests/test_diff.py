"""`python -m analysis diff OLD NEW`: run matching, verdicts, explanations, layouts, exit code.

Results folders are built from real pieces: timing records with known step-time
distributions (tests/timing_records.py: the workloads' own record code, step times drawn
with a fixed seed, so every verdict below follows from the distributions, never from this
CPU's noise), stats from real H100 exports (tests/fixtures/h100) analysed by `python -m
analysis all`. The acceptance test (marked slow) diffs two real pipeline runs of the sleep
workload, whose step times differ eightfold by construction.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, snakemake
from timing_records import normal_processes, write_timing

from analysis.outputs import diff

H100 = REPO / "tests" / "fixtures" / "h100"
PUBLISHED = REPO / "published" / "h100-2026-11-22"
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


def build_side(root: Path, impl: str, seed: int, attention_stats: Path, gpt_stats: Path) -> None:
    """Two untraced processes per run, the traced times.json (the first process's record, as
    a capture of the same steps would be) and the real stats of both runs."""
    write_timing(root / "attn", f"{ATTENTION} --impl {impl}",
                 normal_processes(seed, *ATTENTION_MS[impl], PROCESSES, 8))
    write_timing(root / "gpt", GPT, normal_processes(seed + 1, *GPT_MS, PROCESSES, 8))
    for run, stats in (("attn", attention_stats), ("gpt", gpt_stats)):
        shutil.copy(root / run / "timing" / "r0.json", root / run / "times.json")
        shutil.copytree(stats, root / run / "stats")


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


def test_changed_run_faster_unchanged_same(sides: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = sides
    assert diff.write_diff(old, new, tmp_path, threshold_pct=20) == 0
    runs = pd.read_csv(tmp_path / "runs.csv").set_index("run")
    assert runs.loc["attn", "verdict"] == "faster"
    assert runs.loc["attn", "speedup_ci_low"] > 1
    assert runs.loc["attn", "speedup"] == pytest.approx(4.0, rel=0.05)  # 40 ms / 10 ms
    assert runs.loc["attn", "params_changed"] == "impl: naive->sdpa"
    assert runs.loc["attn", "old_timing_source"] == "untraced"
    assert runs.loc["attn", "old_processes"] == 2
    assert runs.loc["gpt", "verdict"] == "same"
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
    # the naive-only ranges vanish on the new side
    assert ranges.loc["computing softmax", "new_ms_per_step"] == 0
    assert ranges.loc["computing softmax", "old_ms_per_step"] > 0
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
    for run in ("attn", "gone"):
        (published / run).mkdir(parents=True)
        shutil.copy(old / "attn" / "times.json", published / run / "times.json")
        for csv in (old / "attn" / "stats").glob("*.csv"):
            shutil.copy(csv, published / run / csv.name)
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
    """The committed H100 results against themselves: every run found once, all `same`;
    the train fp32 runs present in both sub-folders pool their two traced processes."""
    assert diff.write_diff(PUBLISHED, PUBLISHED, tmp_path, fail_on_slower=0) == 0
    runs = pd.read_csv(tmp_path / "runs.csv").set_index("run")
    assert len(runs) == 24 and (runs["verdict"] == "same").all()
    assert runs.loc["gpt_small_train_fp32_ctx512", "old_folders"] == 2
    assert runs.loc["gpt_small_train_fp32_ctx512", "old_processes"] == 2
    assert (runs["old_timing_source"] == "traced").all()


# --- acceptance: two real pipeline runs with one change ----------------------------------------
# The sleep workload makes the change certain: every step of `step` sleeps 80 ms on the old
# side and 10 ms on the new one (the new side's steps would have to wake up 70 ms late to
# reverse it); `steady` sleeps 50 ms on both, and at a 100% threshold (a factor of 2) it could
# only be called faster or slower if most steps of one side woke up 50 ms late.
PIPELINE_RUNS = ["step", "steady"]
PIPELINE_REPEATS = 2


def pipeline_config(step_ms: float) -> dict:
    return {
        "results": "results",
        "timing": {"repeats": PIPELINE_REPEATS},
        "calibrate": False,
        "defaults": {"device": "auto", "warmup": 1, "steps": 5, "seed": 0},
        "runs": {
            "step": {"workload": "sleep", "step_ms": step_ms},
            "steady": {"workload": "sleep", "step_ms": 50, "profile": False},
        },
        "container": {"variant": "cpu"},
    }


def pipeline_targets() -> list[str]:
    """What the diff reads: the timing records, the capture's stats (its times.json too)."""
    targets = ["results/plan.json", "results/step/stats/metrics.json"]
    return targets + [f"results/{run}/timing/r{i}.json" for run in PIPELINE_RUNS
                      for i in range(PIPELINE_REPEATS)]


@pytest.mark.slow
def test_pipeline_runs_differ_in_one_run(tmp_path: Path, nsys: str) -> None:
    """OLD sleeps 80 ms per step, NEW 10 ms: `step` is faster (CI above 1), `steady` is
    `same`, and the NVTX range that explains the change is the one around the sleep."""
    results = {}
    for side, step_ms in (("old", 80), ("new", 10)):
        config = tmp_path / f"{side}.yaml"
        config.write_text(yaml.safe_dump(pipeline_config(step_ms)))
        snakemake(tmp_path / side, *pipeline_targets(), "--cores", "2",
                  "--configfile", str(config))
        results[side] = tmp_path / side / "results"
    out = tmp_path / "diff"
    assert diff.write_diff(results["old"], results["new"], out, fail_on_slower=10,
                           threshold_pct=100) == 0
    runs = pd.read_csv(out / "runs.csv").set_index("run")
    assert runs.loc["step", "verdict"] == "faster" and runs.loc["step", "speedup_ci_low"] > 1
    assert runs.loc["step", "params_changed"] == "step_ms: 80.0->10.0"
    assert runs.loc["step", "old_processes"] == PIPELINE_REPEATS
    assert runs.loc["steady", "verdict"] == "same" and pd.isna(runs.loc["steady", "params_changed"])
    ranges = pd.read_csv(out / "ranges.csv")
    assert set(ranges["run"]) == {"step"}  # the unchanged run is not explained
    ranges = ranges.rename(columns={"range": "key"})
    assert diff.top_range(ranges) == "sleep"
    assert ranges.set_index("key").loc["sleep", "delta_ms_per_step"] < 0
    assert diff.write_diff(results["new"], results["old"], out / "reverse",
                           fail_on_slower=10, threshold_pct=100) == 1


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
