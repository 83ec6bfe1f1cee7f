"""The largest batch that fits: `python -m workloads.maxbatch` from real out-of-memory
results of separate processes (CPU: the workload's address-space cap gives a real OOM), and
`batch: max` in a pipeline config: refused where no search can answer it, searched by its own
job, its batch in the run's records, summary.csv and SUMMARY.md."""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO, snakemake

from pipeline import config
from pipeline.config import ConfigError
from workloads.__main__ import build_parser, hashed_params, record_params
from workloads.maxbatch import most_processes, search
from workloads.provenance import config_hash


def by_rule(largest: int):
    """A run whose batches fit up to ``largest`` (the search's own logic, no process)."""
    return lambda batch: {"batch": batch, "status": "ok" if batch <= largest else "oom"}


def test_doubling_then_bisecting_ends_between_a_fit_and_an_oom() -> None:
    found = search(by_rule(13), bound=64)
    assert [r["batch"] for r in found["tried"]] == [1, 2, 4, 8, 16, 12, 14, 13]
    assert found["batch"] == 13 and found["limited_by"] == "oom"
    assert search(by_rule(100), bound=48)["batch"] == 48  # the bound, reached
    assert search(by_rule(100), bound=48)["limited_by"] == "bound"
    assert search(by_rule(0), bound=8)["batch"] is None


def test_a_start_near_the_answer_gallops_from_it_up_or_down() -> None:
    assert [r["batch"] for r in search(by_rule(353), 4096, start=353)["tried"]] == [353, 354]
    up = search(by_rule(353), 4096, start=340)
    assert up["batch"] == 353 and up["oom_batch"] == 354
    assert [r["batch"] for r in up["tried"]][:6] == [340, 341, 343, 347, 355, 351]
    down = search(by_rule(353), 4096, start=400)
    assert [r["batch"] for r in down["tried"]][:5] == [400, 399, 397, 393, 385]
    assert down["batch"] == 353 and down["oom_batch"] == 354 and down["status"] == "ok"
    for start in (1, 2, 100, 353, 354, 1000, 4096):
        found = search(by_rule(353), 4096, start=start)
        assert (found["batch"], found["oom_batch"]) == (353, 354)
        assert len(found["tried"]) <= most_processes(4096)
    none = search(by_rule(0), 4096, start=64)
    assert none["batch"] is None and none["status"] == "oom" and none["tried"][-1]["batch"] == 1


def test_a_batch_that_fails_otherwise_ends_the_search() -> None:
    found = search(lambda b: {"batch": b, "status": "error" if b == 4 else "ok",
                              "message": "boom" if b == 4 else ""}, bound=64)
    assert found["batch"] is None and found["limited_by"] == "batch 4: error"
    assert found["status"] == "error" and "batch 4: error: boom" in found["message"]


def test_real_processes_find_the_batch_and_the_oom_one_up(tmp_path: Path) -> None:
    # GPT tiny, naive attention over 2048 tokens under a 1450 MB cap: batch 1 fits (it needs
    # ~1.2 GB of address space here), batch 2 (~1.6 GB) runs out of memory
    out = tmp_path / "maxbatch.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "workloads.maxbatch",
            "--bound",
            "8",
            "--out",
            str(out),
            "--",
            "gpt",
            "--size",
            "tiny",
            "--mode",
            "train",
            "--context",
            "2048",
            "--attention",
            "naive",
            "--device",
            "cpu",
            "--warmup",
            "0",
            "--steps",
            "1",
            "--memory_limit_mb",
            "1450",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(out.read_text())
    rows = {r["batch"]: r for r in found["tried"]}
    batch = found["batch"]
    assert rows[batch]["status"] == "ok" and rows[batch]["median_ms"] > 0
    assert rows[batch + 1]["status"] == "oom" and found["limited_by"] == "oom"
    assert found["median_ms"] == rows[batch]["median_ms"]
    assert f"largest batch that fits: {batch}" in done.stdout


# --- batch: max in a config ---------------------------------------------------------------

GPT_MAX = {"workload": "gpt", "size": "tiny", "mode": "train", "batch": "max", "device": "cuda"}


def plan_of(runs: dict, **top: object) -> config.Plan:
    return config.resolve({"results": "results", "runs": runs, **top})


def test_batch_max_runs_search_first_and_read_their_batch_from_it() -> None:
    plan = plan_of({"m": {**GPT_MAX, "max_batch_bound": 512, "max_batch_start": 64},
                    "plain": {**GPT_MAX, "batch": 8}}, defaults={"max_batch_bound": 1024})
    assert plan.max_batch == {"m": {"bound": 512, "start": 64}}
    args = plan.workload_args("m")
    assert "--batch_from results/m/maxbatch.json" in args and "--batch " not in args
    search = plan.max_batch_args("m")
    assert search.startswith("--bound 512 --start 64 --timeout-s ")
    assert search.split(" -- ")[1] == config.workload_args(plan.runs["m"])
    # the defaults' bound is for batch: max runs only; a plain run's command line is as before
    assert "max_batch_bound" not in plan.runs["plain"]
    assert plan.workload_args("plain") == config.workload_args({**GPT_MAX, "batch": 8})
    assert plan.record()["runs"]["m"]["max_batch"] == {"bound": 512, "start": 64}
    assert "max_batch" not in plan.record()["runs"]["plain"]
    cpu = plan_of({"c": {**GPT_MAX, "device": "cpu", "memory_limit_mb": 1000}})
    assert cpu.max_batch == {"c": {"bound": 4096, "start": 1}}


