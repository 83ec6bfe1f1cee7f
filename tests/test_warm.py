"""The warm parents (pipeline/warm.py) with real parents, real forks, real signals and a real
Snakemake run: repeats share no allocator, compile-cache or RNG state; the guard's timeout and
signal semantics hold through a parent; a dying guard or parent leaves no process behind;
without a usable parent, jobs start processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing import connection
from pathlib import Path

import pytest
from conftest import snakemake

from pipeline import warm
from workloads.proctree import alive

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
ONE_THREAD = {name: "1" for name in (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}
# The servers of the tests of their lifecycle (not of what they preload: the pipeline runs
# below, tests/test_warm_preload.py) preload what a tiny train step imports, not Inductor
# too: each start, and the first one's probe, cost two thirds of the whole list's.
LEAN = {warm.ENV_PRELOAD: "torch,workloads.__main__"}
TINY_TRAIN = ["gpt", "--size", "tiny", "--mode", "train", "--context", "32", "--batch", "2",
              "--device", "cpu"]
# Two runs x two repeats, timing only: enough to compare repeats of one run (different
# servers) and runs of one repeat index (the same server).
LEAK_CONFIG = """
results: results/leak
timing: {repeats: 2}
calibrate: false
defaults: {device: cpu, warmup: 1, steps: 3, seed: 0}
runs:
  gpt_tiny: {workload: gpt, size: tiny, mode: train, context: 32, batch: 2, profile: false}
  attn_math: {workload: attention_core, impl: sdpa, sdpa_backend: math, batch: 1, heads: 2,
              seq: 64, head_dim: 16, profile: false}
container: {variant: cpu}
"""
RUNS, REPEATS = ("gpt_tiny", "attn_math"), (0, 1)
LEAK_RESULTS: dict[str, Path] = {}  # launcher -> results folder of the leak config's run



def wait_gone(pid: int, seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def server_pids(logs: Path) -> set[int]:
    """The servers that wrote to these logs (`forkserver[PID]` on every line)."""
    pids = set()
    for log in logs.glob("forkserver.s*.log"):
        for line in log.read_text().splitlines():
            if "forkserver[" in line:
                pids.add(int(line.split("forkserver[", 1)[1].split("]", 1)[0]))
    return pids


# --- through the real pipeline (acceptance: repeats share no state) ---------------------------


def run_leak_config(tmp_path: Path, launcher: str) -> dict[tuple[str, int], dict]:
    """The timing records of the leak config's runs, by (run, repeat)."""
    workdir = tmp_path / launcher
    workdir.mkdir()
    config = workdir / "leak.yaml"
    config.write_text(LEAK_CONFIG)
    targets = [f"results/leak/{run}/timing/r{i}.json" for run in RUNS for i in REPEATS]
    snakemake(workdir, *targets, "--cores", "2", "--configfile", str(config),
              "--config", f"launcher={launcher}")
    records = {(run, i): json.loads((workdir / f"results/leak/{run}/timing/r{i}.json")
                                    .read_text()) for run in RUNS for i in REPEATS}
    LEAK_RESULTS[launcher] = workdir / "results/leak"
    for record in records.values():
        assert record["status"] == "ok", record["message"]
    if launcher == "fork":  # the parents exited with the invocation
        logs = workdir / "results/leak/logs"
        # what a child does inherit: the install's cache keys its parent computed (Triton's
        # own key only where Triton is installed: not on a CPU-only torch)
        for log in logs.glob("forkserver.s*.log"):
            assert all(f'"{key}": "computed"' in log.read_text() for key in warm.INSTALL_KEYS[:2])
        pids = server_pids(logs)
        assert len(pids) == len(REPEATS)
        assert all(wait_gone(pid) for pid in pids)
    return records


