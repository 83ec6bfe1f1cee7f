"""A fork server preloads only what leaves it forkable: a module whose import starts a thread
(on the H100 host, an import initialized the CUDA driver, whose thread a fork would not copy)
is found in a forked child, left out with everything after it, and named in the log; the
server still forks every job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_forkserver import ONE_THREAD, PY, REPO, TINY_TRAIN, forked_pid, run_guard, wait_gone

from pipeline import forkserver

# A module that starts a thread when imported, as a library that initializes a driver does.
THREAD_STARTER = """
import threading, time
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
"""


def modules_dir(tmp_path: Path) -> Path:
    (tmp_path / "threadstarter.py").write_text(THREAD_STARTER)
    return tmp_path


def test_the_first_module_that_starts_a_thread_is_found_in_a_child(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{modules_dir(tmp_path)}"}

    def probe(modules: tuple[str, ...]) -> list:
        code = ("import json, sys; from pipeline import forkserver as f; "
                f"bad, why = f.first_threading_module({modules!r}); "
                "print(json.dumps([bad, why, 'threadstarter' in sys.modules]))")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, check=True)
        return json.loads(done.stdout)

    bad, why, imported_here = probe(("json", "csv", "threadstarter", "base64"))
    assert bad == 2 and why.startswith("2 threads in the server")
    assert imported_here is False  # only the child imported it
    assert probe(("json", "csv", "base64")) == [None, None, False]


def test_server_preloads_the_clean_prefix_and_forks(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    name = forkserver.new_name(os.getpid())
    env = {**os.environ, **ONE_THREAD,
           "PYTHONPATH": f"{REPO}{os.pathsep}{modules_dir(tmp_path)}",
           forkserver.ENV_NAME: name, forkserver.ENV_OWNER: str(os.getpid()),
           forkserver.ENV_LOGS: str(logs),
           forkserver.ENV_PRELOAD: "json,threadstarter,workloads.__main__"}
    out = tmp_path / "r.json"
    try:
        done = run_guard(env, out, [*TINY_TRAIN, "--warmup", "0", "--steps", "1"])
        assert done.returncode == 0, done.stderr
        forked_pid(done.stderr)  # forked, not a process
        record = json.loads(out.read_text())
        assert record["status"] == "ok" and record["process"]["launcher"] == "fork"
    finally:
        forkserver.stop(name, [0])
    log = (logs / "forkserver.s0.log").read_text()
    assert "importing threadstarter leaves a thread" in log
    assert '"workloads.__main__": "not preloaded: after threadstarter"' in log
    assert "refusing" not in log
    pid = record["process"]["parent_pid"]
    assert wait_gone(pid)
    assert PY  # the interpreter the guard and the server ran


def test_servers_of_one_invocation_probe_once(tmp_path: Path) -> None:
    """The first server writes its verdict into the log folder; the next ones read it (for
    the same interpreter, preload list and environment) instead of importing everything a
    second time."""
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{modules_dir(tmp_path)}",
           forkserver.ENV_LOGS: str(logs)}
    code = ("import json; from pipeline import forkserver as f; "
            "print(json.dumps(f.known_threading_module(('json', 'threadstarter'))))")

    def verdict() -> list:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, check=True)
        return json.loads(done.stdout)

    assert verdict()[0] == 1
    saved = logs / forkserver.PRELOAD_VERDICT
    record = json.loads(saved.read_text())
    record["why"] = "read back"  # what a second probe could not say
    saved.write_text(json.dumps(record))
    assert verdict() == [1, "read back"]
    env["TORCH_SOMETHING"] = "1"  # another import-time environment: probed again
    assert verdict()[1].startswith("2 threads in the server")


# A module that asks whether CUDA is available at import, as Inductor's benchmarking module
# does (torch 2.11), keeping the answer.
ASKS_CUDA = """
import torch
AVAILABLE = torch.cuda.is_available()
"""


def test_an_import_time_cuda_check_is_answered_by_a_child(tmp_path: Path) -> None:
    """Asked in the server, the check would start a thread (NVML's, or the CUDA driver's):
    here a stand-in that starts one and says True. The server asks a forked child instead, so
    the module that asks is preloaded, gets the child's answer, and leaves one thread; the
    real function is back afterwards, for the jobs."""
    (tmp_path / "asks_cuda.py").write_text(ASKS_CUDA)
    code = """
import json, os, threading, time, torch
from pipeline import forkserver as f

def real_check():  # as NVML's init does: a thread of its own, then the answer
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    return True

torch.cuda.is_available = real_check
os.environ[f.ENV_PRELOAD] = "torch,asks_cuda"
times = f.preload()
import asks_cuda
print(json.dumps({"times": times, "answer": asks_cuda.AVAILABLE,
                  "threads": len(os.listdir("/proc/self/task")),
                  "restored": torch.cuda.is_available is real_check}))
"""
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    env.pop(forkserver.ENV_LOGS, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True)
    found = json.loads(done.stdout)
    assert isinstance(found["times"]["asks_cuda"], float), found["times"]  # preloaded
    assert forkserver.CUDA_CHECK in found["times"]
    assert found["answer"] is True  # what the real check says, asked in a child
    assert found["threads"] == 1
    assert found["restored"] is True
