"""The suite's own cost: each GPU job's wall time minus the work it measures, per launcher.

Runs one config's GPU jobs (calibrate, untraced timing, captures) with Snakemake twice, back
to back on the same machine: `launcher: process` (one interpreter per job, "before") and
`launcher: fork` (the fork servers, "after"), each into a fresh results folder. A job's fixed
overhead is its wall time (Snakemake's benchmark file, `{results}/logs/benchmark/`) minus its
warm-up and measured steps (host clock, from the job's own JSON: compilation happens in the
warm-up, so it is part of what is subtracted); a calibration job's overhead is its whole wall
time (its measurement is cached per GPU after the first run). Prints per kind of job and
overall the median and p90 of the overhead, before / after and their ratio, the invocation's
wall time, and per run the CI half-width and the spread between processes of both sides.

    python benchmarks/job_overhead.py --configfile config.yaml --out job_overhead.json
    python benchmarks/job_overhead.py --configfile config.yaml --launchers fork --out b.json
    python benchmarks/job_overhead.py --merge a.json b.json --out both.json
    python benchmarks/job_overhead.py --project config/full.yaml --costs both.json \\
        [--measured results ...]

`--project` estimates a config's wall time on one GPU from per-job costs (see
:func:`project_wall_time`): the fixed overheads measured here, and step times measured in the
results folders given (by run name) or estimated from the run's FLOPs.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from analysis.outputs.runs import SKIPPED, timing_paths  # noqa: E402 - standard library only

GPU_RULES = ("calibrate", "time_run", "profile")
# timing_compiled: a compiled run's timing job (torch.compile's own start-up and exit, e.g.
# Inductor's compile-worker pool, land outside its warm-up and steps)
KINDS = ("timing", "timing_compiled", "capture", "calibrate")


# --- one side: run the config, read its jobs -------------------------------------------------


def run_side(configfiles: list[Path], launcher: str, workdir: Path, cores: int, all_rules: bool,
             extra_config: list[str], snakemake_args: list[str]) -> dict[str, Any]:
    """Run the config's GPU jobs with this launcher into a fresh folder; its jobs and timings."""
    results = workdir / launcher
    if results.exists():
        shutil.rmtree(results)
    cmd = [sys.executable, "-m", "snakemake", "--cores", str(cores), "--keep-going",
           "--configfile", *map(str, configfiles),
           "--config", f"results={results}", f"launcher={launcher}", *extra_config,
           *snakemake_args]
    if not all_rules:
        cmd += ["--until", *GPU_RULES]
    print(f"[{launcher}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    (workdir / f"snakemake.{launcher}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        print(f"[{launcher}] snakemake exited {done.returncode}; see "
              f"{workdir}/snakemake.{launcher}.log", file=sys.stderr)
    jobs = read_jobs(results)
    return {
        "launcher": launcher,
        "results": str(results),
        "returncode": done.returncode,
        "wall_s": round(wall, 2),
        "jobs": jobs,
        "stats": overhead_stats(jobs),
        "runs": run_spreads(results),
        "parts": parts_stats(jobs),
        "preload": read_preloads(results / "logs"),
        "process_checks": process_checks(results, launcher),
    }


def read_side(results: Path, runs: list[str]) -> dict[str, Any]:
    """One side from a results folder made earlier (e.g. the published run), its jobs limited
    to the runs matching ``runs`` (globs; calibration always counts)."""
    jobs = [j for j in read_jobs(results)
            if not runs or not j["run"] or any(fnmatch.fnmatchcase(j["run"], g) for g in runs)]
    # the config's launcher: fork when any timing job was forked (captures never are)
    launcher = "fork" if any(j.get("launcher") == "fork" for j in jobs) else "process"
    return {"launcher": launcher, "results": str(results), "returncode": 0,
            "wall_s": float("nan"), "jobs": jobs, "stats": overhead_stats(jobs),
            "parts": parts_stats(jobs),
            "runs": run_spreads(results), "preload": read_preloads(results / "logs"),
            "process_checks": process_checks(results, launcher)}


def read_jobs(results: Path) -> list[dict[str, Any]]:
    """One row per GPU process that left a benchmark file: kind, wall, work, overhead. A
    run's timing job (all its repeats, one after another) gives a row per repeat it ran."""
    bench = results / "logs" / "benchmark"
    jobs = []
    for path in sorted(bench.rglob("*.jsonl")):
        kind, run, record_paths = job_of(path, bench, results)
        if kind is None:
            continue
        wall = _last_json_line(path)["s"]
        records = {p: _read_json(p) or {} for p in record_paths}
        records = {p: r for p, r in records.items() if r.get("status") != SKIPPED}
        for record_path, share in repeat_walls(wall, records).items():
            name = path.stem if len(record_paths) == 1 else f"{run}.{record_path.stem}"
            row = job_row(kind, run, name, share, records[record_path])
            jobs.append({**row, "snakemake_job": str(path.relative_to(bench))})
    return jobs


def job_of(path: Path, bench: Path, results: Path) -> tuple[str | None, str, list[Path]]:
    """(kind, run, the job's JSONs) of a benchmark file: a timing job per run (its repeats'
    records) or, before they were grouped, per repeat."""
    rel = path.relative_to(bench)
    if rel.parts[0] == "time_run":
        per_repeat = re.fullmatch(r"(.+)\.r(\d+)\.jsonl", rel.parts[1])
        if per_repeat:
            run, repeat = per_repeat.groups()
            return "timing", run, [results / run / "timing" / f"r{repeat}.json"]
        run = rel.parts[1].removesuffix(".jsonl")
        return "timing", run, timing_paths(results / run)
    if rel.parts[0] == "profile":
        run = rel.parts[1].removesuffix(".jsonl")
        return "capture", run, [results / run / "times.json"]
    if rel.name == "calibrate.jsonl":
        return "calibrate", "", [results / "calibration.json"]
    return None, "", []


def repeat_walls(wall: float, records: dict[Path, dict[str, Any]]) -> dict[Path, float]:
    """Each process's share of its job's wall time: its own span (the guard's timeline) plus
    an equal share of what the job spent outside every span (Snakemake's job start, the
    guard's own start and exit). One record: the whole wall."""
    if len(records) <= 1:
        return dict.fromkeys(records, wall)
    spans = {p: (r.get("guard_unix") or {}) for p, r in records.items()}
    if not all(s.get("started") and s.get("ended") for s in spans.values()):
        return {}  # records made before the guard kept its timeline: no split possible
    inside = {p: s["ended"] - s["started"] for p, s in spans.items()}
    outside = (wall - sum(inside.values())) / len(records)
    return {p: round(span + outside, 4) for p, span in inside.items()}


# A capture that waited longer than this at the device lock started beside another one.
WAITED_AT_LOCK_S = 0.05


def lock_share_start(record: dict[str, Any]) -> float | None:
    """When a capture that started beside another one took the device lock (Unix time): its
    share of the GPU's time begins there, since its start-up ran during the other's; None for
    every other record."""
    process = record.get("process") or {}
    mark = (process.get("timeline_unix") or {}).get("device")
    if mark is None or (process.get("device_wait_s") or 0.0) <= WAITED_AT_LOCK_S:
        return None
    return mark


def job_row(kind: str, run: str, name: str, wall: float, record: dict[str, Any]
            ) -> dict[str, Any]:
    status = record.get("status", "ok" if record else "missing")
    share = lock_share_start(record)
    ended = (record.get("guard_unix") or {}).get("ended")
    if share is not None and ended is not None:
        wall = round(ended - share, 4)
    if kind == "timing" and (record.get("params") or {}).get("compile", "off") != "off":
        kind = "timing_compiled"
    work = work_seconds(record) if kind != "calibrate" else 0.0
    ok = status == "ok" and work is not None
    process = record.get("process") or {}
    params = {**(record.get("params") or {}), "workload": record.get("workload")}
    return {
        "kind": kind, "run": run, "job": name, "status": status, "wall_s": wall,
        "workload": record.get("workload"),
        "compile_class": compile_class(params) if params.get("compile", "off") != "off" else None,
        "work_s": work, "overhead_s": round(wall - work, 3) if ok else None,
        "compile_s": record.get("compile_s"), "launcher": process.get("launcher"),
        "warmup_s": _sum_ms(record.get("warmup_times_ms")),
        "steps_s": _sum_ms(record.get("step_times_ms")),
        "parts_s": job_parts(wall, record) if ok else None,
    }


def compile_class(params: dict[str, Any]) -> str:
    """What a compiled run's compile costs depend on: its workload and, for a GPT, its mode
    and how it compiles its blocks (a forward compiles less than a train step; a regional
    compile traces one block whatever the depth, a whole-model compile every layer)."""
    workload = params.get("workload") or ""
    if workload != "gpt":
        return workload
    return f"gpt {params.get('mode', 'forward')} {params.get('compile_blocks', 'each')}"


# Where a job's wall time went, in order (job_parts): Snakemake's job start and the guard's own
# start and exit; from the guard starting the command to the workload process existing (a new
# interpreter, or nsys starting what it traces; a fork: the request to the server, waiting
# for it while it preloads); interpreter start and imports up to main(); the build (model,
# optimizer, CUDA context); warm-up and measured steps (compilation included); writing the
# record; from the record to the guard seeing the command end (interpreter exit, compile
# workers; a capture: nsys stopping, writing the report and exporting it to SQLite). `region`
# is taken out of the warm-up and steps: entering and leaving the measured region, where a
# capture's nsys starts and stops collecting (the record's region_ms; ~0 untraced).
PARTS = ("snakemake", "launch", "imports", "build", "warmup_steps", "region", "record", "exit")


def job_parts(wall: float, record: dict[str, Any]) -> dict[str, float] | None:
    """:data:`PARTS` of one job, seconds, from the guard's and the process's timelines (Unix
    times); None for a record without them (made before they existed)."""
    guard = record.get("guard_unix") or {}
    marks = (record.get("process") or {}).get("timeline_unix") or {}
    start, begun = guard.get("started"), [marks.get("started"), marks.get("main")]
    if "launched" in guard:  # started while the previous repeat exited: its start and
        begun = [start] * 2  # imports lie in that repeat's share, not its own
    if (share := lock_share_start(record)) is not None:  # a capture beside another: the
        start, begun = share, [share] * 2  # same, up to the device lock (job_row's wall)
    times = [start, *begun, marks.get("built"), marks.get("measured"), marks.get("written"),
             guard.get("ended")]
    if any(t is None for t in times):
        return None
    inside = [round(b - a, 3) for a, b in zip(times, times[1:], strict=False)]
    region = round(sum((record.get("region_ms") or {}).values()) / 1e3, 3)
    inside[3:4] = [round(inside[3] - region, 3), region]  # out of warm-up and steps
    return dict(zip(PARTS, [round(wall - (times[-1] - times[0]), 3), *inside], strict=True))


def parts_stats(jobs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per kind of job: the median seconds of each part, over the jobs that have them."""
    out = {}
    for kind in KINDS:
        rows = [j["parts_s"] for j in jobs if j["kind"] == kind and j.get("parts_s")]
        if rows:
            out[kind] = {"jobs": len(rows),
                         **{part: round(statistics.median(r[part] for r in rows), 3)
                            for part in PARTS}}
    return out


def snakemake_jobs(rows: list[dict[str, Any]]) -> set[str]:
    """The Snakemake jobs behind rows of processes (a timing job runs a run's repeats)."""
    return {row.get("snakemake_job") or row["job"] for row in rows}


def work_seconds(record: dict[str, Any]) -> float | None:
    """Warm-up (compilation included) plus measured steps, host clock; None without them. A
    whole-step CUDA graph (`cuda_graph: step`) compiles and captures before its warm-up
    replays: that time (`cuda_graph_capture_s`) is warm-up too."""
    warm, steps = record.get("warmup_times_ms"), record.get("step_times_ms")
    if warm is None or not steps:
        return None
    return (sum(warm) + sum(steps)) / 1e3 + (record.get("cuda_graph_capture_s") or 0.0)


def _sum_ms(values: list[float] | None) -> float | None:
    return None if values is None else round(sum(values) / 1e3, 4)


def overhead_stats(jobs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind and overall: jobs measured, median and p90 of the fixed overhead (s)."""
    stats = {}
    for kind in (*KINDS, "all"):
        values = [j["overhead_s"] for j in jobs
                  if j["overhead_s"] is not None and kind in (j["kind"], "all")]
        failed = [j for j in jobs if j["overhead_s"] is None and kind in (j["kind"], "all")]
        stats[kind] = {
            "jobs": len(values),
            "median_s": round(statistics.median(values), 3) if values else None,
            "p90_s": round(percentile(values, 90), 3) if values else None,
            "total_s": round(sum(values), 2),
            "failed_jobs": len(failed),
            "failed_wall_s": round(sum(j["wall_s"] for j in failed), 2),
        }
    return stats


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile, linear between order statistics (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def run_spreads(results: Path) -> dict[str, dict[str, Any]]:
    """Per run with 2+ ok timing processes: the published estimate, its CI half-width and the
    spread of the per-process medians (max - min, relative to the estimate)."""
    from analysis.metrics.timing import summarize

    runs = {}
    for timing in sorted(results.glob("*/timing")):
        records = [_read_json(p) or {} for p in sorted(timing.glob("r*.json"))]
        samples = [r.get("step_ms") for r in records if r.get("status") == "ok"]
        samples = [s for s in samples if s]
        if len(samples) < 2:
            continue
        summary = summarize(samples)
        medians = [statistics.median(s) for s in samples]
        runs[timing.parent.name] = {
            "processes": len(samples),
            "median_ms": round(summary.median_ms, 4),
            "ci_half_width_rel": round(summary.ci_half_width_rel, 4),
            "process_spread_rel": round((max(medians) - min(medians)) / summary.median_ms, 4),
        }
    return runs


def read_preloads(logs: Path) -> dict[str, Any]:
    """What each fork server spent preloading (its log's `preloaded in` line)."""
    out = {}
    for log in sorted(logs.glob("forkserver.s*.log")):
        for line in log.read_text().splitlines():
            match = re.search(r"slot (\d+): preloaded in ([\d.]+) s: (\{.*\})", line)
            if match:
                out[f"s{match[1]}"] = {"total_s": float(match[2]),
                                       "modules": json.loads(match[3])}
            elif "refusing every request" in line:
                out[log.stem] = {"refused": line.split("refusing every request: ", 1)[1]}
    return out


def process_checks(results: Path, launcher: str) -> list[str]:
    """What the timing records' process sections say against a clean start: every problem
    found (empty: none)."""
    problems = []
    records = {p: _read_json(p) or {} for p in results.glob("*/timing/r*.json")}
    sections = {p: r.get("process") for p, r in records.items()}
    if shared_pids(records):
        problems.append("two timing records share a pid")
    for path, s in sorted(sections.items()):
        if not s:
            continue
        name = str(path.relative_to(results))
        if s["launcher"] != launcher:
            problems.append(f"{name}: launched by {s['launcher']}")
        if s["cuda_initialized"] or s["cuda_memory"]:
            problems.append(f"{name}: CUDA existed before the workload: {s['cuda_memory']}")
        if s["inductor_code_cache_modules"] or s["dynamo_frame_counts"]:
            problems.append(f"{name}: compiled code before the workload")
    return problems


def shared_pids(records: dict[Path, dict[str, Any]]) -> list[tuple[Path, Path]]:
    """Pairs of records of two processes that lived at the same time on one host with the same
    pid: impossible for separate processes, so one process measured twice. A pid names a
    process only while it lives, on its host: a results folder resumed on other machines (a
    new host per attempt, all named alike) or a long run may reuse one."""
    lives: dict[tuple[Any, int], list[tuple[float, float, Path]]] = {}
    for path, record in records.items():
        section = record.get("process")
        if not section:
            continue
        marks = section.get("timeline_unix") or {}
        guard = record.get("guard_unix") or {}
        start = marks.get("started") or guard.get("started") or -math.inf
        end = marks.get("written") or guard.get("ended") or math.inf
        host = (record.get("provenance") or {}).get("hostname")
        lives.setdefault((host, section["pid"]), []).append((start, end, path))
    pairs = []
    for spans in lives.values():
        spans.sort(key=lambda span: span[0])
        pairs += [(a[2], b[2]) for a, b in zip(spans, spans[1:], strict=False) if b[0] <= a[1]]
    return pairs


def _last_json_line(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text().strip().splitlines()[-1])


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# --- the comparison --------------------------------------------------------------------------


def compare(sides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Before (process) / after (fork) ratios of the overhead medians and the wall time."""
    before, after = sides.get("process"), sides.get("fork")
    if not (before and after):
        return {}
    ratios = {}
    for kind in (*KINDS, "all"):
        b, a = before["stats"][kind]["median_s"], after["stats"][kind]["median_s"]
        ratios[kind] = round(b / a, 2) if b and a else None
    ratios["wall"] = round(before["wall_s"] / after["wall_s"], 2)
    return ratios


def print_report(result: dict[str, Any]) -> None:
    sides = result["sides"]
    names = [n for n in ("process", "fork") if n in sides]
    print(f"config {result['configfile']}: fixed overhead per GPU job (wall - warm-up - steps)")
    header = "".join(f" | {n} median / p90 (n)" for n in names)
    print(f"{'kind':<16}{header}" + (" | ratio" if len(names) == 2 else ""))
    for kind in (*KINDS, "all"):
        cells = []
        for n in names:
            s = sides[n]["stats"][kind]
            cells.append(f" | {_s(s['median_s'])} / {_s(s['p90_s'])} ({s['jobs']})")
        ratio = result["ratio"].get(kind) if result["ratio"] else None
        print(f"{kind:<16}{''.join(cells)}" + (f" | {ratio}x" if len(names) == 2 else ""))
    walls = " | ".join(f"{n} {sides[n]['wall_s']:.1f} s" for n in names)
    ratio = f" | ratio {result['ratio']['wall']}x" if result["ratio"] else ""
    print(f"invocation wall time: {walls}{ratio}")
    for n in names:
        failed = sides[n]["stats"]["all"]
        if failed["failed_jobs"]:
            print(f"  {n}: {failed['failed_jobs']} failed jobs (oom/unsupported/...), "
                  f"{failed['failed_wall_s']} s, not in the overhead statistics")
        print(f"  {n}: process checks: {'; '.join(sides[n]['process_checks']) or 'clean'}")
        for slot, info in sides[n]["preload"].items():
            print(f"  {n}: fork server {slot}: {info}")
    print_parts(sides, names)
    print("\nper run: CI half-width / spread of the per-process medians (relative)")
    runs = sorted(set().union(*(sides[n]["runs"] for n in names)))
    print(f"{'run':<58}" + "".join(f" | {n:>17}" for n in names))
    for run in runs:
        cells = []
        for n in names:
            r = sides[n]["runs"].get(run)
            cells.append(f" | {r['ci_half_width_rel']:7.2%} / {r['process_spread_rel']:7.2%}"
                         if r else f" | {'-':>17}")
        print(f"{run:<58}{''.join(cells)}")


def print_parts(sides: dict[str, dict[str, Any]], names: list[str]) -> None:
    """Where the seconds went, per side and kind of job (median seconds of each part)."""
    rows = [(n, kind, p) for n in names for kind, p in sides[n].get("parts", {}).items()]
    if not rows:
        return
    print("\nwhere a job's seconds went (median s per part; job_overhead.PARTS)")
    print(f"{'side / kind':<24}" + "".join(f"{part:>13}" for part in PARTS) + "     n")
    for n, kind, p in rows:
        print(f"{n + ' / ' + kind:<24}" + "".join(f"{p[part]:13.2f}" for part in PARTS)
              + f"{p['jobs']:6d}")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


# --- projecting a config's wall time ----------------------------------------------------------


@dataclass
class Costs:
    """Per-job costs on one GPU, in seconds (measured by this benchmark where it can)."""

    timing_overhead_s: float  # fixed overhead of an untraced timing job
    compiled_timing_overhead_s: float  # of a compiled run's timing job
    capture_overhead_s: float  # of a capture job (nsys start, export to SQLite, ...)
    calibrate_s: float  # the calibration job, whole
    gap_s: float = 0.2  # Snakemake's time between two GPU jobs
    compile_s: float = 20.0  # a compiled run's warm-up beyond its steps (torch.compile)
    trace_slowdown: float = 1.3  # a traced step / an untraced one (docs/timing.md)

    # Per compile class (compile_class: a GPT's mode and block compilation) and, as the
    # fallback for a class nothing measured, per workload:
    # a compiled run's compilation from the cache (attention cells compile far less than a GPT)
    compile_s_by_workload: dict[str, float] = field(default_factory=dict)
    # a compiled run's first process, whose graphs are in no cache yet: the mean over runs of
    # a run's longest compile (from a run that started without a cache)
    cold_compile_s_by_workload: dict[str, float] = field(default_factory=dict)
    # a compiled timing process's fixed overhead (an attention cell builds less)
    compiled_overhead_s_by_workload: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_results(cls, results: list[dict[str, Any]], launcher: str = "fork") -> Costs:
        """The medians over the jobs of every result's `launcher` side."""
        sides = [r["sides"][launcher] for r in results]
        jobs = [j for side in sides for j in side["jobs"]]
        stats = overhead_stats(jobs)
        # Snakemake's time between jobs, from invocations timed whole (not a --read side)
        gaps = [max(0.0, (side["wall_s"] - sum(j["wall_s"] for j in side["jobs"]))
                    / max(1, len(snakemake_jobs(side["jobs"]))))
                for side in sides if math.isfinite(side.get("wall_s") or math.nan)]
        # per (class or workload, run): its processes' compiles; the longest is the one that
        # found no cache (in a run started without one), the others loaded from it
        per_run: dict[tuple[str, str], list[float]] = {}
        overheads: dict[str, list[float]] = {}
        for j in jobs:
            for key in _cost_keys(j):
                if j.get("compile_s"):
                    per_run.setdefault((key, j["run"]), []).append(j["compile_s"])
                if j["kind"] == "timing_compiled" and j["overhead_s"] is not None:
                    overheads.setdefault(key, []).append(j["overhead_s"])
        compiles: dict[str, list[float]] = {}
        cold: dict[str, list[float]] = {}
        for (key, _), seconds in per_run.items():
            ordered = sorted(seconds)
            cold.setdefault(key, []).append(ordered[-1])
            compiles.setdefault(key, []).extend(ordered[:-1] or ordered)
        workloads = {j.get("workload") for j in jobs}  # each compile once, under its workload
        everything = [c for key, values in compiles.items() if key in workloads for c in values]
        return cls(
            timing_overhead_s=stats["timing"]["median_s"] or 0.0,
            compiled_timing_overhead_s=(stats["timing_compiled"]["median_s"]
                                        or stats["timing"]["median_s"] or 0.0),
            capture_overhead_s=stats["capture"]["median_s"] or 0.0,
            calibrate_s=stats["calibrate"]["median_s"] or 0.0,
            gap_s=max(gaps) if gaps else cls.gap_s,
            compile_s=statistics.fmean(everything) if everything else cls.compile_s,
            # compile times add up over a config's runs: their means (a few long compiles are
            # part of the total), where an overhead's median is the issue's own measure
            compile_s_by_workload=_means(compiles),
            cold_compile_s_by_workload=_means(cold),
            compiled_overhead_s_by_workload=_medians(overheads),
        )

    def compile_for(self, params: dict[str, Any]) -> float:
        """A compiled run's compilation from the cache: its class's mean, else its
        workload's, else every compiled process's."""
        return _lookup(self.compile_s_by_workload, params, self.compile_s)

    def cold_compile_for(self, params: dict[str, Any]) -> float:
        """A compiled run's first compilation without a cache (else the warm one)."""
        return _lookup(self.cold_compile_s_by_workload, params, self.compile_for(params))

    def compiled_overhead_for(self, params: dict[str, Any]) -> float:
        return _lookup(self.compiled_overhead_s_by_workload, params,
                       self.compiled_timing_overhead_s)


def _cost_keys(job: dict[str, Any]) -> list[str]:
    """The keys a job's compile costs count under: its compile class, and its workload."""
    keys = [job.get("compile_class"), job.get("workload")]
    return list(dict.fromkeys(k for k in keys if k))


def _lookup(table: dict[str, float], params: dict[str, Any], default: float) -> float:
    for key in (compile_class(params), params.get("workload")):
        if key in table:
            return table[key]
    return default


def _medians(values: dict[str, list[float]]) -> dict[str, float]:
    return {k: round(statistics.median(v), 3) for k, v in values.items() if k and v}


def _means(values: dict[str, list[float]]) -> dict[str, float]:
    return {k: round(statistics.fmean(v), 3) for k, v in values.items() if k and v}


def project_wall_time(runs: dict[str, dict[str, Any]], repeats: int, calibrate: bool,
                      costs: Costs, step_ms: Callable[[str, dict[str, Any]], float],
                      cold: bool = True) -> dict[str, Any]:
    """A config's GPU time on one GPU, its jobs one after another: per process its fixed
    overhead + warm-up steps (+ compilation) + measured steps x the run's step time (a
    capture's slower by the tracer), and Snakemake's gap per job: a run's timing job runs
    its `repeats` processes, a capture is a job of its own. A run this GPU cannot run
    (expected_unsupported) is one short process: the guard skips its other repeats. `cold`:
    no compile cache yet, so each compiled run's first process compiles its graphs.
    `runs`: name -> resolved parameters (pipeline.config); `step_ms(name, params)`: the
    run's untraced step time in ms."""
    total = costs.calibrate_s + costs.gap_s if calibrate else 0.0
    jobs = processes = int(calibrate)
    by_part = {"overhead": 0.0, "warmup": 0.0, "steps": 0.0, "compile": 0.0, "gaps": 0.0}
    unsupported = 0
    for name, params in runs.items():
        compiled = params.get("compile", "off") != "off"
        overhead = (costs.compiled_overhead_for(params) if compiled
                    else costs.timing_overhead_s)
        n_jobs = 1 + bool(params.get("profile", True))
        if expected_unsupported(params):
            unsupported += 1
            n_jobs, n_processes = 1, 1
            by_part["overhead"] += overhead
        else:
            step_s = step_ms(name, params) / 1e3
            steps = params.get("steps", 1) * step_s
            n_processes = repeats + n_jobs - 1
            by_part["overhead"] += repeats * overhead
            by_part["steps"] += repeats * steps
            if n_jobs == 2:
                by_part["overhead"] += costs.capture_overhead_s
                by_part["steps"] += steps * costs.trace_slowdown
            by_part["warmup"] += n_processes * params.get("warmup", 0) * step_s
            if compiled:
                warm = costs.compile_for(params)
                first = costs.cold_compile_for(params) if cold else warm
                by_part["compile"] += first + (n_processes - 1) * warm
        by_part["gaps"] += n_jobs * costs.gap_s
        jobs += n_jobs
        processes += n_processes
    total += sum(by_part.values())
    return {"cache": "cold" if cold else "warm", "gpu_jobs": jobs, "gpu_processes": processes,
            "runs_unsupported": unsupported, "hours": round(total / 3600, 2),
            "seconds": round(total),
            "by_part_s": {k: round(v) for k, v in by_part.items()}, "costs": asdict(costs)}


# FlashAttention's and cuDNN's SDPA kernels take half precision only: such a cell is an
# `unsupported` row on every GPU (PyTorch's own check, workloads/attention.py).
HALF_ONLY_BACKENDS = {"flash", "cudnn"}


def expected_unsupported(params: dict[str, Any]) -> bool:
    """Whether a run will be an `unsupported` row whatever the GPU: an SDPA backend that
    takes half precision only, asked for fp32 or tf32."""
    return (params.get("workload") in ("attention", "attention_core")
            and params.get("impl", "sdpa") == "sdpa"
            and params.get("sdpa_backend") in HALF_ONLY_BACKENDS
            and params.get("dtype") in ("fp32", "tf32"))


# An untraced step's estimate when no measurement is given: FLOPs at an achieved rate (H100,
# dense, well below the datasheet peaks), never below a launch-bound floor per layer.
ACHIEVED_TFLOPS = {"fp32": 45.0, "tf32": 250.0, "bf16": 400.0, "fp16": 400.0}
EAGER_MS_PER_LAYER = {"forward": 1.2, "forward_backward": 3.0, "train": 3.8}
MIN_STEP_MS = 0.05


def estimated_step_ms(params: dict[str, Any]) -> float:
    """A rough untraced step time (ms) of a run from its FLOPs and a launch floor."""
    from workloads import flops
    from workloads.gpt import config_for

    workload, mode, dtype = params["workload"], params.get("mode", "forward"), params["dtype"]
    floor = MIN_STEP_MS
    if workload == "gpt":
        cfg = config_for(params["size"], context_length=params["context"],
                         vocab_size=params["vocab"], attention=params.get("attention", "sdpa"))
        work = flops.step_flops(flops.gpt_forward_flops(cfg, params["batch"], params["context"]),
                                mode)
        floor = cfg.n_layers * EAGER_MS_PER_LAYER[mode]
        if params.get("compile", "off") == "reduce-overhead":
            floor /= 6  # CUDA graphs remove the launch gaps (published: 8.9 vs 53 ms)
    elif workload == "attention":
        work = flops.step_flops(flops.attention_forward_flops(
            params["batch"], params["seq"], params["embed"]), mode)
    else:
        work = flops.attention_core_step_flops(flops.attention_core_forward_flops(
            params["batch"], params["heads"], params["seq"], params["head_dim"],
            params.get("causal", False)), mode)
    return max(floor, work / (ACHIEVED_TFLOPS[dtype] * 1e12) * 1e3)


def measured_step_ms(results: list[Path]) -> dict[str, float]:
    """Run name -> the median of its timing processes' medians, from results folders."""
    out = {}
    for folder in results:
        for timing in folder.glob("*/timing"):
            medians = [r["median_ms"] for p in timing.glob("r*.json")
                       if (r := _read_json(p) or {}).get("status") == "ok"
                       and r.get("median_ms") is not None]
            if medians:
                out[timing.parent.name] = statistics.median(medians)
    return out


def project(configfile: Path, costs: Costs, measured: list[Path]) -> dict[str, Any]:
    from pipeline.config import load

    plan = load(configfile)
    known = measured_step_ms(measured)

    def step_ms(name: str, params: dict[str, Any]) -> float:
        return known[name] if name in known else estimated_step_ms(params)

    args = (plan.runs, len(plan.repeats), bool(plan.config["calibrate"]), costs, step_ms)
    result = project_wall_time(*args, cold=True)
    warm = project_wall_time(*args, cold=False)
    result["warm_cache"] = {k: warm[k] for k in ("hours", "seconds", "by_part_s")}
    result["runs_measured"] = sum(1 for n in plan.runs if n in known)
    result["runs_estimated"] = len(plan.runs) - result["runs_measured"]
    result["configfile"] = str(configfile)
    return result


# --- command line -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configfile", type=Path, default=Path("config.yaml"))
    parser.add_argument("--launchers", default="process,fork",
                        help="sides to run, in this order (default: process,fork)")
    parser.add_argument("--workdir", type=Path, default=Path("results/job_overhead"))
    parser.add_argument("--cores", type=int, default=4)
    parser.add_argument("--all", action="store_true",
                        help="the whole pipeline, not only its GPU jobs")
    parser.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE",
                        help="more Snakemake --config overrides (e.g. 'select=[attn_*]')")
    parser.add_argument("--repeats", type=int,
                        help="timing processes per run instead of the config's (more data "
                             "for comparing the launchers' CI widths)")
    parser.add_argument("--out", type=Path, help="write the result JSON here")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                        help="combine one-sided result files instead of running")
    parser.add_argument("--read", type=Path, metavar="RESULTS",
                        help="measure the jobs of a results folder the pipeline already made "
                             "(its launcher from the records) instead of running")
    parser.add_argument("--runs", nargs="+", default=[], metavar="GLOB",
                        help="with --read: only these runs (e.g. the default config's)")
    parser.add_argument("--project", type=Path, metavar="CONFIG",
                        help="project this config's wall time from --costs")
    parser.add_argument("--costs", nargs="+", type=Path,
                        help="result JSONs of this benchmark (their jobs' medians)")
    parser.add_argument("--cold-costs", nargs="+", type=Path, metavar="JSON",
                        help="result JSONs of runs that started without a compile cache: "
                             "their first compiles replace --costs' cold compiles")
    parser.add_argument("--measured", nargs="*", type=Path, default=[],
                        help="results folders whose step times the projection uses")
    parser.add_argument("snakemake_args", nargs="*", help="after --: more Snakemake arguments")
    args = parser.parse_args(argv)

    if args.project:
        costs = (Costs.from_results([json.loads(p.read_text()) for p in args.costs])
                 if args.costs else None)
        if costs is None:
            parser.error("--project needs --costs (a result JSON of this benchmark)")
        if args.cold_costs:
            cold = Costs.from_results([json.loads(p.read_text()) for p in args.cold_costs])
            costs.cold_compile_s_by_workload = cold.cold_compile_s_by_workload
        projection = project(args.project, costs, args.measured)
        print(json.dumps(projection, indent=2))
        if args.out:
            args.out.write_text(json.dumps(projection, indent=2) + "\n")
        return 0

    if args.read:
        side = read_side(args.read, args.runs)
        result = {"configfile": str(args.read), "sides": {side["launcher"]: side},
                  "ratio": None}
        print_report(result)
        if args.out:
            args.out.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        sides = {n: s for part in parts for n, s in part["sides"].items()}
        configfile = parts[0]["configfile"]
    else:
        args.workdir.mkdir(parents=True, exist_ok=True)
        configfiles = [args.configfile]
        if args.repeats:  # Snakemake merges a later config file into the earlier one
            overlay = args.workdir.resolve() / "repeats.yaml"
            overlay.write_text(json.dumps({"timing": {"repeats": args.repeats}}) + "\n")
            configfiles.append(overlay)
        sides = {}
        for launcher in args.launchers.split(","):
            sides[launcher] = run_side(configfiles, launcher, args.workdir.resolve(),
                                       args.cores, args.all, args.config, args.snakemake_args)
        configfile = str(args.configfile)
    result = {"configfile": configfile, "sides": sides, "ratio": compare(sides)}
    print_report(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
