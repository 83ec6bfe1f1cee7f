"""Launching distributed runs (pipeline/launch.py), the guard stopping a whole rank tree, the
config keys of distributed runs, and the GPU side of the per-rank timeline on a real H100
export. Fast: real processes and real torchrun, no pipeline."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.metrics.ranks import nccl_op, rank_timeline, step_breakdown
from analysis.reading import Export
from pipeline import config as cfg
from pipeline.launch import merge_rank_failures
from workloads.proctree import alive

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
H100_EXPORT = REPO / "tests/fixtures/h100/gpt_small_train_bf16_ctx512.sqlite"



def wait_for_files(paths: list[Path], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text() for p in paths):
        assert time.monotonic() < deadline, f"never written: {paths}"
        time.sleep(0.2)


def test_guard_timeout_stops_processes_in_sessions_of_their_own(tmp_path: Path) -> None:
    # as torchrun does: the command starts a child in a new session, outside its group
    pid_file = tmp_path / "pid"
    code = ("import subprocess, sys, time; "
            "p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(300)")
    out = tmp_path / "r.json"
    subprocess.run([PY, "-m", "pipeline.guard", "--out", str(out), "--timeout-s", "3",
                    "--grace-s", "1", "--", PY, "-c", code], cwd=REPO, check=True, timeout=60)
    assert json.loads(out.read_text())["status"] == "timeout"
    assert not alive(int(pid_file.read_text()))


def test_guard_timeout_stops_every_torchrun_rank(tmp_path: Path) -> None:
    # two ranks that hang (as in a collective that never completes); torchrun itself is killed
    code = ("import os, pathlib, time; "
            f"pathlib.Path({str(tmp_path)!r}, 'rank' + os.environ['RANK']).write_text("
            "str(os.getpid())); time.sleep(300)")
    out = tmp_path / "r.json"
    proc = subprocess.Popen(
        [PY, "-m", "pipeline.guard", "--out", str(out), "--timeout-s", "20", "--grace-s", "1",
         "--", PY, "-m", "pipeline.launch", "--ranks", "2", "--device", "cpu", "--out",
         str(out), "--", PY, "-c", code], cwd=REPO)
    pids = [tmp_path / "rank0", tmp_path / "rank1"]
    wait_for_files(pids)
    assert proc.wait(timeout=90) == 0
    assert json.loads(out.read_text())["status"] == "timeout"
    for path in pids:
        assert not alive(int(path.read_text())), path.name


def test_more_ranks_than_cores_is_unsupported_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = subprocess.run([PY, "-m", "pipeline.launch", "--ranks", "4096", "--device", "cpu",
                           "--out", str(out), "--", "false"], cwd=REPO, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 4
    record = json.loads(out.read_text())
    assert record["status"] == "unsupported" and "4096 gloo ranks" in record["message"]


def test_a_rank_that_failed_on_its_own_gives_the_run_its_status(tmp_path: Path) -> None:
    out = tmp_path / "times.json"
    out.write_text(json.dumps({"status": "error", "params": {"size": "tiny"},
                               "message": "Terminated: terminated by signal SIGTERM"}))
    (tmp_path / "times.json.rank1").write_text(json.dumps(
        {"status": "oom", "message": "CUDA out of memory. Tried to allocate 2.00 GiB"}))
    merged = merge_rank_failures(out)
    assert merged["status"] == "oom" and merged["message"].startswith("rank 1: CUDA out of")
    assert merged["params"] == {"size": "tiny"}  # rank 0's record, with the rank's status
    assert json.loads(out.read_text()) == merged
    assert not (tmp_path / "times.json.rank1").exists()


def test_rank_zero_failing_on_its_own_keeps_its_status(tmp_path: Path) -> None:
    out = tmp_path / "times.json"
    out.write_text(json.dumps({"status": "unsupported", "message": "no cudnn"}))
    (tmp_path / "times.json.rank1").write_text(json.dumps({"status": "error", "message": "x"}))
    assert merge_rank_failures(out)["status"] == "unsupported"


def test_a_failed_rank_names_its_own_error_not_torchrun_report(tmp_path: Path) -> None:
    # rank 0 dies with a traceback of its own and no record; torchrun's closing report (about
    # 20 lines) follows it, and the message still shows the error and which rank failed
    code = ("import os, sys, time\n"
            "if os.environ['RANK'] == '0':\n"
            "    raise RuntimeError('pair.cc: Connection closed by peer')\n"
            "time.sleep(60)")
    out = tmp_path / "r.json"
    subprocess.run([PY, "-m", "pipeline.guard", "--out", str(out), "--timeout-s", "90", "--",
                    PY, "-m", "pipeline.launch", "--ranks", "2", "--device", "cpu", "--out",
                    str(out), "--", PY, "-c", code], cwd=REPO, check=True, timeout=120,
                   capture_output=True)
    record = json.loads(out.read_text())
    assert record["status"] == "error"
    lines = record["message"].splitlines()
    assert "RuntimeError: pair.cc: Connection closed by peer" in lines
    assert lines[-1] == "torchrun: rank 0 failed first (exit code 1)"
    assert not any("Root Cause" in line or "FAILED" in line for line in lines)


def test_a_rank_whose_peer_already_left_still_leaves_the_group(tmp_path: Path) -> None:
    # rank 1 exits without leaving the group; rank 0's barrier then fails (connection closed),
    # after its record is written: a warning, and rank 0 still exits 0
    code = ("import argparse, os, time, torch, torch.distributed as dist\n"
            "from workloads.parallel import DistributedRun\n"
            "dist.init_process_group('gloo')\n"
            "rank = dist.get_rank()\n"
            "dist.barrier()  # both ends of the mesh connected before rank 1 leaves\n"
            "run = DistributedRun(argparse.Namespace(parallel='ddp'), torch.device('cpu'), rank,"
            " rank, 2, 'gloo')\n"
            "if rank == 1:\n"
            "    os._exit(0)\n"
            "time.sleep(1)\n"
            "run.close()\n"
            "print('rank 0 left the group')\n")
    done = subprocess.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           "2", "--no-python", PY, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0 left the group" in done.stdout
    assert "warning: leaving the process group" in done.stderr


def test_gpus_need_a_parallel_mode() -> None:
    base = {"runs": {"a": {"workload": "gpt", "size": "tiny", "mode": "train", "gpus": 2}}}
    with pytest.raises(cfg.ConfigError, match="gpus > 1 needs parallel"):
        cfg.resolve(json.loads(json.dumps(base)))
    base["runs"]["a"]["parallel"] = "fsdp"
    base["runs"]["b"] = {"workload": "gpt", "size": "tiny", "mode": "train"}
    plan = cfg.resolve(base)
    assert plan.distributed == {"a": 2}
    assert "--parallel fsdp" in plan.workload_args("a") and "--gpus 2" in plan.workload_args("a")


def test_nccl_kernel_names_give_their_collective() -> None:
    assert nccl_op("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096UL>)") \
        == "all_reduce"
    assert nccl_op("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)") == "all_gather"
    assert nccl_op("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "reduce_scatter"
    assert nccl_op("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096UL>)") == "send_recv"


def test_gpu_timeline_compute_is_the_union_of_gpu_work_per_step() -> None:
    # one H100 rank without communication: compute = union of kernels, memcpys and memsets
    # inside each profiled_step window, recomputed here with SQL and a sweep
    with Export(H100_EXPORT) as ex:
        tl = rank_timeline(ex)
    rows = step_breakdown(tl)
    assert tl.source == "kernels" and len(rows) == 10  # the capture's measured steps
    con = sqlite3.connect(f"file:{H100_EXPORT}?mode=ro", uri=True)
    ops = con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
                      "SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL "
                      "SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchall()
    con.close()
    for row in rows:
        lo, hi = row["start_ns"], row["end_ns"]
        busy, reach = 0, lo
        for start, end in sorted((max(s, lo), min(e, hi)) for s, e in ops):
            if end <= start:
                continue
            if end > reach:
                busy += end - max(start, reach)
                reach = end
        assert row["compute_ms"] == pytest.approx(busy / 1e6, abs=1e-6)
        assert row["comm_ms"] == 0 and row["exposed_comm_ms"] == 0 and row["overlap"] is None
        assert row["idle_ms"] == pytest.approx(row["step_ms"] - busy / 1e6, abs=1e-6)
