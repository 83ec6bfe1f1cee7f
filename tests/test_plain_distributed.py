"""The plain-script check of the distributed runs (docs/distributed.md, "Checking against a
plain script") on the CPU: benchmarks/plain_distributed.py under torchrun with 2 gloo ranks
(DDP and FSDP2, each with the no-sync step), benchmarks/distributed_vs_plain.py against the
published H200 x2 results, and the commands benchmarks/distributed_spread.py launches."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shlex
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import distributed_spread  # noqa: E402
import distributed_vs_plain  # noqa: E402
import plain_distributed  # noqa: E402

from workloads.gpt import GPT, config_for, count_parameters  # noqa: E402

PUBLISHED = REPO / "published" / "h200x4" / "distributed"
# the tiny model on a short context and a small vocabulary: seconds on two gloo ranks
SMALL_STEP = ["--batch", "2", "--context", "32", "--vocab", "256"]
STEPS = 3


def quietly(main: Any, argv: list[str]) -> tuple[Any, str]:
    """A benchmark's main() and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = main(argv)
    return result, out.getvalue()


def check_timing(part: dict[str, Any], ranks: int, steps: int) -> None:
    """Every rank timed `steps` steps; the medians are the rank medians' median."""
    assert len(part["rank_step_ms"]) == ranks
    for times, median in zip(part["rank_step_ms"], part["rank_median_ms"], strict=True):
        assert len(times) == steps and all(t > 0 for t in times)
        assert median == pytest.approx(statistics.median(times))
    assert part["step_ms"] == pytest.approx(statistics.median(part["rank_median_ms"]))


@pytest.fixture(scope="module")
def fsdp_launch(tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[subprocess.Popen, Path]]:
    """FSDP2 on 2 gloo ranks, started at once so that it runs while the DDP check runs."""
    out = tmp_path_factory.mktemp("fsdp") / "plain.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", "2", str(REPO / "benchmarks" / "plain_distributed.py"),
           "--size", "tiny", "--parallel", "fsdp", "--device", "cpu", "--warmup", "1",
           "--steps", str(STEPS), "--no-sync", "--out", str(out), *SMALL_STEP]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    yield proc, out
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def vs_plain(tmp_path_factory: pytest.TempPathFactory, fsdp_launch: tuple
             ) -> tuple[dict[str, Any], str, Path]:
    """distributed_vs_plain.py against the published results: the plain script (tiny, 2 gloo
    ranks, DDP) launched for gpt_small_ddp2, its JSON and CSV."""
    tmp = tmp_path_factory.mktemp("vs_plain")
    result, printed = quietly(distributed_vs_plain.main, [
        "--results", str(PUBLISHED), "--runs", "gpt_small_ddp2", "--size-map", "small=tiny",
        "--device", "cpu", "--plain-args", shlex.join(SMALL_STEP), "--warmup", "1",
        "--steps", str(STEPS), "--rounds", "1", "--no-sync", "--json", str(tmp / "vs.json"),
        "--csv", str(tmp / "vs.csv")])
    return result, printed, tmp


def test_parameter_counts_match_the_workloads_gpt() -> None:
    """The plain model has the parameters of workloads/gpt.py's GPT, size by size (both built
    on the meta device: nothing is allocated)."""
    for size in ("tiny", "small", "2.7B"):
        with torch.device("meta"):
            workload_model = GPT(config_for(size, vocab_size=10_000, context_length=512))
        built = sum(p.numel() for p in workload_model.parameters())
        assert all(p.is_meta for p in workload_model.parameters())
        plain = plain_distributed.count_params(size, vocab=10_000, context=512)
        assert plain == built == count_parameters(config_for(size, vocab_size=10_000))
    counted, printed = quietly(plain_distributed.main, ["--size", "2.7B", "--count-params"])
    assert counted["params"] == json.loads(printed)["params"] == 3_406_809_600


def test_ddp_step_and_no_sync_step_on_two_gloo_ranks(vs_plain: tuple) -> None:
    result, _, _ = vs_plain
    run = result["runs"]["gpt_small_ddp2"]
    assert run["command"].split()[1:3] == ["-m", "torch.distributed.run"]
    [plain] = run["plain"]
    assert plain["status"] == "ok"
    assert (plain["parallel"], plain["world_size"], plain["size"]) == ("ddp", 2, "tiny")
    assert (plain["batch"], plain["context"], plain["vocab"]) == (2, 32, 256)
    assert plain["params"] == plain_distributed.count_params("tiny", vocab=256, context=32)
    check_timing(plain, ranks=2, steps=STEPS)
    check_timing(plain["no_sync"], ranks=2, steps=STEPS)
    assert plain["sync_cost_ms"] == pytest.approx(
        plain["step_ms"] - plain["no_sync"]["step_ms"])
    assert plain["timer"] == "wall" and plain["nccl"] is None


