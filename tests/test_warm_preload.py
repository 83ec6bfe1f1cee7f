"""A warm parent forks only when a fork is a clean new process: a preloaded module that starts
a thread (as a library that initializes the CUDA driver does) makes it refuse, naming the
module's thread in its log, and the jobs start processes. Inductor's import-time
torch.cuda.is_available() is answered by a forked child, so preloading Inductor leaves one
thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_warm import ONE_THREAD, REPO, TINY_TRAIN, owned_env, run_guard, server_pids, wait_gone

from pipeline import warm

# A module that starts a thread when imported, as a library that initializes a driver does.
THREAD_STARTER = """
import threading, time
threading.Thread(target=time.sleep, args=(3600,), daemon=True, name="driver").start()
"""


def test_a_parent_whose_preload_starts_a_thread_refuses(tmp_path: Path) -> None:
    (tmp_path / "threadstarter.py").write_text(THREAD_STARTER)
    logs = tmp_path / "logs"
    owner = subprocess.Popen(["sleep", "600"])
    env = {**owned_env(owner.pid, logs), "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}",
           warm.ENV_PRELOAD: "torch,threadstarter,workloads.__main__"}
    out = tmp_path / "r.json"
    try:
        done = run_guard(env, out, [*TINY_TRAIN, "--warmup", "0", "--steps", "1"])
        assert done.returncode == 0, done.stderr
        assert "guard: not forked (fork server 0 refused: 2 threads after preloading" \
            in done.stderr, done.stderr
        record = json.loads(out.read_text())
        assert record["status"] == "ok" and record["process"]["launcher"] == "process"
    finally:
        owner.kill()
        owner.wait()
    log = (logs / "forkserver.s0.log").read_text()
    assert "refusing every request: 2 threads after preloading" in log and "driver" in log
    assert all(wait_gone(pid) for pid in server_pids(logs))


# A module that asks whether CUDA is available at import, as Inductor's benchmarking module
# does (torch 2.11), keeping the answer.
ASKS_CUDA = """
import torch
AVAILABLE = torch.cuda.is_available()
"""


def test_an_import_time_cuda_check_is_answered_by_a_child(tmp_path: Path) -> None:
    """Asked in the parent, the check would start a thread (NVML's, or the CUDA driver's):
    here a stand-in that starts one and says True. A forked child answers instead, so the
    module that asks is preloaded, gets the child's answer, and leaves one thread; the real
    function is back afterwards, for the jobs."""
    (tmp_path / "asks_cuda.py").write_text(ASKS_CUDA)
    code = """
import json, os, threading, time, torch
from pipeline import warm

def real_check():  # as NVML's init does: a thread of its own, then the answer
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    return True

torch.cuda.is_available = real_check
times = warm.preload(("torch", "asks_cuda"))
import asks_cuda
print(json.dumps({"times": times, "answer": asks_cuda.AVAILABLE, "unforkable": warm.unforkable(),
                  "restored": torch.cuda.is_available is real_check}))
"""
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True)
    found = json.loads(done.stdout)
    assert isinstance(found["times"]["asks_cuda"], float), found["times"]  # preloaded
    assert found["answer"] is True  # what the real check says, asked in a child
    assert found["unforkable"] is None  # one thread, no CUDA
    assert found["restored"] is True
