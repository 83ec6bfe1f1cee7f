"""Time ``python -m analysis trace`` on a large export made by replaying a real one.

No real capture here holds ~0.5 M kernels, so one is built: a real H100 export (by default
GPT small's bf16 eager train step, 10 measured steps, ~20 k kernels) is replayed N times into
a copy, every copy shifted in time by the capture's span and its correlation ids offset
(``build_export`` of benchmarks/analysis_speed.py: GPU activity, CUDA API calls and NVTX
ranges, the ``profiled_step`` ranges included). The copy then has N x 10 measured steps.

Measured, as a user waits for it (whole command, process start to exit, median of
``--repeat``), with the CPU time the command used (user + system: on a machine other work
shares, the wall time grows and this does not) and its peak RSS; the load average at the
start says how busy the machine was:

* ``two steps``: the default window (the median step and the next) of the large export: the
  target is at most 5 s on 2 cores and at most 50 MB per trace file;
* ``all steps`` (``--steps all``): every replayed step in one trace, the most a trace of this
  export can hold (a stress case beyond the target).

    .venv/bin/python benchmarks/trace_export.py --kernels 500000
"""

from __future__ import annotations

import argparse
import compileall
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import analysis_speed  # noqa: E402  (the replayed export)

DEFAULT_FIXTURE = ROOT / "tests/fixtures/h100/gpt_small_train_bf16_ctx512.sqlite"
TRACE = "trace.perfetto-trace.gz"


def _counts(path: Path) -> dict[str, int]:
    con = sqlite3.connect(path)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                          "NVTX_EVENTS")}
    finally:
        con.close()


def timed(cmd: list[str], repeat: int) -> tuple[float, float, int]:
    """Median wall seconds, median CPU seconds (user + system) and peak RSS (MB) of
    ``repeat`` runs of ``cmd``."""
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"command failed: {' '.join(cmd)}\n{proc.stderr.read().decode()}")
        runs.append((wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss // 1024))
    return (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
            max(r[2] for r in runs))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", type=int, default=500_000, help="kernels in the large export")
    p.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE, help="export to replay")
    p.add_argument("--repeat", type=int, default=3, help="runs per command (median)")
    p.add_argument("--no-all", action="store_true", help="skip the --steps all stress case")
    args = p.parse_args(argv)
    compileall.compile_dir(str(ROOT / "analysis"), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.sqlite"
        base = _counts(args.fixture)
        copies = max(1, -(-args.kernels // base["CUPTI_ACTIVITY_KIND_KERNEL"]))
        analysis_speed.build_export(
            args.fixture, big, args.kernels,
            api_rows=base["CUPTI_ACTIVITY_KIND_RUNTIME"] * copies,
            nvtx_ranges=base["NVTX_EVENTS"] * copies,
        )
        counts = _counts(big)
        print(f"replayed export (a real one, {args.fixture.name}, repeated {copies}x in time): "
              f"{counts['CUPTI_ACTIVITY_KIND_KERNEL']} kernels, "
              f"{counts['CUPTI_ACTIVITY_KIND_RUNTIME']} CUDA API rows, "
              f"{counts['NVTX_EVENTS']} NVTX rows, {big.stat().st_size / 1e6:.0f} MB")
        cases = [("two steps (default window)", [])]
        if not args.no_all:
            cases.append(("all steps (--steps all)", ["--steps", "all"]))
        print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"{'case':28s} {'wall s':>7s} {'CPU s':>7s} {'peak MB':>8s} {'trace MB':>9s}")
        for label, extra in cases:
            out = Path(tmp) / "out"
            cmd = [sys.executable, "-m", "analysis", "trace", str(big), "-o", str(out), *extra]
            wall, cpu, rss = timed(cmd, args.repeat)
            size = (out / TRACE).stat().st_size / 1e6
            print(f"{label:28s} {wall:7.2f} {cpu:7.2f} {rss:8d} {size:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