def test_fsdp_step_and_no_sync_step_on_two_gloo_ranks(fsdp_launch: tuple) -> None:
    proc, out = fsdp_launch
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output[-3000:]
    plain = json.loads(out.read_text())
    [line] = [x for x in output.splitlines() if x.startswith("{")]  # rank 0's one JSON line
    assert json.loads(line) == plain
    assert (plain["parallel"], plain["world_size"], plain["reshard_after_forward"]) == (
        "fsdp", 2, True)
    check_timing(plain, ranks=2, steps=STEPS)
    check_timing(plain["no_sync"], ranks=2, steps=STEPS)
    assert "sync_cost_ms" in plain


def test_table_beside_the_published_numbers(vs_plain: tuple) -> None:
    """The pipeline's side of the table is the published folder's, read independently here."""
    result, printed, tmp = vs_plain
    with open(PUBLISHED / "summary.csv", newline="") as f:
        summary = {row["run"]: row for row in csv.DictReader(f)}["gpt_small_ddp2"]
    processes = [json.loads(p.read_text())["median_ms"]
                 for p in sorted((PUBLISHED / "gpt_small_ddp2" / "timing").glob("r*.json"))]
    row = result["runs"]["gpt_small_ddp2"]
    assert row["pipeline_ms"] == pytest.approx(float(summary["step_ms"]))
    assert row["pipeline_ci_low_ms"] == pytest.approx(float(summary["step_ci_low_ms"]))
    assert row["pipeline_ci_high_ms"] == pytest.approx(float(summary["step_ci_high_ms"]))
    assert row["pipeline_process_ms"] == pytest.approx(processes)
    assert len(processes) == int(float(summary["timing_processes"]))
    assert row["params_pipeline"] == int(float(summary["params_count"]))
    assert row["plain_ms"] == pytest.approx(row["plain"][0]["step_ms"])
    assert row["ratio"] == pytest.approx(row["pipeline_ms"] / row["plain_ms"])
    assert row["within_5pct"] == (abs(row["ratio"] - 1) <= 0.05)
    assert row["plain_sync_cost_ms"] == pytest.approx(row["plain"][0]["sync_cost_ms"])
    line = next(x for x in printed.splitlines() if x.startswith("gpt_small_ddp2"))
    assert f"{row['pipeline_ms']:.1f}" in line and f"{row['plain_ms']:.1f}" in line
    with open(tmp / "vs.csv", newline="") as f:
        [written] = list(csv.DictReader(f))
    assert float(written["ratio"]) == pytest.approx(row["ratio"])
    # the table again from the JSON, launching nothing
    again, _ = quietly(distributed_vs_plain.main, [
        "--results", str(PUBLISHED), "--runs", "gpt_small_ddp2",
        "--plain-json", str(tmp / "vs.json")])
    assert again["runs"]["gpt_small_ddp2"]["ratio"] == pytest.approx(row["ratio"])


def test_table_says_which_pipeline_steps_are_host_bound() -> None:
    """Two H200s' records (tests/fixtures/h200x2/host): each run's host_bound_share comes from
    its own timing records and is printed beside its ratio; the published folder's records,
    made before the share existed, print none."""
    from analysis.metrics.host import host_bound_share
    from analysis.outputs.runs import read_timing

    host = REPO / "tests" / "fixtures" / "h200x2" / "host"
    runs = {r.name: r for r in distributed_vs_plain.read_results(host)}
    for name, run in runs.items():
        assert run.host_bound_share == pytest.approx(
            host_bound_share(read_timing(host / name).ok_records))
    assert runs["gpt_small_ddp2"].host_bound_share > 0.9 > runs["gpt_small_ddp2_b128"
                                                                ].host_bound_share
    plain = [{"status": "ok", "step_ms": 50.0}]
    table = distributed_vs_plain.format_table(
        [distributed_vs_plain.comparison_row(runs["gpt_small_ddp2"], plain)])
    line = next(x for x in table.splitlines() if x.startswith("gpt_small_ddp2"))
    assert line.endswith(f"{runs['gpt_small_ddp2'].host_bound_share:.2f}")
    assert "host: the pipeline's host_bound_share" in table
    published = {r.name: r for r in distributed_vs_plain.read_results(PUBLISHED)}
    assert published["gpt_small_ddp2"].host_bound_share is None


