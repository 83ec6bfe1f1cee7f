"""The whole pipeline on the CPU smoke matrix, for real: nsys, SQLite exports, the analysis
engine, the summary, plots and the HTML report (checked in headless Chromium)."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, SMOKE_CONFIG, smoke_console_file, snakemake

from analysis.outputs import aggregate
from analysis.outputs.diff_load import find_runs
from analysis.outputs.diff_markdown import _part_md as part_md
from analysis.outputs.diff_verdicts import explain_run, top_range
from analysis.outputs.findings import HIGH_OVERHEAD
from analysis.reports import REPORTS as NSYS_REPORTS

pytestmark = pytest.mark.slow

SMOKE = yaml.safe_load(SMOKE_CONFIG.read_text())
# Runs with an nsys capture, and all runs (ladder rungs, timed-only and failing runs too).
RUNS = [
    "attention_naive",
    "attention_sdpa",
    "gpt_tiny_forward_fp32",
    "gpt_tiny_train_fp32",
    "gpt_tiny_train_bf16",
]
LADDER = [
    "ladder_tiny_0_fp32_eager",
    "ladder_tiny_1_bf16",
    "ladder_tiny_2_fused_adamw",
    "ladder_tiny_3_sdpa",
    "ladder_tiny_4_compile",
]
TIMED_ONLY = ["attention_core_cudnn", "attention_core_math"]
ALL_RUNS = [*RUNS, *TIMED_ONLY, "gpt_small_oom", *LADDER]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOT_NAMES = [
    "ladder_waterfall", "attention_sweep", "phase_gpu_time", "kernel_categories", "step_time",
    "top_kernels", "idle_time", "kernel_durations", "gpu_utilization",
]


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
    for run in [*RUNS, *LADDER]:
        phases = pd.read_csv(out / run / "stats" / "phase_gpu_time.csv")
        assert "profiled_step" in set(phases["Range"]), run
    for run in TIMED_ONLY:
        assert not (out / run / "profile.sqlite").exists(), "timed-only runs have no capture"
    for run in ALL_RUNS:
        records = sorted((out / run / "timing").glob("r*.json"))
        assert len(records) == SMOKE["timing"]["repeats"], run
    for name in PLOT_NAMES:
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000, png
    compare = pd.read_csv(out / "compare" / "attention" / "compare_nvtx.csv")
    assert len(compare) > 0


def test_summary_has_one_row_per_run_with_metrics(smoke_workdir: Path) -> None:
    summary = pd.read_csv(results(smoke_workdir) / "summary.csv").set_index("run")
    assert sorted(summary.index) == sorted(ALL_RUNS)
    for column in [
        "status", "flags", "step_ms", "step_ci_low_ms", "step_ci_high_ms", "step_ms_traced",
        "profiler_overhead", "unstable", "timing_processes", "gpu_utilization",
        "tensor_core_share", "theoretical_occupancy", "kernel_count", "nsys_version",
        "phase_gpu_ms_backward_pass", "provenance_environment", "provenance_git_commit",
        "provenance_config_hash", "gpu_state_flags",
    ]:
        assert column in summary.columns, column
    ok = summary[summary["status"] == "ok"]
    failed = summary.loc[summary["status"] != "ok", ["status", "message"]].to_dict("index")
    assert set(ok.index) == set(ALL_RUNS) - {"gpt_small_oom", "attention_core_cudnn"}, failed
    assert (ok["step_ci_low_ms"] <= ok["step_ms"]).all()
    assert (ok["step_ms"] <= ok["step_ci_high_ms"]).all()
    assert (ok["timing_processes"] == SMOKE["timing"]["repeats"]).all()
    captured = ok.loc[[*RUNS, *LADDER]]
    # The published step is the untraced one; the overhead is traced / untraced - 1.
    assert (captured["profiler_overhead"] - (captured["step_ms_traced"] / captured["step_ms"] - 1)
            ).abs().max() < 1e-9
    assert set(summary["provenance_environment"].dropna()) == {"host"}
    assert summary["provenance_git_commit"].str.fullmatch("[0-9a-f]{40}").all()
    # No GPU here: kernel counts are zero and GPU metrics empty, not made up.
    assert (captured["kernel_count"].fillna(0) == 0).all()
    assert captured["gpu_utilization"].isna().all()
    assert any(c.startswith("category_time_ns_") for c in summary.columns)


def test_failures_are_result_rows(smoke_workdir: Path) -> None:
    """An OOM under the memory cap and an unsupported backend are rows; the rest finished."""
    summary = pd.read_csv(results(smoke_workdir) / "summary.csv").set_index("run")
    oom = summary.loc["gpt_small_oom"]
    assert oom["status"] == "oom" and "allocate" in oom["message"]
    assert "failed" in oom["flags"]
    unsupported = summary.loc["attention_core_cudnn"]
    assert unsupported["status"] == "unsupported" and "cudnn" in unsupported["message"]
    out = results(smoke_workdir)
    metrics = json.loads((out / "gpt_small_oom" / "stats" / "metrics.json").read_text())
    assert metrics["status"] == "oom"
    assert (out / "gpt_small_oom" / "profile.sqlite").stat().st_size == 0


def failure_block(console: str) -> str:
    """The block the pipeline prints at its end about the runs that did not end ok."""
    start = console.index("profbench: 2 of ")
    return console[start:start + 2000]


def test_the_console_names_each_failed_run_and_its_log(smoke_workdir: Path) -> None:
    """At its end, the run (exit 0: failures are results) says which runs did not end ok,
    why in one line, and where their traceback is."""
    block = failure_block(smoke_console_file(smoke_workdir).read_text())
    assert block.startswith(f"profbench: 2 of {len(ALL_RUNS)} runs did not end ok")
    assert "fail_on: error makes that an exit 1" in block
    log = f"{SMOKE['results']}/logs/time_run/gpt_small_oom.log"
    assert re.search(r"gpt_small_oom +oom: .*allocate", block) and log in block
    assert (smoke_workdir / log).is_file()
    assert re.search(r"attention_core_cudnn +unsupported: .*cudnn", block, re.I)


def test_the_compiled_capture_ran_the_timed_graphs(smoke_workdir: Path) -> None:
    """The capture and the timing processes of the compiled rung made the same graphs; a
    capture that made more is flagged (that record, one graph more: a recompile)."""
    folder = results(smoke_workdir)
    summary = pd.read_csv(folder / "summary.csv").set_index("run")
    row = summary.loc[LADDER[-1]]
    assert row["dynamo_graphs_traced"] == row["dynamo_graphs_timed"] >= 1
    assert "capture_recompiled" not in str(row["flags"])
    times = json.loads((folder / LADDER[-1] / "times.json").read_text())
    timed = [json.loads(p.read_text()) for p in (folder / LADDER[-1] / "timing").glob("r*.json")]
    recompiled = {**times, "dynamo_graphs": times["dynamo_graphs"] + 1}
    columns = aggregate.traced_columns(recompiled, row["step_ms"], timed)
    assert "capture_recompiled" in aggregate._flags({**columns, "status": "ok"},
                                                    aggregate.read_timing(folder / LADDER[-1]))
    assert json.loads((folder / LADDER[0] / "timing" / "r0.json").read_text()).get(
        "dynamo_graphs", 0) == 0  # eager: nothing compiled


def test_ladder_table_has_every_rung_and_its_gain(smoke_workdir: Path) -> None:
    table = pd.read_csv(results(smoke_workdir) / "ladders" / "ladder_tiny.csv")
    assert list(table["run"]) == LADDER
    assert list(table["rung_index"]) == list(range(len(LADDER)))
    summary = pd.read_csv(results(smoke_workdir) / "summary.csv").set_index("run")
    for _, row in table.iloc[1:].iterrows():
        prev = table.loc[table["rung_index"] == row["rung_index"] - 1].iloc[0]
        # point estimates of the gain are the ratio of the two untraced medians
        assert row["x_vs_prev"] == pytest.approx(prev["step_ms"] / row["step_ms"])
        assert row["x_vs_prev_ci_low"] <= row["x_vs_prev"] <= row["x_vs_prev_ci_high"]
        assert row["step_ms"] == pytest.approx(summary.loc[row["run"], "step_ms"])
    compiled = json.loads((results(smoke_workdir) / LADDER[-1] / "timing" / "r0.json").read_text())
    assert compiled["params"]["compile"] == "default" and compiled["compile_s"] > 0


def test_every_finding_cites_a_number_that_is_in_its_csv(smoke_workdir: Path) -> None:
    out = results(smoke_workdir)
    findings = pd.read_csv(out / "findings.csv")
    # Without a GPU the rules that fire are mostly the timing ones, on whichever runs this
    # machine's noise made unstable or slow to trace: those findings must name exactly the
    # runs whose summary cells say so (not a number of findings, which the noise decides).
    summary = pd.read_csv(out / "summary.csv").set_index("run")
    unstable = summary.index[summary["unstable"].astype(str).str.lower() == "true"]
    assert set(findings.loc[findings["rule"] == "unstable_timing", "run"]) == set(unstable)
    traced_slow = summary.index[summary["profiler_overhead"] > HIGH_OVERHEAD]
    assert set(findings.loc[findings["rule"] == "high_profiler_overhead", "run"]) == set(
        traced_slow)
    for _, f in findings.iterrows():
        table = pd.read_csv(out / f["source"])
        row = table.loc[table[f["key_column"]].astype(str) == str(f["key"])]
        assert len(row) == 1, (f["rule"], f["key"])
        assert float(row.iloc[0][f["value_column"]]) == pytest.approx(f["value"]), f["rule"]


def test_overview_answers_first(smoke_workdir: Path) -> None:
    out = results(smoke_workdir)
    md = (out / "SUMMARY.md").read_text()
    assert md.startswith("# profbench results")
    assert "| ladder_tiny |" in md and "Flagged runs" in md
    # the CPU's attention TFLOP/s are tiny: shown with their digits, never as a bare 0.0
    row = next(line for line in md.splitlines() if line.startswith("| b1 h2 s64"))
    summary = pd.read_csv(out / "summary.csv").set_index("run")
    tflops = summary.loc["attention_core_math", "tflops"]
    assert 0 < tflops and row.split("|")[2].strip() == f"{tflops:.4g}"
    page = (out / "overview.html").read_text()
    assert "<img" in page and "data:image/png;base64," in page
    assert "http://" not in page and "https://" not in page


def test_train_run_nvtx_counts_match_steps_and_layers(smoke_workdir: Path) -> None:
    """Acceptance: phases once per measured step, the layers' and their parts' module ranges
    once per step in forward and once in backward, and no warm-up inside the capture."""
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
        "final_norm",
        "lm_head",
    ]:
        assert counts.get(name) == steps, (name, counts.get(name))
    # forward (pushed on the main thread) and backward (autograd's thread, ":"-prefixed)
    instances = nvtx.groupby(nvtx["Range"].str.lstrip(":"))["Instances"].sum()
    for i in range(layers):
        for part in ("", ".ln1", ".attn", ".ln2", ".ffn"):
            assert instances[f"module:layers.{i}{part}"] == 2 * steps, (i, part)
    assert "warmup" not in counts
    times = json.loads((results(smoke_workdir) / "gpt_tiny_train_fp32" / "times.json").read_text())
    assert len(times["step_times_ms"]) == steps
    # nsys starts and stops collecting where the measured region begins and ends: a cost the
    # record names (region_ms), outside every step; the untraced twin pays ~nothing there
    timing = json.loads(
        (results(smoke_workdir) / "gpt_tiny_train_fp32" / "timing" / "r0.json").read_text())
    traced, untraced = (sum(r["region_ms"].values()) for r in (times, timing))
    assert traced > 10 * untraced + 10, (times["region_ms"], timing["region_ms"])


def test_nothing_reruns_when_nothing_changed(smoke_workdir: Path) -> None:
    done = snakemake(smoke_workdir, "-n", "--cores", "1", "--configfile", str(SMOKE_CONFIG))
    assert "Nothing to be done" in done.stdout + done.stderr


def test_one_output_file_reruns_only_its_job(smoke_copy: Path) -> None:
    target = f"{SMOKE['results']}/attention_naive/stats/metrics.json"
    (smoke_copy / target).unlink()
    done = snakemake(smoke_copy, target, "--cores", "1", "--configfile", str(SMOKE_CONFIG))
    assert job_counts(done.stdout + done.stderr) == {"run_stats": 1, "total": 1}
    assert (smoke_copy / target).exists()


def test_editing_one_run_reruns_only_that_run(smoke_workdir: Path, smoke_copy: Path,
                                              tmp_path: Path) -> None:
    # the run whose jobs end soonest (at its memory cap, before its first step)
    config = yaml.safe_load(SMOKE_CONFIG.read_text())
    config["runs"]["gpt_small_oom"]["seed"] = 7
    del config["runs"]["attention_core_math"]  # dropped: its folder stays, the summary not
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(config))
    untouched = results(smoke_copy) / "gpt_tiny_train_fp32" / "profile.sqlite"
    before = untouched.stat().st_mtime_ns
    # for CI: `fail_on: error` ends the same run with exit 1 once everything is written
    config["fail_on"] = "error"
    edited.write_text(yaml.safe_dump(config))
    done = snakemake(smoke_copy, "--cores", "2", "--configfile", str(edited), check=False)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "fail_on: error: the workflow exits 1" in failure_block(done.stderr)
    assert "2 run(s) did not end ok (attention_core_cudnn, gpt_small_oom)" in done.stderr
    assert (results(smoke_copy) / "SUMMARY.md").stat().st_mtime_ns > before
    counts = job_counts(done.stdout + done.stderr)
    # that run's timing process, capture and statistics, then what is made across runs
    assert {k: counts.get(k) for k in ("time_run", "profile", "run_stats")} == {
        "time_run": 1, "profile": 1, "run_stats": 1,
    }
    assert "calibrate" not in counts and "plan" in counts
    assert untouched.stat().st_mtime_ns == before
    times = json.loads((results(smoke_copy) / "gpt_small_oom" / "times.json").read_text())
    assert times["params"]["seed"] == 7
    assert (results(smoke_copy) / "attention_core_math" / "timing").is_dir()
    diff_of_a_config_that_dropped_a_run(results(smoke_workdir), results(smoke_copy),
                                        tmp_path / "diff")


def diff_of_a_config_that_dropped_a_run(old: Path, new: Path, out: Path) -> None:
    """`analysis diff` counts the runs of the new summary, not the folders left on disk; the
    runs that failed on both sides are said to have."""
    done = subprocess.run([sys.executable, "-m", "analysis", "diff", str(old), str(new), "-o",
                           str(out)], cwd=REPO, capture_output=True, text=True, check=True)
    matched = len(ALL_RUNS) - 1
    # the unchanged runs read within noise, or inconclusive where one process's three steps
    # scatter by more than the 5% threshold (docs/diff.md): those get the rerun's command
    unchanged = pd.read_csv(out / "runs.csv")["verdict"].value_counts()
    within, unjudged = unchanged.get("within noise", 0), unchanged.get("inconclusive", 0)
    assert within + unjudged == matched - 2
    rerun = [f"{unjudged} run(s) to rerun with"] if unjudged else []
    lines = done.stdout.splitlines()[1:]
    assert [line[:len(rerun[0])] for line in lines[:-1]] == rerun
    assert lines[-1] == "only in old (1): attention_core_math"
    assert done.stdout.splitlines()[0].endswith(
        f"{matched} runs matched: 0 slower, 0 faster, {within} within noise, {unjudged} "
        "inconclusive, 2 failed on both sides; 1 only in old, 0 only in new."), done.stdout


def test_diff_of_an_eager_and_a_compiled_rung_never_reads_a_missing_range_as_zero(
        smoke_workdir: Path) -> None:
    """The ladder's eager rung against its compiled one (real run folders): the ranges that
    compiled code does not run (the layers, the attention ops) are not comparable, never a
    -100% change; the phases both have are compared."""
    runs = find_runs(results(smoke_workdir))
    explained = explain_run(runs["ladder_tiny_3_sdpa"], runs["ladder_tiny_4_compile"], -1.0)
    ranges = explained.ranges.set_index("key")
    layer = ranges.loc["module:layers.0"]
    assert layer["comparable"] == ("not comparable (no such range in new: compiled code has "
                                   "no NVTX ranges inside its graphs)")
    assert layer["old_ms_per_step"] > 0 and pd.isna(layer["new_ms_per_step"])
    assert pd.isna(layer["delta_ms_per_step"]) and pd.isna(layer["share_of_change"])
    assert ranges.loc["forward_pass", "comparable"] == ""
    assert ranges.loc["forward_pass", "new_ms_per_step"] > 0
    assert top_range(explained.ranges) not in ranges.index[ranges["comparable"] != ""]
    table = "\n".join(part_md("Top NVTX ranges", explained.ranges, 50, "range"))
    assert "| module:layers.0 | " in table and "-100%" not in table
    assert re.search(r"\| module:layers.0 \| [\d.]+ \| – \| not comparable \(", table), table


def test_lint_finds_nothing(tmp_path: Path) -> None:
    done = snakemake(tmp_path, "--lint", "--configfile", str(SMOKE_CONFIG), check=False)
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


class RequestRecorder(http.server.BaseHTTPRequestHandler):
    """A proxy that records every request the browser tries to send off the machine."""

    seen: list[str] = []

    def _refuse(self) -> None:
        RequestRecorder.seen.append(f"{self.command} {self.path}")
        self.send_error(502)

    do_GET = do_POST = do_CONNECT = do_HEAD = _refuse  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def outbound_requests() -> Iterator[tuple[list[str], str]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RequestRecorder)
    RequestRecorder.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield RequestRecorder.seen, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


# Chromium's own services (network time, component updater, sign-in) may call home whatever
# the flags say; they are not the page's requests. Anything else the proxy sees is.
BROWSER_SERVICES = ("clients2.google.com/time/", "update.googleapis.com/service/update2",
                    "update.googleapis.com:443", "accounts.google.com:443")


def page_requests(seen: list[str]) -> list[str]:
    return [r for r in seen if not any(s in r for s in BROWSER_SERVICES)]


def browser_flags(profile: Path, proxy: str) -> list[str]:
    return [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-domain-reliability", "--disable-client-side-phishing-detection",
        "--no-pings", "--disable-default-apps",
        "--disable-features=NetworkTimeServiceQuerying,OptimizationHintsFetching,MediaRouter",
        f"--user-data-dir={profile}", "--virtual-time-budget=10000",
        # every http(s) request goes to the recorder instead of the network
        f"--proxy-server={proxy}", "--proxy-bypass-list=<-loopback>",
    ]


def test_report_renders_in_a_browser(
    smoke_workdir: Path, tmp_path: Path, outbound_requests: tuple[list[str], str]
) -> None:
    seen, proxy = outbound_requests
    report = tmp_path / "report.html"  # not in the shared smoke run: other tests read it
    snakemake(smoke_workdir, "--report", str(report), "--configfile", str(SMOKE_CONFIG))
    assert report.stat().st_size > 10_000
    flags = browser_flags(tmp_path / "profile", proxy)
    dom = subprocess.run(
        [chromium(), *flags, "--dump-dom", report.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    # Rendered by the report's JavaScript, so present only if the page really ran.
    for text in ["summary.csv", "Overview", "Figures", "Comparisons", "Ladders"]:
        assert text in dom, f"{text!r} not in the rendered report"
    assert page_requests(seen) == [], f"the report tried to reach the network: {seen}"


def test_front_page_renders_every_image(
    smoke_workdir: Path, tmp_path: Path, outbound_requests: tuple[list[str], str]
) -> None:
    """The overview (the report's first result, and SUMMARY.md as HTML) in a real browser:
    every figure decoded, nothing fetched from outside, and a screenshot of it."""
    seen, proxy = outbound_requests
    page = results(smoke_workdir) / "overview.html"
    flags = browser_flags(tmp_path / "profile", proxy)
    dom = subprocess.run(
        [chromium(), *flags, "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    images = int(re.search(r'data-images="(\d+)"', dom).group(1))
    decoded = int(re.search(r'data-images-decoded="(\d+)"', dom).group(1))
    assert images >= 3 and decoded == images, (images, decoded)
    shot = tmp_path / "front.png"
    subprocess.run(
        [chromium(), *flags, "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, timeout=120, check=True,
    )
    assert shot.read_bytes()[:8] == PNG_MAGIC and shot.stat().st_size > 50_000
    assert page_requests(seen) == [], f"the front page tried to reach the network: {seen}"
