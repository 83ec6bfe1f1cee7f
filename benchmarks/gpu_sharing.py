"""Every GPU of a host, as one resource model: how a results folder used the host's GPUs.

Reads the GPU jobs' records of one results folder (each guard writes the GPUs it held and
when: ``assigned_gpus``, ``guard_unix``; pipeline/gpus.py) and prints

* per GPU: the jobs it ran and the share of the run's GPU span it was held;
* whether any GPU was held by two jobs at once (the resource model says never: a job takes
  whole GPUs of its own, docs/cluster.md);
* with ``--reference`` (the same config's one-GPU results folder, e.g. a published one):
  each run's untraced step time beside the reference's, and whether their 95% CIs overlap;
  with ``--wall-s`` and ``--reference-wall-s``, the ratio of the two invocations' wall times.

    python benchmarks/gpu_sharing.py --results results --reference results-1gpu \\
        --wall-s 340 --reference-wall-s 1170 [--json out.json]

A reference folder that is not finished compares the runs it has timed. Exit status 1 when two
jobs shared a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from analysis.metrics.timing import summarize  # noqa: E402
from analysis.outputs.runs import read_json, read_timing  # noqa: E402


@dataclass(frozen=True)
class GpuJob:
    """One guarded job: which run, what kind, which GPUs, from when to when (unix s)."""

    run: str
    kind: str  # timing, capture, calibrate
    gpus: tuple[str, ...]
    start: float
    end: float


def job_kind(path: Path) -> str:
    """A record's job kind from where the pipeline writes it."""
    if path.parent.name == "timing":
        return "timing"
    if path.name.startswith("calibration"):
        return "calibrate"
    return "capture"


def gpu_jobs(results: Path) -> list[GpuJob]:
    """Every record under ``results`` that says which GPUs its job held."""
    ends: dict[tuple[str, str, tuple[str, ...], float], float] = {}
    for path in sorted(results.rglob("*.json")):
        if "stats" in path.parts:
            continue
        record = read_json(path)
        if not isinstance(record, dict):
            continue
        held, guard = record.get("assigned_gpus"), record.get("guard_unix") or {}
        if not held or guard.get("ended") is None:
            continue
        run = record.get("run") or path.stem
        key = (run, job_kind(path), tuple(held["gpus"]), held["taken_unix"])
        # a timing job's repeats each write a record of the one job that held the GPUs
        ends[key] = max(ends.get(key, 0.0), guard["ended"])
    return [GpuJob(run, kind, gpus, start, end) for (run, kind, gpus, start), end in ends.items()]


def overlap(a: GpuJob, b: GpuJob) -> bool:
    return a.start < b.end and b.start < a.end


def shared_gpus(jobs: list[GpuJob]) -> list[tuple[GpuJob, GpuJob]]:
    """Pairs of jobs that held one GPU at the same time."""
    return [(a, b) for i, a in enumerate(jobs) for b in jobs[i + 1:]
            if overlap(a, b) and set(a.gpus) & set(b.gpus)]


def busy_share(jobs: list[GpuJob]) -> dict[str, dict[str, float]]:
    """Per GPU: jobs run, seconds held (overlaps merged) and share of the run's GPU span."""
    if not jobs:
        return {}
    span = max(j.end for j in jobs) - min(j.start for j in jobs)
    out = {}
    for gpu in sorted({g for j in jobs for g in j.gpus}):
        mine = sorted((j.start, j.end) for j in jobs if gpu in j.gpus)
        held, (lo, hi) = 0.0, mine[0]
        for start, end in mine[1:]:
            if start > hi:
                held, lo = held + hi - lo, start
            hi = max(hi, end)
        held += hi - lo
        out[gpu] = {"jobs": len(mine), "held_s": round(held, 1),
                    "share": round(held / span, 3) if span > 0 else math.nan}
    return out


def step_summaries(results: Path) -> dict[str, Any]:
    """Each run's untraced step time and 95% CI from its timing records (also for a folder
    whose pipeline has not finished: the runs it timed)."""
    out = {}
    for timing in sorted(results.glob("*/timing")):
        per_process = read_timing(timing.parent).per_process_ms
        if per_process:
            out[timing.parent.name] = summarize(per_process)
    return out


