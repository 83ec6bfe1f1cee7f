"""Two sides of one config side by side (benchmarks/gpu/process_machinery.sh: the process
machinery before and after): per side the per-process fixed overhead of the untraced timing
processes (wall minus warm-up and measured steps; median and p90, benchmarks/job_overhead.py
reads the jobs), the median relative CI half-width over the timed runs, and the wall time.

    python benchmarks/process_machinery.py --side before=RESULTS:WALL_S \\
        --side after=RESULTS:WALL_S [--out JSON]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TIMING_KINDS = ("timing", "timing_compiled")


def job_overhead() -> Any:
    spec = importlib.util.spec_from_file_location("job_overhead", HERE / "job_overhead.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def side(results: Path, wall_s: float) -> dict[str, Any]:
    """One side's numbers, from its results folder and its invocation's wall time."""
    jo = job_overhead()
    jobs = [j for j in jo.read_jobs(results) if j["kind"] in TIMING_KINDS]
    overheads = [j["overhead_s"] for j in jobs if j.get("overhead_s") is not None]
    runs = jo.run_spreads(results)
    halves = [r["ci_half_width_rel"] for r in runs.values()]
    by_kind = {k: statistics.median([j["overhead_s"] for j in jobs if j["kind"] == k
                                     and j.get("overhead_s") is not None] or [float("nan")])
               for k in TIMING_KINDS}
    return {"results": str(results), "wall_s": wall_s, "timing_processes": len(overheads),
            "overhead_median_s": statistics.median(overheads) if overheads else None,
            "overhead_p90_s": jo.percentile(overheads, 90) if overheads else None,
            "overhead_median_s_by_kind": by_kind, "runs": runs,
            "ci_half_width_median": statistics.median(halves) if halves else None}


def report(sides: dict[str, dict[str, Any]]) -> str:
    names = list(sides)
    rows = [("timing processes", lambda s: f"{s['timing_processes']}"),
            ("fixed overhead, median", lambda s: f"{s['overhead_median_s']:.2f} s"),
            ("fixed overhead, p90", lambda s: f"{s['overhead_p90_s']:.2f} s"),
            *[(f"  {k}, median", lambda s, k=k: f"{s['overhead_median_s_by_kind'][k]:.2f} s")
              for k in TIMING_KINDS],
            ("CI half-width, median", lambda s: f"{s['ci_half_width_median']:.2%}"),
            ("wall time", lambda s: f"{s['wall_s']:.1f} s")]
    lines = [f"{'':<26}" + "".join(f"{n:>14}" for n in names)]
    lines += [f"{label:<26}" + "".join(f"{cell(sides[n]):>14}" for n in names)
              for label, cell in rows]
    if len(names) == 2:
        a, b = (sides[n] for n in names)
        lines.append(f"wall time {names[1]}/{names[0]}: {b['wall_s'] / a['wall_s']:.3f}; "
                     f"CI half-width {names[1]} - {names[0]}: "
                     f"{(b['ci_half_width_median'] - a['ci_half_width_median']) * 100:+.2f} points")
    lines.append("per run CI half-width: " + "; ".join(
        f"{run} " + " / ".join(f"{sides[n]['runs'].get(run, {}).get('ci_half_width_rel', 0):.2%}"
                              for n in names)
        for run in sorted(set().union(*(sides[n]["runs"] for n in names)))))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", action="append", required=True, metavar="NAME=RESULTS:WALL_S")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sides = {}
    for spec in args.side:
        name, _, rest = spec.partition("=")
        results, _, wall = rest.rpartition(":")
        sides[name] = side(Path(results), float(wall))
    print(report(sides))
    if args.out:
        args.out.write_text(json.dumps(sides, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
