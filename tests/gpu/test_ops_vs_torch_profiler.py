"""GPU acceptance of the operator table: on the eager GPT small bf16 train step
(naive attention, adamw_foreach: the ladder's bf16 rung), each of torch.profiler's top-10 ops
by self CUDA time gets the same GPU time per step, within 10%, from the op capture and
``python -m analysis ops``.

Both sides run here, one after the other, on the same GPU: the op capture exactly as rule
``profile_ops`` runs it (nsys with the pipeline's options, ``--op_ranges on``), then the same
workload under ``torch.profiler`` in a second process (5 warm-up steps, 10 profiled, each
step synchronized as the workload's loop does). Not part of the CPU suite (pyproject.toml:
``norecursedirs``). On a CUDA machine with nsys on PATH, from the repository root:

    python3 tests/gpu/test_ops_vs_torch_profiler.py      # no pytest needed
    python3 -m pytest tests/gpu                         # where pytest is installed

It prints the per-op comparison and, when ``$OUT`` is set, writes it to
``$OUT/ops_vs_torch_profiler.json``.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 0.10
TOP = 10
STEPS = 10
WORKLOAD = ["gpt", "--size", "small", "--mode", "train", "--dtype", "bf16", "--context", "512",
            "--batch", "4", "--vocab", "10000", "--attention", "naive", "--optimizer",
            "adamw_foreach", "--compile", "off", "--warmup", "5", "--steps", str(STEPS),
            "--device", "cuda", "--seed", "0"]
# rules/profile.smk (rule profile, and profile_ops through it) with the default config
NSYS_ARGS = ["profile", "--trace=cuda,nvtx", "--sample=none", "--cpuctxsw=none",
             "--cuda-graph-trace=node", "--capture-range=nvtx",
             "--nvtx-capture=profiled_region", "--capture-range-end=stop", "--stats=false",
             "--export=sqlite", "--force-overwrite=true"]
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                     "OPENBLAS_NUM_THREADS")}
# torch.profiler over the same workload: build_gpt with the CLI's settings, 5 warm-up steps,
# then 10 steps, each synchronized; self CUDA time and count per key.
PROFILER_SCRIPT = """
import json, sys, torch
from torch.profiler import ProfilerActivity, profile
from workloads.device import configure_precision
from workloads.models.builder import build_gpt
from workloads.steps import Speed
configure_precision("bf16")
w = build_gpt(size="small", context=512, batch=4, vocab=10000, mode="train", dtype="bf16",
              attention="naive", device=torch.device("cuda"), seed=0,
              speed=Speed(optimizer="adamw_foreach"))
for _ in range(5):
    w.step()
    torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(int(sys.argv[2])):
        w.step()
        torch.cuda.synchronize()
rows = {}
for e in prof.key_averages():
    self_us = getattr(e, "self_device_time_total", None)
    if self_us is None:
        self_us = e.self_cuda_time_total
    if e.key.startswith("aten::"):
        rows[e.key] = {"count": e.count, "self_device_us": self_us}
json.dump({"torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
"""


def _run(cmd: list[str], **kwargs) -> None:
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(cmd, cwd=REPO, env={**env, **kwargs.pop("env", {})},
                          capture_output=True, text=True, check=False, **kwargs)
    tail = f"{done.stdout[-2000:]}{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{' '.join(cmd[:4])} ...: {tail}"


def op_table(tmp: Path) -> dict[str, dict[str, str]]:
    """The op capture and its ops.csv, as the pipeline makes them."""
    nsys = shutil.which("nsys")
    assert nsys, "nsys is not on PATH (on the H100 host: source gpu-kit/setup.sh)"
    _run([nsys, *NSYS_ARGS, "-o", str(tmp / "ops"), sys.executable, "-m", "workloads",
          *WORKLOAD, "--op_ranges", "on", "--out", str(tmp / "ops_times.json")],
         env={"NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"})
    _run([sys.executable, "-m", "analysis", "ops", str(tmp / "ops.sqlite"), "-o",
          str(tmp / "stats"), "--times", str(tmp / "ops_times.json")])
    with open(tmp / "stats" / "ops.csv", newline="") as fh:
        return {row["Op"]: row for row in csv.DictReader(fh)}


def torch_profiler(tmp: Path) -> dict[str, dict[str, float]]:
    out = tmp / "torch_profiler.json"
    _run([sys.executable, "-c", PROFILER_SCRIPT, str(out), str(STEPS)])
    return json.loads(out.read_text())["rows"]


def compare(ours: dict[str, dict[str, str]],
            ref: dict[str, dict[str, float]]) -> list[dict[str, object]]:
    """torch.profiler's top ops: GPU ms per step on both sides, their ratio, calls per step."""
    top = sorted(ref, key=lambda k: -ref[k]["self_device_us"])[:TOP]
    rows = []
    for op in top:
        theirs = ref[op]["self_device_us"] / STEPS / 1e3
        mine = float(ours[op]["GPU ms/step"]) if op in ours else 0.0
        rows.append({"op": op, "ours_ms_per_step": mine, "torch_profiler_ms_per_step": theirs,
                     "ratio": mine / theirs if theirs else None,
                     "ours_calls_per_step": float(ours[op]["Calls/Step"]) if op in ours else 0,
                     "torch_profiler_calls_per_step": ref[op]["count"] / STEPS})
    return rows


def test_top_ops_gpu_time_matches_torch_profiler() -> None:
    import torch

    assert torch.cuda.is_available(), "this test needs a CUDA GPU"
    with tempfile.TemporaryDirectory() as tmp:
        rows = compare(op_table(Path(tmp)), torch_profiler(Path(tmp)))
    print(f"{'op':32s} {'ours ms':>9s} {'torch.profiler ms':>18s} {'ratio':>7s}")
    for r in rows:
        print(f"{r['op']:32s} {r['ours_ms_per_step']:9.3f} "
              f"{r['torch_profiler_ms_per_step']:18.3f} {r['ratio']:7.3f}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "ops_vs_torch_profiler.json").write_text(
            json.dumps(rows, indent=1) + "\n")
    off = [r for r in rows if r["ratio"] is None or abs(r["ratio"] - 1) > TOLERANCE]
    assert not off, f"ops off by more than {TOLERANCE:.0%}: {off}"


if __name__ == "__main__":
    test_top_ops_gpu_time_matches_torch_profiler()
    print("ok")
