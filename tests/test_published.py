"""published/ in its shape: one folder per system (system.json, history.csv, README), one
folder per config, each one run at one commit with a README whose command reproduces it; at
most 36 MB; and the README's headline numbers read from one folder."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO

PUBLISHED = REPO / "published"
SYSTEMS = sorted(p for p in PUBLISHED.iterdir() if p.is_dir())
CONFIGS = sorted(p.parent for p in PUBLISHED.glob("*/*/summary.csv"))
# the systems' folders, every capture left out (Perfetto traces of the ladders' ends only):
# about 32.3 MB today (h200/standard 7.6 MB, h200/models 5.6 MB, h200/fp8 4.3 MB, ...)
MAX_BYTES = 36_000_000
HEADLINE = PUBLISHED / "h100" / "standard"


def test_published_is_small_and_one_folder_per_system() -> None:
    size = sum(p.stat().st_size for p in PUBLISHED.rglob("*") if p.is_file())
    assert size <= MAX_BYTES, f"published/ holds {size / 1e6:.1f} MB"
    assert [s.name for s in SYSTEMS] == ["h100", "h200", "h200x4"]
    assert len(CONFIGS) >= 3
    # nothing beside the system folders but the index
    assert {p.name for p in PUBLISHED.iterdir() if p.is_file()} == {"README.md"}


@pytest.mark.parametrize("system", SYSTEMS, ids=lambda p: p.name)
def test_a_system_has_its_description_and_history(system: Path) -> None:
    described = json.loads((system / "system.json").read_text())
    history = pd.read_csv(system / "history.csv")
    assert (system / "README.md").is_file()
    for folder in (c for c in CONFIGS if c.parent == system):
        summary = pd.read_csv(folder / "summary.csv")
        # system.json says what the rows' provenance says
        assert set(summary["gpu_name"].dropna()) == {described["gpu"]}
        assert set(summary["provenance_driver"].dropna()) == {described["driver"]}
        assert set(summary["torch"].dropna()) == {described["torch"]}
        assert {v.rsplit(".", 1)[0] for v in summary["nsys_version"].dropna()} == {
            described["nsys"]}
        # the current runs are in the history, at their commit, with their step time
        # (a folder's earlier runs, replaced by a new run, stay in the history at their commit)
        ok = summary[summary["status"] == "ok"].set_index("run")
        commit = ok["provenance_git_commit"].iloc[0]
        source = history["source"] == str(folder.relative_to(REPO))
        mine = history[source & (history["commit"] == commit)].set_index("run")
        assert set(ok.index) <= set(mine.index), folder
        assert mine.loc[ok.index, "step_ms"].to_numpy() == pytest.approx(ok["step_ms"].to_numpy())
    assert not history.duplicated(["config", "run", "commit"]).any()


@pytest.mark.parametrize("folder", CONFIGS, ids=lambda p: str(p.relative_to(PUBLISHED)))
def test_a_config_folder_is_one_run_at_one_commit_with_its_command(folder: Path) -> None:
    summary = pd.read_csv(folder / "summary.csv")
    commits = set(summary["provenance_git_commit"].dropna())
    assert len(commits) == 1, commits
    readme = (folder / "README.md").read_text()
    assert next(iter(commits))[:7] in readme
    assert "```sh" in readme and "make run CONTAINER=none" in readme
    for made in ("SUMMARY.md", "overview.html", "findings.csv", "plots", "plan.json"):
        assert (folder / made).exists(), made


def _readme_cells(row_label: str) -> list[str]:
    """The cells of the README's table row that starts with `row_label`."""
    for line in (REPO / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == row_label:
            return cells[1:]
    raise AssertionError(f"no README row {row_label!r}")


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell.replace("**", ""))]