def test_ladder_rungs_each_search_their_batch() -> None:
    plan = config.resolve({"results": "results", "ladders": [{
        "name": "l", "base": {**GPT_MAX, "max_batch_bound": 256},
        "rungs": [{"name": "eager"}, {"name": "ckpt", "checkpoint": "layers"}]}]})
    assert set(plan.max_batch) == {"l_all_0_eager", "l_all_1_ckpt"}


@pytest.mark.parametrize(("run", "key", "says"), [
    ({**GPT_MAX, "workload": "sleep", "step_ms": 1, "size": None, "mode": None}, "batch",
     "sets no memory"),
    ({**GPT_MAX, "parallel": "ddp", "gpus": 2}, "batch", "one process"),
    ({**GPT_MAX, "device": "cpu"}, "batch", "memory_limit_mb"),
    ({**GPT_MAX, "batch": "big"}, "batch", "neither a batch size"),
    ({**GPT_MAX, "batch": 8, "max_batch_bound": 64}, "max_batch_bound", "for runs with batch: max"),
    ({**GPT_MAX, "max_batch_bound": 0}, "max_batch_bound", "integer >= 1"),
    ({**GPT_MAX, "max_batch_bound": True}, "max_batch_bound", "integer >= 1"),
    ({**GPT_MAX, "max_batch_start": 65, "max_batch_bound": 64}, "max_batch_start", "above"),
], ids=["sleep", "distributed", "cpu-uncapped", "not-max", "bound-without-max", "bound-0",
        "bound-bool", "start-above-bound"])
def test_batch_max_is_refused_where_no_search_can_answer(run: dict, key: str, says: str) -> None:
    run = {k: v for k, v in run.items() if v is not None}
    with pytest.raises(ConfigError) as err:
        plan_of({"r": run})
    assert err.value.where == f"runs.r.{key}" and says in err.value.problem


# --- a real pipeline: the search's job, then the run at its batch --------------------------

# GPT tiny, naive attention over 2048 tokens on the CPU: under a 1450 MB address-space cap
# batch 1 fits and batch 2 runs out of memory; under 600 MB batch 1 does not fit.
CAPPED = {"workload": "gpt", "size": "tiny", "mode": "train", "context": 2048,
          "attention": "naive", "batch": "max", "max_batch_bound": 8, "profile": False}
PIPELINE = {"results": "results/mb", "timing": {"repeats": 1}, "calibrate": False,
            "launcher": "process", "defaults": {"device": "cpu", "warmup": 0, "steps": 1},
            "runs": {"fits": {**CAPPED, "memory_limit_mb": 1450},
                     "none_fits": {**CAPPED, "memory_limit_mb": 600}}}


@pytest.mark.slow
def test_pipeline_runs_at_the_batch_its_search_found(tmp_path: Path) -> None:
    cfg = tmp_path / "maxbatch.yaml"
    cfg.write_text(yaml.safe_dump(PIPELINE))
    done = snakemake(tmp_path, "results/mb/summary.csv", "results/mb/SUMMARY.md", "--cores", "2",
                     "--configfile", str(cfg))
    results = tmp_path / "results" / "mb"
    search = json.loads((results / "fits" / "maxbatch.json").read_text())
    rows = {r["batch"]: r for r in search["tried"]}
    assert (search["status"], search["batch"], search["oom_batch"]) == ("ok", 1, 2)
    assert rows[1]["status"] == "ok" and rows[2]["status"] == "oom"  # a real OOM, one up
    record = json.loads((results / "fits" / "timing" / "r0.json").read_text())
    assert record["status"] == "ok" and record["params"]["batch"] == 1
    assert record["max_batch"]["oom_batch"] == 2 and record["max_batch"]["bound"] == 8
    # its config hash is that of the batch it ran (the search's file is no setting)
    plain = {k: v for k, v in {**PIPELINE["defaults"], **CAPPED}.items()
             if k not in ("max_batch_bound", "profile")}
    args = build_parser().parse_args(shlex.split(config.workload_args(
        {**plain, "batch": 1, "memory_limit_mb": 1450})))
    assert record["provenance"]["config_hash"] == config_hash(
        hashed_params(record_params(args, torch.device("cpu"))))

    summary = {r["run"]: r for r in csv.DictReader((results / "summary.csv").open())}
    fits, none = summary["fits"], summary["none_fits"]
    assert (fits["status"], fits["batch"], fits["batch_from"]) == ("ok", "1", "max")
    assert (fits["max_batch_oom_batch"], fits["max_batch_oom_status"]) == ("2", "oom")
    assert fits["max_batch_bound"] == "8" and float(fits["step_ms"]) > 0
    # no batch fits: a failed row that says why, the pipeline goes on
    assert none["status"] == "oom" and none["batch"] == ""
    assert "batch: max found no batch that fits: batch 1 ran out of memory" in none["message"]
    assert "none_fits" in done.stderr
    page = (results / "SUMMARY.md").read_text()
    assert "The largest batch that fits (batch: max)" in page
    assert "| fits | 1 | — |" in page and "| 2 | oom | 8 | 2 |" in page
