"""`python -m workloads.maxbatch`: the largest batch that fits, from real out-of-memory
results of separate processes (CPU: the workload's address-space cap gives a real OOM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

from workloads.maxbatch import search


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


def test_a_batch_that_fails_otherwise_ends_the_search() -> None:
    found = search(lambda b: {"batch": b, "status": "error" if b == 4 else "ok"}, bound=64)
    assert found["batch"] is None and found["limited_by"] == "batch 4: error"


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
