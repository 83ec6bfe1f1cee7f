"""The whole pipeline on the CPU smoke matrix, for real: nsys, SQLite exports, the analysis
engine, the summary, plots and the HTML report (checked in headless Chromium)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import SMOKE_CONFIG, snakemake

from analysis.reports import REPORTS as NSYS_REPORTS

pytestmark = pytest.mark.slow

SMOKE = yaml.safe_load(SMOKE_CONFIG.read_text())
RUNS = [
    "attention_naive",
    "attention_sdpa",
    "gpt_tiny_forward_fp32",
    "gpt_tiny_train_fp32",
    "gpt_tiny_train_bf16",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def results(workdir: Path) -> Path:
    return workdir / SMOKE["results"]


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table Snakemake prints: rule -> number of jobs."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Job stats:"))
    counts = {}
    for line in lines[start + 3 :]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        counts[parts[0]] = int(parts[1])
    return counts


def test_every_stage_writes_its_outputs(smoke_workdir: Path) -> None:
    out = results(smoke_workdir)
    for run in RUNS:
        assert (out / run / "profile.sqlite").stat().st_size > 0
        assert (out / run / "profile.nsys-rep").stat().st_size > 0
        for report in NSYS_REPORTS:
            csv = out / run / "stats" / f"{report}.csv"
            assert csv.exists(), csv
            assert csv.read_text().splitlines()[0], f"{csv} has no header"
        # nsys' own console statistics are kept in the profile log.
        assert "nvtx_sum" in (out / "logs" / "profile" / f"{run}.log").read_text()
    for name in ["step_time", "kernel_categories", "gpu_utilization", "nvtx_phases"]:
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000, png
    compare = pd.read_csv(out / "compare" / "attention" / "compare_nvtx.csv")
    assert len(compare) > 0


def test_summary_has_one_row_per_run_with_metrics(smoke_workdir: Path) -> None:
    summary = pd.read_csv(results(smoke_workdir) / "summary.csv")
    assert sorted(summary["run"]) == sorted(RUNS)
    for column in [
        "median_ms",
        "gpu_utilization",
        "tensor_core_share",
        "theoretical_occupancy",
        "kernel_count",
        "provenance_environment",
    ]:
        assert column in summary.columns, column
    assert (summary["median_ms"] > 0).all()
    assert (summary["steps_measured"] == SMOKE["defaults"]["steps"]).all()
    assert set(summary["provenance_environment"]) == {"host"}
    # No GPU here: kernel counts are zero and GPU metrics empty, not made up.
    assert (summary["kernel_count"].fillna(0) == 0).all()
    assert summary["gpu_utilization"].isna().all()
    assert any(c.startswith("category_time_ns_") for c in summary.columns)


def test_train_run_nvtx_counts_match_steps_and_layers(smoke_workdir: Path) -> None:
    """Acceptance: phases once per measured step, sublayers once per layer and step, and
    no warm-up inside the capture."""
    nvtx = pd.read_csv(results(smoke_workdir) / "gpt_tiny_train_fp32" / "stats" / "nvtx_sum.csv")
    counts = dict(zip(nvtx["Range"].str.lstrip(":"), nvtx["Instances"], strict=False))
    steps = SMOKE["defaults"]["steps"]
    layers = 2  # the tiny size
    for name in [
        "profiled_step",
        "forward_pass",
        "loss_computation",
        "backward_pass",
        "optimizer_step",
        "layer_0",
        "layer_1",
        "final_norm",
        "lm_head",
    ]:
        assert counts.get(name) == steps, (name, counts.get(name))
    assert counts["attention_sublayer"] == steps * layers
    assert counts["ffn_sublayer"] == steps * layers
    assert "warmup" not in counts
    times = json.loads((results(smoke_workdir) / "gpt_tiny_train_fp32" / "times.json").read_text())
    assert len(times["step_times_ms"]) == steps


def test_nothing_reruns_when_nothing_changed(smoke_workdir: Path) -> None:
    done = snakemake(smoke_workdir, "-n", "--cores", "1", "--configfile", str(SMOKE_CONFIG))
    assert "Nothing to be done" in done.stdout + done.stderr


def test_one_output_file_reruns_only_its_job(smoke_workdir: Path) -> None:
    target = f"{SMOKE['results']}/attention_naive/stats/metrics.json"
    (smoke_workdir / target).unlink()
    done = snakemake(smoke_workdir, target, "--cores", "1", "--configfile", str(SMOKE_CONFIG))
    assert job_counts(done.stdout + done.stderr) == {"run_stats": 1, "total": 1}
    assert (smoke_workdir / target).exists()


def test_editing_one_run_reruns_only_that_run(smoke_workdir: Path, tmp_path: Path) -> None:
    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    config["runs"]["gpt_tiny_train_bf16"]["seed"] = 7
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(config))
    untouched = results(smoke_workdir) / "gpt_tiny_train_fp32" / "profile.sqlite"
    before = untouched.stat().st_mtime_ns
    done = snakemake(smoke_workdir, "--cores", "2", "--configfile", str(edited))
    assert job_counts(done.stdout + done.stderr) == {
        "profile": 1,
        "run_stats": 1,
        "aggregate": 1,
        "plots": 1,
        "all": 1,
        "total": 5,
    }
    assert untouched.stat().st_mtime_ns == before
    times = json.loads((results(smoke_workdir) / "gpt_tiny_train_bf16" / "times.json").read_text())
    assert times["params"]["seed"] == 7


def test_lint_finds_nothing(smoke_workdir: Path) -> None:
    done = snakemake(smoke_workdir, "--lint", "--configfile", str(SMOKE_CONFIG), check=False)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text
    assert "Congratulations" in text, text


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    raise AssertionError(
        "headless Chromium is required for the report test (apt-get install "
        "chromium); .ci/run installs it"
    )


def test_report_renders_in_a_browser(smoke_workdir: Path, tmp_path: Path) -> None:
    report = smoke_workdir / "report.html"
    snakemake(smoke_workdir, "--report", str(report), "--configfile", str(SMOKE_CONFIG))
    assert report.stat().st_size > 10_000
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
    ]
    dom = subprocess.run(
        [chromium(), *flags, "--dump-dom", report.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    # Rendered by the report's JavaScript, so present only if the page really ran.
    for text in ["summary.csv", "Plots", "Comparisons"]:
        assert text in dom, f"{text!r} not in the rendered report"
    shot = tmp_path / "report.png"
    subprocess.run(
        [chromium(), *flags, "--window-size=1400,1000", f"--screenshot={shot}", report.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.read_bytes()[:8] == PNG_MAGIC