def test_dry_run_gives_each_published_run_its_plain_counterpart() -> None:
    result, printed = quietly(distributed_vs_plain.main, ["--results", str(PUBLISHED),
                                                          "--dry-run"])
    plan = json.loads((PUBLISHED / "plan.json").read_text())["runs"]
    # every eager GPT train run has its plain counterpart; the no-communication twins and the
    # straggler (test knobs) and the compiled runs (the plain script is eager) have none
    knobs = {name for name, run in plan.items()
             if run["params"].get("comm", "on") != "on" or run["params"].get("straggle_ms")}
    compiled = {name for name, run in plan.items()
                if run["params"].get("compile", "off") != "off"}
    assert knobs and compiled and set(result["commands"]) == set(plan) - knobs - compiled
    for name, cmd in result["commands"].items():
        params, argv = plan[name]["params"], shlex.split(cmd)
        flags = dict(zip(argv, argv[1:], strict=False))
        gpus = params.get("gpus", 1)
        assert (flags.get("--nproc-per-node") == str(gpus)) == (gpus > 1), name
        for key in ("size", "batch", "context", "vocab", "dtype"):
            assert flags[f"--{key}"] == str(params[key]), (name, key)
        assert flags["--parallel"] == params.get("parallel", "none")
        assert flags["--sdpa"] == params["sdpa_backend"]
        assert name in printed
    flags = shlex.split(result["commands"]["gpt_2.7B_ddp2"])
    assert float(flags[flags.index("--bucket-cap-mb") + 1]) == 25  # DDP's default
    flags = shlex.split(result["commands"]["gpt_2.7B_fsdp2"])
    assert flags[flags.index("--reshard-after-forward") + 1] == "true"


def test_spread_launches_the_pipelines_own_timing_command(tmp_path: Path) -> None:
    """The variants change one thing each in the command Snakemake gives the timing job."""
    result, _ = quietly(distributed_spread.main, [
        "--config", str(REPO / "tests" / "distributed.yaml"), "--run", "gpt_tiny_ddp2",
        "--variants", "pipeline,warmup20,bind,expandable,plain", "--dry-run",
        "--work", str(tmp_path)])
    shell = result["timing_command"]
    assert "OMP_NUM_THREADS=1" in shell and "-m pipeline.launch" in shell and "--ranks 2" in shell
    commands = result["commands"]
    pipeline = commands["pipeline"]["argv"]
    rank = len(pipeline) - pipeline[::-1].index("--")  # each rank's command starts here
    assert pipeline[rank:rank + 4] == [sys.executable, "-m", "workloads", "gpt"]
    assert pipeline[:3] == [sys.executable, "-m", "pipeline.guard"]
    assert shlex.join(pipeline).replace(str(tmp_path / "records" / "pipeline.0.json"), "OUT") \
        in shell.replace(f"{tmp_path}/snakemake/results/gpt_tiny_ddp2/timing/r0.json", "OUT")

    def same(variant: str) -> list[str]:
        out = str(tmp_path / "records" / f"{variant}.0.json")
        return [str(tmp_path / "records" / "pipeline.0.json") if t == out else t
                for t in commands[variant]["argv"]]

    assert same("warmup20") == pipeline + ["--warmup", "20"]
    bound = same("bind")
    assert bound[:rank] == pipeline[:rank] and bound[rank + 4:] == pipeline[rank:]
    assert bound[rank + 2] == distributed_spread.EXEC_BOUND
    assert same("expandable") == pipeline
    assert commands["expandable"]["env"]["PYTORCH_CUDA_ALLOC_CONF"] == \
        "expandable_segments:True"
    plain = commands["plain"]["argv"]
    flags = dict(zip(plain, plain[1:], strict=False))
    assert flags["--nproc-per-node"] == "2" and flags["--parallel"] == "ddp"
    config = yaml.safe_load((REPO / "tests" / "distributed.yaml").read_text())
    run = {**config["defaults"], **config["runs"]["gpt_tiny_ddp2"]}
    for key in ("size", "batch", "context", "warmup", "steps"):
        assert flags[f"--{key}"] == str(run[key]), key
    assert flags["--dtype"] == run.get("dtype", "fp32")


def test_binding_gives_each_rank_cores_of_its_own() -> None:
    allowed = distributed_spread.parse_cpulist("0-3,8,10-11")
    assert allowed == {0, 1, 2, 3, 8, 10, 11}
    here = os.sched_getaffinity(0)
    picked = [distributed_spread.rank_cpus(r, 2, here, [None, None]) for r in range(2)]
    cores = distributed_spread.physical_cores(here)
    if len(cores) >= 2:
        assert picked[0] and picked[1] and not picked[0] & picked[1]
    assert picked[0] | picked[1] <= here
    # ranks whose GPUs have CPUs of their own keep to those
    first, second = set(sorted(here)[: len(here) // 2] or here), here
    assert distributed_spread.rank_cpus(0, 2, here, [first, second]) <= first
