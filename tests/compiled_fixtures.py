"""Real compiled H100 captures for the kernel-map tests, and SQL to check them against.

Each fixture is ``tests/fixtures/h100/<stem>.sqlite`` (the nsys export), ``<stem>.json`` (the
run record the capture wrote) and ``<stem>_torch_trace/`` (its TORCH_TRACE, trimmed:
tests/fixtures/README-analysis.md).  Adding a capture (e.g. the 2.7B ones of the publishing
run) is adding its stem to ``COMPILED``.

These captures predate the module-path line Inductor's stack traces now carry
(workloads/steps.py ``track_module_paths``): their call sites have no module path, so the
analysis gives them phases, categories and call sites but no layers or sublayers.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from analysis.metrics.attribution import Attribution, attribute
from analysis.metrics.gpuops import GpuOps, gpu_ops
from analysis.metrics.modules import structure_of
from analysis.metrics.phases import OpPhases, op_phases
from analysis.reading.export import Export
from analysis.reading.torchtrace import CompiledGraph, read_torch_trace

H100 = Path(__file__).parent / "fixtures" / "h100"
COMPILED = ["compiled_small_default", "compiled_small_reduce-overhead"]
# The ladder's compile / cuda_graphs rungs: fused AdamW (not compiled) and autocast's weight
# casts inside the compiled graphs, which Inductor moves across layers.
AUTOCAST_WEIGHTS = ["compiled_small_fused_default", "compiled_small_fused_reduce-overhead"]
# The same rungs with the block compiled once (compile_blocks once: a nested compile region
# whose code every layer calls).
BLOCK_ONCE = ["compiled_small_once_default", "compiled_small_once_reduce-overhead"]


@dataclass
class CompiledRun:
    stem: str
    sqlite: Path
    record: dict
    trace: Path
    ops: GpuOps
    phases: OpPhases
    graphs: list[CompiledGraph]
    attribution: Attribution
    export: Export


@cache
def compiled_run(stem: str) -> CompiledRun:
    """The fixture with its ops, phases and kernel-map attribution (computed once)."""
    sqlite = H100 / f"{stem}.sqlite"
    record = json.loads((H100 / f"{stem}.json").read_text())
    trace = H100 / f"{stem}_torch_trace"
    ex = Export(sqlite)
    ops = gpu_ops(ex)
    phases = op_phases(ex, ops)
    graphs = read_torch_trace(trace)
    return CompiledRun(stem, sqlite, record, trace, ops, phases, graphs,
                       attribute(ops, phases.phase, graphs, structure_of(record)), ex)


def query(path: Path, sql: str, *args: object) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(sql, args).fetchall()


# Every GPU op with its duration, kernel name ('[memset]'/'[memcpy]' for memory ops) and the
# name and start of its launch call (same correlationId and process).
OPS_SQL = """
WITH ops AS (
  SELECT k.correlationId c, k.globalPid p, k.end - k.start dur, s.value name
  FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName
  UNION ALL SELECT correlationId, globalPid, end - start, '[memset]'
  FROM CUPTI_ACTIVITY_KIND_MEMSET
  {memcpy}
)
SELECT o.dur, o.name, a.value, r.start
FROM ops o JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
  ON r.correlationId = o.c AND o.p / 16777216 = r.globalTid / 16777216
JOIN StringIds a ON a.id = r.nameId
"""


def sql_ops(path: Path) -> list[tuple[int, str, str, int]]:
    """(duration, name, launch API, launch start) of every GPU op, by SQL."""
    has_memcpy = query(path, "SELECT count(*) FROM sqlite_master WHERE name = "
                             "'CUPTI_ACTIVITY_KIND_MEMCPY'")[0][0]
    memcpy = ("UNION ALL SELECT correlationId, globalPid, end - start, '[memcpy]' "
              "FROM CUPTI_ACTIVITY_KIND_MEMCPY") if has_memcpy else ""
    return query(path, OPS_SQL.format(memcpy=memcpy))


def sql_ranges(path: Path, name: str) -> list[tuple[int, int]]:
    """(start, end) of the closed NVTX ranges called ``name``."""
    return query(path, "SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                       "ON s.id = e.textId WHERE coalesce(s.value, e.text) = ? "
                       "AND e.end IS NOT NULL", name)


def sql_phase_ns(path: Path, *phases: str) -> int:
    """GPU time of the ops launched inside any of the ``phases`` ranges (SQL + Python)."""
    ranges = [r for p in phases for r in sql_ranges(path, p)]
    return sum(dur for dur, _, _, t in sql_ops(path) if any(s <= t <= e for s, e in ranges))
