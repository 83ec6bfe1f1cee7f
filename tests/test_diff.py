"""`python -m analysis diff OLD NEW`: run matching, verdicts, explanations, layouts, exit code.

Results folders are built from real pieces: step times from real `python -m workloads`
processes on this CPU, stats from real H100 exports (tests/fixtures/h100) analysed by
`python -m analysis all`. The acceptance test (marked slow) diffs two real pipeline runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, snakemake

from analysis.outputs import diff

H100 = REPO / "tests" / "fixtures" / "h100"
PUBLISHED = REPO / "published" / "h100-2026-11-22"
# attention workload: naive is several times slower than SDPA at seq 512 on a CPU
ATTENTION = ["attention", "--batch", "2", "--seq", "512", "--embed", "64", "--heads", "2",
             "--mode", "forward"]
GPT = ["gpt", "--size", "tiny", "--mode", "forward", "--context", "32", "--batch", "2"]
STEPS = ["--warmup", "2", "--steps", "8", "--device", "cpu"]


def workload(args: list[str], out: Path) -> subprocess.Popen:
    out.parent.mkdir(parents=True, exist_ok=True)
    # one thread each: a fixed amount of CPU per step, whatever the machine
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "workloads", *args, *STEPS, "--out", str(out)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def analyse(export: Path, stats: Path) -> None:
    """The run's stats/ as the pipeline writes them: `analysis all` plus the phase table."""
    subprocess.run([sys.executable, "-m", "analysis", "all", str(export), "-o", str(stats)],
                   cwd=REPO, check=True, capture_output=True)
    if not (stats / "phase_gpu_time.csv").exists():
        from analysis.export import Export

        from analysis.metrics.phases import phase_table

        with Export(export) as ex:
            pd.DataFrame(phase_table(ex)).to_csv(stats / "phase_gpu_time.csv", index=False)


def time_sides(sides: dict[Path, str]) -> None:
    """Two untraced timing processes per run and side ({side root: attention impl}). One at
    a time (timings that share the CPU are noise), the sides taking turns, so a drift of the
    machine's speed (a shared CI host) reaches both sides alike instead of reading as a change."""
    for run in ("attn", "gpt"):
        for i in range(2):
            for root, impl in sides.items():
                args = [*ATTENTION, "--impl", impl] if run == "attn" else GPT
                p = workload(args, root / run / "timing" / f"r{i}.json")
                assert p.wait() == 0, p.stderr.read().decode()[-2000:]


def finish_side(root: Path, attention_export: str) -> None:
    """The traced times.json and real stats of both runs."""
    for run in ("attn", "gpt"):
        shutil.copy(root / run / "timing" / "r0.json", root / run / "times.json")
    analyse(H100 / f"{attention_export}.sqlite", root / "attn" / "stats")
    analyse(H100 / "gpt_small_train_fp32_ctx512.sqlite", root / "gpt" / "stats")


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """OLD: attention naive; NEW: attention SDPA; the GPT run unchanged."""
    base = tmp_path_factory.mktemp("diff")
    old, new = base / "old", base / "new"
    time_sides({old: "naive", new: "sdpa"})
    finish_side(old, "attention_naive_b32_s100_e256")
    finish_side(new, "attention_sdpa_b32_s1000_e256")
    return old, new


def test_changed_run_faster_unchanged_same(sides: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = sides
    assert diff.write_diff(old, new, tmp_path, threshold_pct=20) == 0
    runs = pd.read_csv(tmp_path / "runs.csv").set_index("run")
    assert runs.loc["attn", "verdict"] == "faster"
    assert runs.loc["attn", "speedup_ci_low"] > 1
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
    # one traced CPU process against untraced ones: the direction holds (naive is slower),
    # significance depends on the CPU's noise
    assert runs.loc["attn", "speedup"] > 1 and runs.loc["attn", "verdict"] != "slower"
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


def smoke_config(impl: str) -> dict:
    return {
        "results": "results",
        "timing": {"repeats": 3},
        "calibrate": False,
        "defaults": {"device": "auto", "dtype": "fp32", "warmup": 2, "steps": 10, "seed": 0},
        "runs": {
            "attn": {"workload": "attention", "impl": impl, "batch": 2, "seq": 256,
                     "embed": 64, "heads": 2, "mode": "forward"},
            "gpt": {"workload": "gpt", "size": "tiny", "mode": "forward", "context": 32,
                    "batch": 2},
        },
        "container": {"variant": "cpu"},
    }


@pytest.mark.slow
def test_pipeline_runs_differ_in_one_run(tmp_path: Path, nsys: str) -> None:
    """OLD runs attention naive, NEW SDPA: attn is faster (CI above 1), gpt is `same`, and the
    NVTX range that explains the change is the attention core."""
    results = {}
    for side, impl in (("old", "naive"), ("new", "sdpa")):
        config = tmp_path / f"{side}.yaml"
        config.write_text(yaml.safe_dump(smoke_config(impl)))
        snakemake(tmp_path / side, "--cores", "2", "--configfile", str(config))
        results[side] = tmp_path / side / "results"
    out = tmp_path / "diff"
    assert diff.write_diff(results["old"], results["new"], out, fail_on_slower=10,
                           threshold_pct=20) == 0
    runs = pd.read_csv(out / "runs.csv").set_index("run")
    assert runs.loc["attn", "verdict"] == "faster" and runs.loc["attn", "speedup_ci_low"] > 1
    assert runs.loc["attn", "old_processes"] == 3
    assert runs.loc["gpt", "verdict"] == "same"
    ranges = pd.read_csv(out / "ranges.csv")
    ranges = ranges[ranges["run"] == "attn"]
    # the attention core is what changed: naive's ranges (scores, softmax, final matmul) are
    # gone and SDPA's is new; the top explaining range is one of them, not a layer or step range
    core = {"scaled_dot_product_attention", "computing attention scores", "computing softmax",
            "final matmul"}
    assert diff.top_range(ranges.rename(columns={"range": "key"})) in core
    assert "scaled_dot_product_attention" in set(ranges["range"])
    assert diff.write_diff(results["new"], results["old"], out / "reverse",
                           fail_on_slower=10, threshold_pct=20) == 1


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