def compare_steps(results: Path, reference: Path) -> list[dict[str, Any]]:
    """Runs timed on both sides: step times, their ratio, and whether the 95% CIs overlap."""
    mine, ref = step_summaries(results), step_summaries(reference)
    rows = []
    for run in sorted(set(mine) & set(ref)):
        a, b = mine[run], ref[run]
        rows.append({"run": run, "step_ms": a.median_ms, "reference_ms": b.median_ms,
                     "ratio": a.median_ms / b.median_ms,
                     "cis_overlap": a.ci_low_ms <= b.ci_high_ms and b.ci_low_ms <= a.ci_high_ms,
                     "unstable": a.unstable or b.unstable})
    return rows


def compare_jobs(jobs: list[GpuJob], reference: list[GpuJob]) -> dict[str, Any]:
    """Jobs of both folders (same run and kind): the median ratio of their durations, and
    what every job of this folder would take one after another at the reference's pace (a
    one-GPU invocation runs its GPU jobs one at a time: a lower bound of its wall time)."""
    ref = {(j.run, j.kind): j.end - j.start for j in reference}
    ratios = sorted(ref[(j.run, j.kind)] / (j.end - j.start) for j in jobs
                    if (j.run, j.kind) in ref and j.end > j.start)
    if not ratios:
        return {"jobs_in_both": 0}
    median = ratios[len(ratios) // 2]
    serial = sum(j.end - j.start for j in jobs)
    return {"jobs_in_both": len(ratios), "duration_ratio_median": round(median, 3),
            "serial_s": round(serial, 1), "serial_at_reference_pace_s": round(serial * median, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--reference", type=Path, help="the one-GPU results folder")
    parser.add_argument("--wall-s", type=float, help="this invocation's wall time")
    parser.add_argument("--reference-wall-s", type=float, help="the reference's wall time")
    parser.add_argument("--json", type=Path, help="write everything printed here as JSON")
    args = parser.parse_args(argv)

    jobs = gpu_jobs(args.results)
    busy = busy_share(jobs)
    shared = shared_gpus(jobs)
    print(f"{len(jobs)} GPU jobs on {len(busy)} GPU(s)")
    for gpu, row in busy.items():
        print(f"  {gpu}: {row['jobs']} jobs, held {row['held_s']} s, "
              f"{row['share']:.0%} of the GPU span")
    print(f"GPU held by two jobs at once: {len(shared)} time(s)")
    for a, b in shared[:10]:
        print(f"  {a.run} ({a.kind}) and {b.run} ({b.kind}) on {set(a.gpus) & set(b.gpus)}")
    out: dict[str, Any] = {"jobs": [asdict(j) for j in jobs], "busy": busy,
                           "shared_gpus": len(shared)}
    if args.wall_s and args.reference_wall_s:
        out["wall_ratio"] = args.wall_s / args.reference_wall_s
        print(f"wall time {args.wall_s:.0f} s vs {args.reference_wall_s:.0f} s on one GPU: "
              f"{out['wall_ratio']:.0%}")
    if args.reference:
        pace = compare_jobs(jobs, gpu_jobs(args.reference))
        out["reference_jobs"] = pace
        if pace["jobs_in_both"]:
            print(f"{pace['jobs_in_both']} jobs in both: the reference's take "
                  f"{pace['duration_ratio_median']:.2f}x as long (median); this folder's "
                  f"{len(jobs)} GPU jobs one after another: {pace['serial_s']:.0f} s, at the "
                  f"reference's pace {pace['serial_at_reference_pace_s']:.0f} s")
        rows = compare_steps(args.results, args.reference)
        out["steps"] = rows
        inside = sum(r["cis_overlap"] for r in rows)
        print(f"step times beside {args.reference}: {inside} of {len(rows)} runs within "
              "each other's 95% CIs")
        for r in sorted(rows, key=lambda r: -abs(math.log(r["ratio"]))):
            if not r["cis_overlap"]:
                print(f"  {r['run']}: {r['step_ms']:.3f} vs {r['reference_ms']:.3f} ms "
                      f"({r['ratio']:.3f}){' unstable' if r['unstable'] else ''}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if shared else 0


if __name__ == "__main__":
    sys.exit(main())