@pytest.fixture(scope="module")
def leak_records(tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[dict[tuple[str, int], dict], dict[tuple[str, int], dict]]:
    """(forked, process-launched) process sections of the same runs."""
    tmp = tmp_path_factory.mktemp("leak")
    with pytest.MonkeyPatch.context() as mp:
        # interpreters differ in their str hash seed, as on a plain machine
        mp.delenv("PYTHONHASHSEED", raising=False)
        return run_leak_config(tmp, "fork"), run_leak_config(tmp, "process")


def test_each_repeat_is_its_own_process_from_its_own_interpreter(leak_records) -> None:
    forked, started = leak_records
    fork = {key: r["process"] for key, r in forked.items()}
    assert {p["launcher"] for p in fork.values()} == {"fork"}
    assert {r["process"]["launcher"] for r in started.values()} == {"process"}
    assert len({p["pid"] for p in fork.values()}) == len(fork)
    # repeat i of every run comes from server i; the repeats of one run from different ones
    servers = {i: {fork[run, i]["parent_pid"] for run in RUNS} for i in REPEATS}
    assert all(len(pids) == 1 for pids in servers.values())
    assert servers[0] != servers[1]
    for run in RUNS:  # different interpreters: different str hash seeds, as for processes
        assert fork[run, 0]["str_hash"] != fork[run, 1]["str_hash"]
        assert started[run, 0]["process"]["str_hash"] != started[run, 1]["process"]["str_hash"]


@pytest.mark.parametrize("launcher", ["fork", "process"])
def test_nothing_compiled_or_allocated_before_the_workload(leak_records, launcher: str) -> None:
    records = leak_records[0 if launcher == "fork" else 1]
    for record in records.values():
        p = record["process"]
        assert p["cuda_initialized"] is False and p["cuda_memory"] is None
        assert p["inductor_code_cache_modules"] == 0
        assert p["dynamo_frame_counts"] == 0


def test_unseeded_generators_are_reseeded_and_seeded_ones_start_from_the_seed(
        leak_records) -> None:
    forked, started = leak_records
    fork = [r["process"] for r in forked.values()]
    ref = [r["process"] for r in started.values()]
    for key in ("python_random_draw", "numpy_random_draw"):
        # all distinct, also the two children of one server
        assert len({p[key] for p in fork}) == len(fork), key
    # torch's default generator starts as in a fresh interpreter of this torch: from the OS
    # (all different) or from its fixed seed (all the reference's)
    for key in ("torch_initial_seed", "torch_rng_digest"):
        ref_values = {p[key] for p in ref}
        fork_values = {p[key] for p in fork}
        if len(ref_values) == 1:
            assert fork_values == ref_values, key
        else:
            assert len(fork_values) == len(fork), key
    # after the GPT's torch.manual_seed, every repeat draws the same; attention_core draws its
    # inputs from a generator of its own and leaves the default one as it started
    draws = {forked["gpt_tiny", i]["process"]["torch_draw_after_build"] for i in REPEATS}
    draws |= {started["gpt_tiny", i]["process"]["torch_draw_after_build"] for i in REPEATS}
    assert len(draws) == 1
    unseeded = [r["attn_math", i]["process"]["torch_draw_after_build"]
                for r in (forked, started) for i in REPEATS]
    assert len(set(unseeded)) == (1 if len({p["torch_rng_digest"] for p in ref}) == 1 else 4)


def test_forked_run_computes_what_a_process_computes(leak_records) -> None:
    forked, started = leak_records
    for i in REPEATS:
        assert forked["gpt_tiny", i]["losses"] == started["gpt_tiny", i]["losses"]
        assert len(forked["gpt_tiny", i]["losses"]) == 3


def test_process_section_sees_what_a_compile_leaves(tmp_path: Path) -> None:
    """The zeros above are read, not assumed: after a Dynamo compile and an Inductor module,
    the same reader counts them."""
    script = (
        "import json, torch\n"
        "from torch._inductor.codecache import PyCodeCache\n"
        "from workloads import process_state\n"
        "torch.compile(lambda x: x + 1, backend='eager')(torch.ones(2))\n"
        "PyCodeCache.load('x = 1')\n"
        "print(json.dumps(process_state.at_start()))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([PY, "-c", script], capture_output=True, text=True, env=env,
                          cwd=REPO, check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout.splitlines()[-1])
    assert state["dynamo_frame_counts"] > 0
    assert state["inductor_code_cache_modules"] > 0
    assert state["launcher"] == "process"


def test_overhead_benchmark_reads_every_timing_job(leak_records) -> None:
    """benchmarks/job_overhead.py on the two runs: a row per job with its wall time from
    Snakemake's benchmark file, the work from the job's record, the launcher that ran it."""
    job_overhead = load_benchmark()
    medians = {}
    for launcher, results in LEAK_RESULTS.items():
        jobs = job_overhead.read_jobs(results)
        assert sorted(j["job"] for j in jobs) == sorted(f"{r}.r{i}" for r in RUNS for i in REPEATS)
        for job in jobs:
            assert job["kind"] == "timing" and job["launcher"] == launcher
            assert job["overhead_s"] == pytest.approx(job["wall_s"] - job["work_s"], abs=1e-3)
            assert job["work_s"] == pytest.approx(job["warmup_s"] + job["steps_s"], abs=1e-3)
            # where its seconds went: the guard's and the process's timelines, in order
            parts = job["parts_s"]
            # (the process's start comes from /proc in 10 ms ticks)
            assert all(parts[p] >= -0.05 for p in job_overhead.PARTS), parts
            assert sum(parts.values()) == pytest.approx(job["wall_s"], abs=0.01)
            # the marks enclose the warm-up and the measured steps
            assert job["work_s"] - 0.02 <= parts["warmup_steps"] <= job["work_s"] + 1.0, parts
            # untraced, entering and leaving the measured region costs nothing
            assert 0 <= parts["region"] < 0.05, parts
        assert job_overhead.overhead_stats(jobs)["timing"]["jobs"] == len(jobs)
        medians[launcher] = job_overhead.parts_stats(jobs)["timing"]
        assert medians[launcher]["jobs"] == len(jobs)
        assert job_overhead.process_checks(results, launcher) == []
        assert set(job_overhead.run_spreads(results)) == set(RUNS)
    # a new interpreter imports torch before main(); a fork of a server that did does not
    assert medians["process"]["imports"] > 10 * medians["fork"]["imports"], medians
    # the other launcher's records fail the check
    assert job_overhead.process_checks(LEAK_RESULTS["fork"], "process")


def test_a_pid_is_shared_only_by_processes_alive_together() -> None:
    """A results folder resumed over several bare machines (all named `vm`) reuses pids: only
    two records whose processes lived at the same time on one host are one process twice."""
    job_overhead = load_benchmark()

    def record(pid: int, start: float, end: float, host: str = "vm") -> dict:
        return {"process": {"pid": pid, "timeline_unix": {"started": start, "written": end}},
                "provenance": {"hostname": host}}

    calls = {Path("a"): record(2106, 100.0, 110.0), Path("b"): record(2106, 1000.0, 1003.0),
             Path("c"): record(2107, 105.0, 108.0)}
    assert job_overhead.shared_pids(calls) == []
    both = {**calls, Path("d"): record(2106, 109.0, 120.0)}
    assert job_overhead.shared_pids(both) == [(Path("a"), Path("d"))]
    elsewhere = {**calls, Path("e"): record(2106, 101.0, 102.0, host="node7")}
    assert job_overhead.shared_pids(elsewhere) == []


def test_projection_adds_up_per_job_costs() -> None:
    job_overhead = load_benchmark()
    costs = job_overhead.Costs(timing_overhead_s=1.0, compiled_timing_overhead_s=3.0,
                               capture_overhead_s=10.0, calibrate_s=5.0, gap_s=0.5,
                               compile_s=20.0, trace_slowdown=2.0,
                               compile_s_by_workload={"attention_core": 2.0})
    runs = {
        "eager": {"workload": "gpt", "warmup": 2, "steps": 10, "profile": True},
        "compiled": {"workload": "gpt", "warmup": 4, "steps": 10, "profile": False,
                     "compile": "default"},
        "cell": {"workload": "attention_core", "warmup": 4, "steps": 10, "profile": False,
                 "compile": "default"},
        # flash in fp32: an `unsupported` row, one process (the guard skips the others)
        "flash_fp32": {"workload": "attention_core", "impl": "sdpa", "sdpa_backend": "flash",
                       "dtype": "fp32", "warmup": 4, "steps": 10, "profile": False,
                       "compile": "default"},
    }
    out = job_overhead.project_wall_time(runs, repeats=3, calibrate=True, costs=costs,
                                         step_ms=lambda name, _: 100.0)
    eager = 3 * (1.0 + 0.2 + 1.0) + (10.0 + 0.2 + 2.0)  # 3 timing processes + 1 capture
    compiled = 3 * (3.0 + 0.4 + 20.0 + 1.0)  # a GPT: no measured compile of its own
    cell = 3 * (3.0 + 0.4 + 2.0 + 1.0)  # an attention cell: its workload's compile
    flash_fp32 = 3.0  # its one process's overhead
    # one timing job per run (its repeats one after another), one per capture
    gaps = (2 + 1 + 1 + 1) * 0.5
    assert out["gpu_jobs"] == 1 + 2 + 1 + 1 + 1
    assert out["gpu_processes"] == 1 + 4 + 3 + 3 + 1
    assert out["runs_unsupported"] == 1
    assert out["seconds"] == round(5.0 + 0.5 + eager + compiled + cell + flash_fp32 + gaps)


def test_compile_costs_are_read_and_projected_per_compile_class() -> None:
    """A GPT's compile costs depend on its mode and block compilation (a regional forward
    compiles a fraction of a train step compiled once): Costs keeps them per compile class,
    and a run takes its class's, else its workload's, else every compile's."""
    job_overhead = load_benchmark()

    def job(run: str, compile_s: float, **params: str) -> dict:
        record = {"status": "ok", "workload": params.pop("workload", "gpt"), "compile_s": compile_s,
                  "params": {"compile": "default", **params},
                  "warmup_times_ms": [compile_s * 1e3], "step_times_ms": [1.0]}
        return job_overhead.job_row("timing", run, run, compile_s + 1.0, record)

    jobs = [job("a", 30.0, mode="train", compile_blocks="once"),  # cold, then from the cache
            job("a", 6.0, mode="train", compile_blocks="once"),
            job("b", 8.0, mode="forward", compile_blocks="regional"),
            job("b", 1.0, mode="forward", compile_blocks="regional"),
            job("c", 2.0, workload="attention_core", mode="forward")]
    assert jobs[0]["compile_class"] == "gpt train once"
    assert jobs[4]["compile_class"] == "attention_core"
    side = {"wall_s": float("nan"), "jobs": jobs}
    costs = job_overhead.Costs.from_results([{"sides": {"fork": side}}])
    train_once = {"workload": "gpt", "mode": "train", "compile_blocks": "once"}
    fwd_regional = {"workload": "gpt", "mode": "forward", "compile_blocks": "regional"}
    unmeasured = {"workload": "gpt", "mode": "forward_backward", "compile_blocks": "each"}
    assert (costs.cold_compile_for(train_once), costs.compile_for(train_once)) == (30.0, 6.0)
    assert (costs.cold_compile_for(fwd_regional), costs.compile_for(fwd_regional)) == (8.0, 1.0)
    # no forward_backward measured: the GPT's over both classes (runs a and b)
    assert costs.compile_for(unmeasured) == 3.5
    assert costs.cold_compile_for(unmeasured) == 19.0
    # nothing of its workload: every warm compile (a and b from the cache, c alone)
    assert costs.compile_for({"workload": "sleep"}) == costs.compile_s == 3.0


def load_benchmark():  # noqa: ANN201 - a module loaded from a path
    import importlib.util

    spec = importlib.util.spec_from_file_location("job_overhead",
                                                  REPO / "benchmarks" / "job_overhead.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# --- the guard through a server ----------------------------------------------------------------


def owned_env(owner: int, logs: Path) -> dict[str, str]:
    """The environment the pipeline gives its jobs, naming warm parents that live as long as
    `owner` (the first guard of a slot starts its parent)."""
    return {**os.environ, **ONE_THREAD, **LEAN, "PYTHONPATH": str(REPO),
            warm.ENV_NAME: warm.new_name(owner), warm.ENV_LOGS: str(logs)}


@pytest.fixture(scope="module")
def server_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Slot 0's parent for the module's tests; it exits once its owner is gone."""
    logs = tmp_path_factory.mktemp("warm-logs")
    owner = subprocess.Popen(["sleep", "3600"])
    yield owned_env(owner.pid, logs)
    owner.kill()
    owner.wait()
    assert all(wait_gone(pid) for pid in server_pids(logs))


def guard_cmd(out: Path, workload: list[str], *opts: str) -> list[str]:
    return [PY, "-m", "pipeline.guard", "--out", str(out), "--fork", *opts, "--",
            PY, "-m", "workloads", *workload, "--out", str(out)]


def run_guard(env: dict[str, str], out: Path, workload: list[str], *opts: str,
              timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(guard_cmd(out, workload, *opts), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def forked_pid(stderr: str) -> int:
    for line in stderr.splitlines():
        if line.startswith("guard: forked by fork server"):
            return int(line.rsplit("pid ", 1)[1].rstrip(")"))
    raise AssertionError(f"not forked:\n{stderr}")


def ready_server(env: dict[str, str], tmp_path: Path) -> int:
    """Slot 0's server pid, once it serves (a short run through it)."""
    out = tmp_path / "warm.json"
    done = run_guard(env, out, [*TINY_TRAIN, "--warmup", "0", "--steps", "1"])
    assert done.returncode == 0, done.stderr
    forked_pid(done.stderr)
    return json.loads(out.read_text())["process"]["parent_pid"]


def endless(seconds: int = 600) -> list[str]:
    """A real workload that runs far longer than any test waits."""
    return [*TINY_TRAIN, "--warmup", "0", "--steps", str(seconds * 1000)]


def test_forked_run_that_hangs_is_killed_and_is_a_timeout(server_env, tmp_path: Path) -> None:
    ready_server(server_env, tmp_path)
    out = tmp_path / "r.json"
    start = time.monotonic()
    done = run_guard(server_env, out, endless(), "--timeout-s", "3", "--grace-s", "2")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 60
    pid = forked_pid(done.stderr)
    result = json.loads(out.read_text())
    assert result["status"] == "timeout"
    assert result["message"] == "exceeded timeout_min=0.05 (3 s)"
    assert result["process"]["launcher"] == "fork"  # its own record, written on SIGTERM
    assert not alive(pid)


def guard_of_endless_child(out: Path, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """A guard whose forked child runs until stopped, and the child's pid once it runs."""
    guard = subprocess.Popen(guard_cmd(out, endless()), cwd=REPO, env=env,
                             stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert guard.stderr is not None
    return guard, forked_pid(guard.stderr.readline())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_guard_stops_the_forked_child(server_env, tmp_path: Path, signum: int) -> None:
    server = ready_server(server_env, tmp_path)
    out = tmp_path / "r.json"
    guard, pid = guard_of_endless_child(out, server_env)
    time.sleep(0.5)
    guard.send_signal(signum)
    guard.stderr.read()
    assert guard.wait(timeout=60) == 128 + signum
    assert not out.exists(), "an interrupted run has no result"
    assert wait_gone(pid)
    assert alive(server)  # the server serves on


def test_guard_that_dies_takes_its_forked_child_along(server_env, tmp_path: Path) -> None:
    """SIGKILL leaves the guard no time to forward anything: the server sees its connection
    end and kills the child's group."""
    ready_server(server_env, tmp_path)
    guard, pid = guard_of_endless_child(tmp_path / "r.json", server_env)
    guard.kill()
    guard.wait()
    assert wait_gone(pid)


def test_parent_that_dies_takes_its_child_along(server_env, tmp_path: Path) -> None:
    """Killed while its child runs, the parent can report no exit status: the guard stops the
    child's group and the run is an error saying why."""
    server = ready_server(server_env, tmp_path)
    out = tmp_path / "r.json"
    guard, pid = guard_of_endless_child(out, server_env)
    os.kill(server, signal.SIGKILL)
    guard.stderr.read()
    assert guard.wait(timeout=60) == 0
    assert wait_gone(pid)
    result = json.loads(out.read_text())
    assert result["status"] == "error" and "warm parent went away" in result["message"]


def test_job_whose_environment_differs_gets_a_process(server_env, tmp_path: Path) -> None:
    ready_server(server_env, tmp_path)
    out = tmp_path / "r.json"
    env = {**server_env, "OMP_NUM_THREADS": "2"}
    done = run_guard(env, out, [*TINY_TRAIN, "--warmup", "0", "--steps", "1"])
    assert done.returncode == 0, done.stderr
    assert ("guard: not forked (fork server 0 refused: the job's environment differs from the "
            "server's in OMP_NUM_THREADS); starting a process") in done.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "ok" and result["process"]["launcher"] == "process"


def test_bad_request_is_dropped_and_the_server_serves_on(server_env, tmp_path: Path) -> None:
    server = ready_server(server_env, tmp_path)
    with connection.Client(warm.address(server_env[warm.ENV_NAME], 0), family="AF_UNIX") as conn:
        conn.send({"argv": []})  # no environment, no folder
        for _ in range(2):
            connection.reduction.send_handle(conn, 0, server)
        with pytest.raises(EOFError):
            conn.recv()
    assert ready_server(server_env, tmp_path) == server


def test_memory_limited_run_gets_a_process(server_env, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = run_guard(server_env, out, [*TINY_TRAIN, "--warmup", "0", "--steps", "1",
                                       "--memory_limit_mb", "4000"])
    assert done.returncode == 0, done.stderr
    assert "--memory_limit_mb caps the address space" in done.stderr
    assert json.loads(out.read_text())["process"]["launcher"] == "process"


def test_server_that_dies_before_answering_means_a_process(tmp_path: Path) -> None:
    """Something holds the slot's address but closes every connection (a server that
    crashed while starting): the run starts as a process."""
    name = warm.new_name(os.getpid())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(warm.address(name, 0))
    listener.listen()

    def close_each() -> None:
        for _ in range(4):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(REPO), warm.ENV_NAME: name}
    out = tmp_path / "r.json"
    try:
        done = run_guard(env, out, [*TINY_TRAIN, "--warmup", "0", "--steps", "1"])
    finally:
        listener.close()
    assert done.returncode == 0, done.stderr
    assert ("guard: not forked (fork server 0 closed the connection before forking); "
            "starting a process") in done.stderr
    assert json.loads(out.read_text())["process"]["launcher"] == "process"


def test_killed_server_is_replaced_and_one_without_owner_exits(tmp_path: Path) -> None:
    """A server whose process died: the next job starts a new one. A server whose owner
    (the Snakemake process) is gone exits by itself."""
    owner = subprocess.Popen(["sleep", "600"])
    env = owned_env(owner.pid, tmp_path)
    try:
        first = ready_server(env, tmp_path)
        os.kill(first, signal.SIGKILL)
        assert wait_gone(first)
        second = ready_server(env, tmp_path)
        assert second != first
    finally:
        owner.kill()
        owner.wait()
    assert wait_gone(second, seconds=30)
    assert "owner" in (tmp_path / "forkserver.s0.log").read_text()


def test_only_workload_commands_of_this_interpreter_are_forked() -> None:
    assert warm.workload_argv([PY, "-m", "workloads", "gpt"]) == ["gpt"]
    for cmd, why in [
        (["env", "nsys", "profile", PY, "-m", "workloads", "gpt"], "not `python -m workloads"),
        ([PY, "-m", "analysis", "x"], "not `python -m workloads"),
        (["/no/such/python", "-m", "workloads", "gpt"], "is not the guard's interpreter"),
        ([PY, "-m", "workloads", "gpt", "--memory-limit-mb=100"], "caps the address space"),
    ]:
        with pytest.raises(warm.Unavailable, match=why):
            warm.workload_argv(cmd)
