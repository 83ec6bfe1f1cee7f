"""Time ``python -m analysis stats`` and ``all`` against ``nsys stats`` on a large replayed export.

The large export is made by replaying a real H100 export N times into a copy: every copy
of the GPU activity (kernels, memcpy, memset), of the CUDA API calls that launched it and
of the NVTX ranges is shifted by N x (capture span + 1 ms) and its correlation ids are
offset, so joins stay consistent.  Other CUDA API calls ("filler": cuGetProcAddress,
cudaStreamIsCapturing, ...) and NVTX ranges are replayed in a fraction of the copies so
that the row counts hit ``--api-rows`` and ``--nvtx-ranges``.

How it is measured (the same way for both tools, on the same file, in the same run):

* every figure is the wall time of a whole command, process start to exit, as a user
  waits for it (``os.wait4`` on the child; Python start-up and imports included):
  "stats" = ``python -m analysis stats FILE -o DIR`` (the seven reports, one process) and
  "all" = ``python -m analysis all FILE -o DIR`` (the seven reports plus the extras: what
  the pipeline runs), each against one ``nsys stats`` with the seven ``--report`` flags;
  per report = ``... stats --report R`` as a separate command on each side;
* a command that exits non-zero aborts the benchmark (a fast failure is no timing);
* ``--repeat N`` runs every command N times and prints the median;
* ``analysis/`` is byte-compiled first (``compileall``), as an installed package is: with
  ``PYTHONDONTWRITEBYTECODE`` set, every run would otherwise recompile its modules.

nsys 2024.2.3 runs its report SQL in-process (no Python or child process: ``strace -f``
shows a single process), so its short per-report times (~0.02 s on a small export) are
real command wall times, not an internal timer.  Peak RSS is ``ru_maxrss`` of the child.

    .venv/bin/python benchmarks/analysis_speed.py --kernels 500000
    .venv/bin/python benchmarks/analysis_speed.py --kernels 5000000 --no-nsys
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from analysis.reports import REPORTS  # noqa: E402  (the repo, not an installed copy)

DEFAULT_FIXTURE = ROOT / "tests/fixtures/h100/attention_simple_vs_sdpa_nsys2025.3.1.sqlite"
GPU_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
)
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_RANGE_TYPES = "(59, 60, 70, 71)"


def _cols(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA main.table_info({table})")]


def _select(cols: list[str], shift: str, coff: str) -> str:
    out = []
    for c in cols:
        if c in ("start", "end"):
            out.append(f"t.{c} + {shift}")
        elif c == "correlationId":
            out.append(f"t.{c} + {coff}")
        else:
            out.append(f"t.{c}")
    return ", ".join(out)


def _fraction(want: int, have: int) -> tuple[int, int]:
    """want/have clamped to [0, 1] as an integer fraction (numerator, denominator)."""
    if have <= 0:
        return (0, 1)
    return (max(0, min(want, have)), have)


def _pick(i: str, frac: tuple[int, int]) -> str:
    """SQL condition selecting a fraction num/den of copies i, evenly spread."""
    num, den = frac
    return f"(({i}) * {num}) / {den} > (({i}) - 1) * {num} / {den}"


def build_export(src: Path, dst: Path, kernels: int, api_rows: int, nvtx_ranges: int) -> dict:
    """Replay ``src`` into ``dst`` until it holds about ``kernels`` kernel records."""
    shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.execute("PRAGMA cache_size=-262144")
    base_k = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    copies = max(1, math.ceil(kernels / base_k))
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    gpu = [t for t in GPU_TABLES if t in tables]
    bounds = [
        con.execute(f"SELECT min(start), max(end) FROM {t}").fetchone() for t in (*gpu, RUNTIME)
    ]
    lo = min(b[0] for b in bounds if b[0] is not None)
    hi = max(b[1] for b in bounds if b[1] is not None)
    nv_lo, nv_hi = con.execute(
        f"SELECT min(start), max(coalesce(end, start)) FROM NVTX_EVENTS "
        f"WHERE eventType IN {NVTX_RANGE_TYPES}"
    ).fetchone() if "NVTX_EVENTS" in tables else (lo, hi)
    span = max(hi, nv_hi or hi) - min(lo, nv_lo or lo) + 1_000_000
    coff = max(
        con.execute(f"SELECT max(correlationId) FROM {t}").fetchone()[0] or 0
        for t in (*gpu, RUNTIME)
    ) + 1
    con.execute("CREATE TEMP TABLE reps(i INTEGER PRIMARY KEY)")
    con.executemany("INSERT INTO reps VALUES (?)", [(i,) for i in range(1, copies)])
    launch_corr = " UNION ".join(f"SELECT correlationId FROM main.{t}" for t in gpu)
    con.execute(f"CREATE TEMP TABLE launch AS {launch_corr}")
    base_launch = con.execute(
        f"SELECT count(*) FROM {RUNTIME} WHERE correlationId IN (SELECT correlationId FROM launch)"
    ).fetchone()[0]
    base_api = con.execute(f"SELECT count(*) FROM {RUNTIME}").fetchone()[0]
    base_nvtx = con.execute(
        f"SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN {NVTX_RANGE_TYPES}"
    ).fetchone()[0]
    # replay filler API rows / NVTX ranges in a fraction of the copies (evenly spread)
    filler = _fraction(api_rows - base_launch * copies, (base_api - base_launch) * copies)
    nvtx = _fraction(nvtx_ranges, base_nvtx * copies)
    shift, off = f"r.i * {span}", f"r.i * {coff}"
    for t in gpu:
        cols = _cols(con, t)
        con.execute(f"INSERT INTO {t} ({', '.join(cols)}) SELECT {_select(cols, shift, off)} "
                    f"FROM reps r CROSS JOIN {t} t WHERE t.rowid <= (SELECT max(rowid) FROM {t})")
    cols = _cols(con, RUNTIME)
    con.execute(
        f"INSERT INTO {RUNTIME} ({', '.join(cols)}) SELECT {_select(cols, shift, off)} "
        f"FROM reps r CROSS JOIN (SELECT * FROM {RUNTIME}) t "
        f"WHERE t.correlationId IN (SELECT correlationId FROM launch) OR {_pick('r.i', filler)}"
    )
    if "NVTX_EVENTS" in tables:
        cols = _cols(con, "NVTX_EVENTS")
        con.execute(
            f"INSERT INTO NVTX_EVENTS ({', '.join(cols)}) SELECT {_select(cols, shift, off)} "
            f"FROM reps r CROSS JOIN (SELECT * FROM NVTX_EVENTS WHERE eventType IN "
            f"{NVTX_RANGE_TYPES}) t WHERE {_pick('r.i', nvtx)}"
        )
    con.commit()
    counts = {
        t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in (*gpu, RUNTIME, "NVTX_EVENTS") if t in tables
    }
    con.close()
    return {"copies": copies, **counts}


def timed_once(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds from process start to exit, peak RSS in MB) of one command."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        secs = time.perf_counter() - t
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err.seek(0)
            msg = err.read().decode(errors="replace")[-2000:]
            raise SystemExit(f"command failed (exit {code}): {' '.join(cmd)}\n{msg}")
    return secs, usage.ru_maxrss // 1024


REPEAT = 1


def timed(cmd: list[str]) -> tuple[float, int]:
    """Median wall seconds and max peak RSS (MB) over ``REPEAT`` runs of ``cmd``."""
    runs = [timed_once(cmd) for _ in range(REPEAT)]
    return statistics.median(r[0] for r in runs), max(r[1] for r in runs)


def find_nsys() -> str | None:
    script = ROOT / "scripts/install-nsys.sh"
    for cand in (os.environ.get("NSYS"), shutil.which("nsys")):
        if cand:
            return cand
    if script.exists():
        cache = os.environ.get("NSYS_CACHE", "/tmp/nsyscache")
        try:
            out = subprocess.run([str(script), cache], capture_output=True, text=True, check=True)
            return out.stdout.strip().splitlines()[-1]
        except (subprocess.CalledProcessError, IndexError):
            return None
    return None


def _parity(ours: Path, ref: Path) -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from analysis_fixtures import compare_report

    bad = [r for r in REPORTS if compare_report(ours / f"{r}.csv", ref / f"x_{r}.csv", r)]
    return "all 7 reports identical" if not bad else f"DIFFERENT: {', '.join(bad)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kernels", type=int, default=500_000)
    ap.add_argument("--api-rows", type=int, default=None, help="default: 2 x kernels")
    ap.add_argument("--nvtx-ranges", type=int, default=None, help="default: 0.07 x kernels")
    ap.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--nsys", default=None, help="nsys binary (default: scripts/install-nsys.sh)")
    ap.add_argument("--no-nsys", action="store_true", help="time only our engine")
    ap.add_argument("--no-per-report", action="store_true", help="skip per-report runs")
    ap.add_argument("--keep", action="store_true", help="keep the generated export")
    ap.add_argument("--repeat", type=int, default=1, help="runs per command (median)")
    args = ap.parse_args(argv)
    global REPEAT
    REPEAT = max(1, args.repeat)
    api_rows = args.api_rows or 2 * args.kernels
    nvtx_ranges = args.nvtx_ranges or int(0.07 * args.kernels)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="analysis_speed_"))
    work.mkdir(parents=True, exist_ok=True)
    big = work / "big.sqlite"
    t = time.perf_counter()
    counts = build_export(args.fixture, big, args.kernels, api_rows, nvtx_ranges)
    print(f"built {big} in {time.perf_counter() - t:.1f} s: {counts}, "
          f"{big.stat().st_size / 1e6:.0f} MB")
    py = sys.executable
    nsys = None if args.no_nsys else (args.nsys or find_nsys())
    version = "2025"
    if nsys:
        out = subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout
        version = "2024" if " 2024." in out else "2025"
        print(f"{out.strip()}; our engine reproduces nsys {version}")
    subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "analysis")], check=True)
    ours = [py, "-m", "analysis", "stats", str(big), "-o", str(work / "ours"),
            "--nsys-version", version]  # fmt: skip
    ours_all = [py, "-m", "analysis", "all", str(big), "-o", str(work / "ours_all"),
                "--nsys-version", version]  # fmt: skip
    results: dict[str, dict[str, float]] = {}
    print(f"whole-command wall times, median of {REPEAT} run(s); load average before: "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    secs, rss = timed(ours)
    print(f"ours   stats (7 reports):        {secs:8.2f} s  peak RSS {rss} MB")
    results["stats (7 reports)"] = {"ours": secs}
    secs, rss = timed(ours_all)
    print(f"ours   all (7 reports + extras): {secs:8.2f} s  peak RSS {rss} MB")
    results["all (7 + extras)"] = {"ours": secs}
    if nsys:
        cmd = [nsys, "stats", "--format", "csv", "--force-export=false", "--force-overwrite=true",
               "--output", str(work / "nsys" / "x")]
        (work / "nsys").mkdir(exist_ok=True)
        for r in REPORTS:
            cmd += ["--report", r]
        secs_n, rss_n = timed([*cmd, str(big)])
        print(f"nsys   stats (7 reports):        {secs_n:8.2f} s  peak RSS {rss_n} MB")
        for row in ("stats (7 reports)", "all (7 + extras)"):
            results[row]["nsys"] = secs_n  # nsys has no extras: its 7 reports are the job
        print("parity ours vs nsys on this file:", _parity(work / "ours", work / "nsys"))
    if not args.no_per_report:
        for r in REPORTS:
            s_o, rss_o = timed([*ours, "--report", r])
            results[r] = {"ours": s_o, "rss": rss_o}
            if nsys:
                cmd = [nsys, "stats", "--format", "csv", "--force-export=false",
                       "--force-overwrite=true", "--report", r,
                       "--output", str(work / "nsys" / "one"), str(big)]
                results[r]["nsys"] = timed(cmd)[0]
    print()
    print(f"{'report':24s} {'ours (s)':>9s} {'nsys (s)':>9s} {'nsys/ours':>10s}")
    for name, row in results.items():
        n = row.get("nsys")
        ratio = f"{n / row['ours']:9.1f}x" if n else "         -"
        print(f"{name:24s} {row['ours']:9.3f} {n if n else float('nan'):9.3f} {ratio}")
    if not args.keep and args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