def _shown(value: float, text: str) -> bool:
    """`text` is `value` rounded as the README shows it (its own number of decimals)."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return f"{value:.{decimals}f}" == text


def test_the_readme_headline_numbers_come_from_the_standard_folder() -> None:
    ladders = {size: pd.read_csv(HEADLINE / "ladders" / f"gpt_train_{size}.csv").set_index("rung")
               for size in ("small", "2.7B")}
    rows = {"fp32 eager": "fp32_eager", "+ TF32": "tf32", "+ bf16 autocast": "bf16",
            "+ fused AdamW": "fused_adamw", "+ cuDNN attention": "sdpa_cudnn",
            "+ torch.compile": "compile", "+ CUDA graphs per compiled region": "cuda_graphs",
            "+ master-weight AdamW": "master_weights",
            "+ the whole step in one CUDA graph": "step_graph"}
    for label, rung in rows.items():
        for size, cell in zip(("small", "2.7B"), _readme_cells(label), strict=True):
            if rung not in ladders[size].index:
                assert "not a" in cell
                continue
            row = ladders[size].loc[rung]
            texts = re.findall(r"\d+(?:\.\d+)?", cell.replace("**", ""))[:3]
            expected = (row["step_ms"], row["step_ci_low_ms"], row["step_ci_high_ms"])
            assert all(_shown(v, t) for v, t in zip(expected, texts, strict=True)), (label, size)
    summary = pd.read_csv(HEADLINE / "summary.csv").set_index("run")
    impls = ["naive", "math", "efficient", "flash", "cudnn"]
    cells = _readme_cells("TFLOP/s")
    for impl, cell in zip(impls, cells, strict=True):
        run = (f"attn_{impl}_b8_h16_s4096_d128_forward" if impl == "naive"
               else f"attn_sdpa_{impl}_b8_h16_s4096_d128_forward")
        assert _shown(summary.loc[run, "tflops"], cell.replace("**", "")), impl
    # its figures are that folder's
    figures = re.findall(r"!\[[^]]*\]\(([^)]+)\)", (REPO / "README.md").read_text())
    assert figures and all(f.startswith("published/h100/standard/plots/") for f in figures)
    assert all((REPO / f).is_file() for f in figures)


def test_a_config_without_ladders_draws_its_runs_over_the_commits(tmp_path: Path) -> None:
    """The distributed history has no ladder: its figure follows each run published at more
    than one commit, and no other."""
    from analysis.outputs import style
    from analysis.outputs.history import plot_history, repeated_runs

    history = pd.read_csv(PUBLISHED / "h200x4" / "history.csv")
    repeated = repeated_runs(history)
    counts = history[history["status"] == "ok"].groupby("run")["commit"].nunique()
    assert set(repeated["run"]) == set(counts[counts > 1].index) != set()
    assert style.has_data(plot_history(history, tmp_path / "history.png"))


def test_publish_leaves_out_captures_logs_and_named_runs(tmp_path: Path) -> None:
    """scripts/publish.sh on a real H100 results folder, one ladder rung left out: the plan, the
    comparisons, the summary and the ladder are made again without it."""
    source = tmp_path / "results"
    shutil.copytree(REPO / "tests" / "fixtures" / "published" / "h100-default-f2b989d", source)
    (source / "logs").mkdir()
    (source / "logs" / "plan.log").write_text("a job log\n")
    dest, dropped = tmp_path / "published", "gpt_train_small_1_bf16"
    subprocess.run(["bash", str(REPO / "scripts" / "publish.sh"), str(source), str(dest), dropped],
                   check=True, capture_output=True, env={**os.environ, "PYTHON": sys.executable})
    assert not (dest / dropped).exists() and not (dest / "logs").exists()
    assert not list(dest.rglob("*.sqlite")) and not (dest / "report.html").exists()
    plan = json.loads((dest / "plan.json").read_text())
    assert dropped not in plan["runs"] and plan["left_out"] == [dropped]
    assert all(dropped not in (c["a"], c["b"]) for c in plan["comparisons"])
    summary = pd.read_csv(dest / "summary.csv")
    kept = pd.read_csv(source / "summary.csv")
    assert set(summary["run"]) == set(kept["run"]) - {dropped}
    assert summary.set_index("run")["step_ms"].equals(
        kept.set_index("run").drop(dropped)["step_ms"].loc[summary["run"]])
    assert dropped not in set(pd.read_csv(dest / "ladders" / "gpt_train_small.csv")["run"])
    assert (dest / "SUMMARY.md").exists() and (dest / "overview.html").exists()


def test_publish_keeps_the_ladder_ends_traces_and_leaves_out_nested_results(
        tmp_path: Path) -> None:
    """A Perfetto trace is kept for each ladder's first and last rung only, the last rung
    being the last one kept when the run that was last is left out; a results folder of
    another config inside this one (its own plan.json) is not published with it."""
    source = tmp_path / "results"
    shutil.copytree(REPO / "tests" / "fixtures" / "published" / "h100-default-f2b989d", source)
    runs = json.loads((source / "plan.json").read_text())["runs"]
    for run in runs:  # the trace rule's output, stood in for: only which files stay is tested
        (source / run / "trace").mkdir(parents=True, exist_ok=True)
        (source / run / "trace" / "trace.perfetto-trace.gz").write_bytes(b"\x1f\x8b")
    nested = source / "fp8"
    nested.mkdir()
    for name in ("plan.json", "summary.csv"):
        shutil.copy(source / name, nested / name)
    dest = tmp_path / "published"
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "publish.sh"), str(source), str(dest),
         "gpt_train_small_3_cuda_graphs"], check=True, capture_output=True, text=True,
        env={**os.environ, "PYTHON": sys.executable})
    kept = sorted(p.parent.parent.name for p in dest.glob("*/trace/trace.perfetto-trace.gz"))
    assert kept == ["gpt_train_small_0_fp32_eager", "gpt_train_small_2_fused_adamw"]
    assert (dest / "attn_sdpa_cudnn_b8_h16_s4096_d128_forward").is_dir()  # the run stays
    assert nested.name not in {p.name for p in dest.iterdir()}
    assert "left out fp8/: another config's results folder" in done.stdout
