"""Across the ranks of one distributed run: per rank and step, stragglers, collectives.

    python -m analysis ranks RUN/profile.rank0.sqlite RUN/profile.rank1.sqlite ...
                             --times RUN/times.json -o RUN/distributed

writes (definitions in analysis/metrics/ranks.py and docs/distributed.md):

* ``rank_steps.csv``: rank, step, step/compute/communication/exposed/idle ms, overlap;
* ``ranks.csv``: the same per rank, mean over its steps, and ``late_ms``: how much later than
  the others the rank reaches the collectives (:func:`lateness` of the time it spends in each
  step's first collective: the others wait for a late rank inside it, so it spends the least);
* ``steps.csv``: per step, across ranks: the slowest and fastest rank by step time and the
  spread (slowest - fastest), the rank with the most compute and the compute spread, and the
  latest rank (the least time in the first collective) with the others' median time there
  minus its own;
* ``collectives.csv``: per collective op and message size, over all ranks and measured steps:
  count, median time, algorithm bandwidth ``bytes / time`` and bus bandwidth ``algbw x
  factor`` (nccl-tests: 2(n-1)/n for all-reduce, (n-1)/n for all-gather and
  reduce-scatter, whose size is the whole gathered / scattered buffer);
* ``metrics.json``: the run's means (over ranks and steps), the straggler (the rank with the
  largest ``late_ms``, and that lateness: what every other rank waits for it per step) and
  the largest all-reduce's bus bandwidth, for distributed.csv and the findings.

A run that failed (``times.json`` status) gets header-only tables and its status.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from analysis.metrics.ranks import STEP_COLUMNS, collective_rows, rank_timeline, step_breakdown
from analysis.outputs.runs import empty_cell
from analysis.reading import Export

TABLES = {
    "rank_steps": ["rank", *STEP_COLUMNS],
    "ranks": ["rank", "steps", "step_ms", "compute_ms", "comm_ms", "exposed_comm_ms",
              "exposed_comm_share", "overlap", "idle_ms", "late_ms"],
    "steps": ["step", "slowest_rank", "fastest_rank", "step_spread_ms", "max_compute_rank",
              "compute_spread_ms", "late_rank", "late_ms"],
    "collectives": ["op", "bytes", "count", "time_us", "algbw_gbps", "busbw_gbps",
                    "bus_factor"],
}
MEANS = ("step_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "idle_ms")


def bus_factor(op: str, ranks: int) -> float | None:
    """nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md), None for other ops."""
    if ranks < 2:
        return None
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    return None


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def rank_summary(rank: int, steps: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"rank": rank, "steps": len(steps)}
    for key in MEANS:
        row[key] = _mean([s[key] for s in steps])
    row["overlap"] = _overlap(steps)
    row["exposed_comm_share"] = (row["exposed_comm_ms"] / row["step_ms"]
                                 if row["step_ms"] else None)
    return row


def _overlap(steps: list[dict[str, Any]]) -> float | None:
    """1 - exposed / communication over all the steps together."""
    comm = sum(s["comm_ms"] for s in steps)
    return 1 - sum(s["exposed_comm_ms"] for s in steps) / comm if comm else None


def lateness(arrivals: list[list[float]]) -> list[float | None]:
    """Per rank, how much later than the others it gets to the collectives: the median over
    steps of its arrival minus the median of the other ranks' arrivals in the same step (a
    median: one step disturbed by something else does not move it). ``arrivals[r][s]``: rank
    r's arrival in step s, later = larger; steps every rank has."""
    count = min((len(a) for a in arrivals), default=0)
    if len(arrivals) < 2 or count == 0:
        return [None] * len(arrivals)
    out = []
    for r, mine in enumerate(arrivals):
        others = [a for o, a in enumerate(arrivals) if o != r]
        out.append(statistics.median(
            mine[s] - statistics.median(a[s] for a in others) for s in range(count)))
    return out


def straggler_of(late: list[float | None]) -> tuple[int | None, float | None]:
    """The latest rank and its lateness (ms), from :func:`lateness`."""
    known = [(v, r) for r, v in enumerate(late) if v is not None]
    if not known:
        return None, None
    value, rank = max(known)
    return rank, value


def waited_ms(step: dict[str, Any]) -> float:
    """The time a rank spent in its step's first collective (analysis/metrics/ranks.py): a
    rank that arrives late waits the least inside it, the others wait for it. Tables made
    before ``first_comm_ms`` was recorded: the step's whole communication time."""
    if "first_comm_ms" not in step:
        return step["comm_ms"]
    first = step["first_comm_ms"]
    return 0.0 if empty_cell(first) else first  # a step without a collective


def comm_arrivals(per_rank: dict[int, list[dict[str, Any]]]) -> list[list[float]]:
    """The time in the first collective as an arrival (later = larger)."""
    return [[-waited_ms(s) for s in per_rank[r]] for r in sorted(per_rank)]


