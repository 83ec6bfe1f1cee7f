"""Profiler overhead: the same workload untraced and under several nsys capture settings.

Each configuration runs as its own process of ``python -m workloads ...`` (same warm-up and
steps as the pipeline); the step time is the workload's own median (CUDA events on a GPU),
so the nsys import and export never count. The traced process is the pipeline's capture
(``PROFBENCH_CAPTURE=1``: a ``model`` workload opens its module ranges). Overhead = traced /
untraced - 1, with the untraced time taken as the median of ``--repeats`` untraced processes
run interleaved with the traced ones (so drift in clocks or temperature hits both sides).

    python benchmarks/profiler_overhead.py --nsys nsys -- gpt --size small --mode train --dtype bf16
    python benchmarks/profiler_overhead.py --nsys nsys --settings default,lean -- gpt --size tiny
    python benchmarks/profiler_overhead.py --nsys nsys --settings default -- model \
        --factory workloads.models.cs336_lm:make --device cpu --batch 2 --steps 5 --kwargs \
        '{"d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "vocab_size": 128,
          "context_length": 32, "checkpoint": "reentrant"}'

Prints one table: setting, nsys flags, median step ms, overhead vs untraced.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = "--capture-range=nvtx --nvtx-capture=profiled_region --capture-range-end=stop"
# name -> nsys profile flags (the capture range is added to each)
SETTINGS = {
    "full": "--trace=cuda,nvtx,osrt",
    "osrt": "--trace=cuda,nvtx,osrt --sample=none --cpuctxsw=none",
    "lean": "--trace=cuda,nvtx --sample=none --cpuctxsw=none",
    # the pipeline's capture (rules/profile.smk with config nsys.trace: cuda,nvtx)
    "default": "--trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node",
    "cuda_only": "--trace=cuda --sample=none --cpuctxsw=none",
}


def median_step_ms(out: Path) -> float:
    record = json.loads(out.read_text())
    if record.get("status", "ok") != "ok":
        raise RuntimeError(f"{out}: status {record['status']}: {record.get('message')}")
    steps = record.get("step_ms") or record["step_times_ms"]
    return statistics.median(steps)


def run_untraced(workload: list[str], tmp: Path, i: int) -> float:
    out = tmp / f"untraced{i}.json"
    subprocess.run([sys.executable, "-m", "workloads", *workload, "--out", str(out)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return median_step_ms(out)


def run_traced(nsys: str, flags: str, workload: list[str], tmp: Path, name: str) -> float:
    out = tmp / f"{name}.json"
    cmd = [nsys, "profile", *flags.split(), *CAPTURE.split(), "--export=none",
           "--force-overwrite=true", "-o", str(tmp / name),
           sys.executable, "-m", "workloads", *workload, "--out", str(out)]
    # as rules/profile.smk runs a capture: a model workload adds its module ranges
    env = {**os.environ, "NSYS_NVTX_PROFILER_REGISTER_ONLY": "0", "PROFBENCH_CAPTURE": "1"}
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=env)
    return median_step_ms(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nsys", default="nsys")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--repeats", type=int, default=3, help="untraced processes")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("workload", nargs=argparse.REMAINDER, help="-- python -m workloads args")
    args = parser.parse_args(argv)
    workload = [a for a in args.workload if a != "--"]
    names = args.settings.split(",")
    rows, untraced = [], []
    with tempfile.TemporaryDirectory(dir=ROOT / ".cache" if (ROOT / ".cache").is_dir() else None
                                     ) as d:
        tmp = Path(d)
        for i, name in enumerate(names):
            untraced.append(run_untraced(workload, tmp, i))
            rows.append((name, SETTINGS[name], run_traced(args.nsys, SETTINGS[name], workload,
                                                          tmp, name)))
        for i in range(len(names), args.repeats):
            untraced.append(run_untraced(workload, tmp, i))
    base = statistics.median(untraced)
    print(f"workload: {' '.join(workload)}")
    print(f"untraced: {base:.2f} ms (median of {len(untraced)} processes: "
          f"{', '.join(f'{u:.2f}' for u in untraced)})")
    print(f"{'setting':<12} {'step ms':>9} {'overhead':>9}  nsys flags")
    result = []
    for name, flags, ms in rows:
        print(f"{name:<12} {ms:9.2f} {ms / base - 1:9.1%}  {flags}")
        result.append({"setting": name, "flags": flags, "step_ms": ms,
                       "overhead": ms / base - 1})
    if args.json:
        args.json.write_text(json.dumps({"workload": workload, "untraced_ms": untraced,
                                         "rows": result}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