def straggler_rows(per_rank: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per step index all ranks have: slowest/fastest rank, spreads, the latest rank."""
    count = min((len(s) for s in per_rank.values()), default=0)
    rows = []
    for i in range(count):
        step = {r: steps[i] for r, steps in per_rank.items()}
        slow = max(step, key=lambda r: step[r]["step_ms"])
        fast = min(step, key=lambda r: step[r]["step_ms"])
        busy = max(step, key=lambda r: step[r]["compute_ms"])
        idle = min(step, key=lambda r: step[r]["compute_ms"])
        late = min(step, key=lambda r: waited_ms(step[r]))
        others = [waited_ms(step[r]) for r in step if r != late]
        rows.append({
            "step": i, "slowest_rank": slow, "fastest_rank": fast,
            "step_spread_ms": step[slow]["step_ms"] - step[fast]["step_ms"],
            "max_compute_rank": busy,
            "compute_spread_ms": step[busy]["compute_ms"] - step[idle]["compute_ms"],
            "late_rank": late,
            "late_ms": statistics.median(others) - waited_ms(step[late]) if others else None,
        })  # fmt: skip
    return rows


def collective_table(per_rank: dict[int, list[dict[str, Any]]], ranks: int
                     ) -> list[dict[str, Any]]:
    """Per (op, bytes) with a known size: count, median time and bandwidths."""
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    for rows in per_rank.values():
        for row in rows:
            if row["bytes"] > 0 and row["time_us"] > 0:
                times[(row["op"], row["bytes"])].append(row["time_us"])
    out = []
    for (op, nbytes), values in sorted(times.items()):
        median = statistics.median(values)
        algbw = nbytes / (median * 1e-6) / 1e9
        factor = bus_factor(op, ranks)
        out.append({"op": op, "bytes": nbytes, "count": len(values), "time_us": median,
                    "algbw_gbps": algbw, "busbw_gbps": algbw * factor if factor else None,
                    "bus_factor": factor})
    return out


def run_metrics(ranks: list[dict[str, Any]], stragglers: list[dict[str, Any]],
                collectives: list[dict[str, Any]], world: int, source: str) -> dict[str, Any]:
    metrics: dict[str, Any] = {"status": "ok", "world_size": world, "timeline_source": source}
    for key in (*MEANS, "overlap", "exposed_comm_share"):
        metrics[key] = _mean([r[key] for r in ranks])
    spreads = [s["step_spread_ms"] for s in stragglers]
    metrics["step_spread_ms"] = _mean(spreads)
    metrics["compute_spread_ms"] = _mean([s["compute_spread_ms"] for s in stragglers])
    busiest = [s["max_compute_rank"] for s in stragglers]
    metrics["max_compute_rank"] = max(set(busiest), key=busiest.count) if busiest else None
    metrics["straggler_rank"], metrics["straggler_ms"] = straggler_of(
        [r["late_ms"] for r in ranks])
    reduces = [c for c in collectives if c["op"] == "all_reduce"]
    largest = max(reduces, key=lambda c: c["bytes"]) if reduces else None
    metrics["allreduce_bytes"] = largest["bytes"] if largest else None
    metrics["allreduce_busbw_gbps"] = largest["busbw_gbps"] if largest else None
    metrics["collective_ops"] = sorted({c["op"] for c in collectives})
    return metrics


def write_csv(path: Path, header: list[str], rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def analyze(exports: list[Path], buckets: list[int] | None = None
            ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """The tables and metrics of one run's per-rank exports (rank r = exports[r]); ``buckets``:
    the record's DDP buckets (analysis/metrics/ranks.py: rank_timeline)."""
    steps: dict[int, list[dict[str, Any]]] = {}
    colls: dict[int, list[dict[str, Any]]] = {}
    sources = set()
    for rank, path in enumerate(exports):
        with Export(path) as ex:
            tl = rank_timeline(ex, buckets)
        sources.add(tl.source)
        steps[rank] = step_breakdown(tl)
        colls[rank] = collective_rows(tl)
    return across_ranks(steps, colls, "/".join(sorted(sources)))


def across_ranks(steps: dict[int, list[dict[str, Any]]], colls: dict[int, list[dict[str, Any]]],
                 source: str) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """The tables and metrics from every rank's step rows (analysis/metrics/ranks.py:
    step_breakdown) and collective rows (collective_rows)."""
    world = len(steps)
    ranks = [rank_summary(r, s) for r, s in sorted(steps.items())]
    for row, late in zip(ranks, lateness(comm_arrivals(steps)), strict=True):
        row["late_ms"] = late
    stragglers = straggler_rows(steps)
    collectives = collective_table(colls, world)
    tables = {
        "rank_steps": [{"rank": r, **row} for r, rows in sorted(steps.items()) for row in rows],
        "ranks": ranks, "steps": stragglers, "collectives": collectives,
    }
    return tables, run_metrics(ranks, stragglers, collectives, world, source)


def write_rank_analysis(exports: list[Path], times: Path, outdir: Path) -> dict[str, Any]:
    outdir.mkdir(parents=True, exist_ok=True)
    record = json.loads(times.read_text()) if times.is_file() else {}
    status = record.get("status", "error")
    if status != "ok":
        tables: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
        metrics: dict[str, Any] = {"status": status, "message": record.get("message")}
    else:
        tables, metrics = analyze(exports, (record.get("distributed") or {}).get("buckets"))
    for name, header in TABLES.items():
        write_csv(outdir / f"{name}.csv", header, tables[name])
    (outdir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


__all__ = ["TABLES", "across_ranks", "analyze", "bus_factor", "lateness", "straggler_of",
           "write_rank_analysis"]
