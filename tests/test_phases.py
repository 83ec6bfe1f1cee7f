"""GPU time per phase (analysis/metrics/phases.py) on real H100 train captures, checked
against the same rule computed independently in SQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from analysis.metrics.phases import PHASES, phase_summary, phase_table
from analysis.reading.export import Export

FIXTURES = Path(__file__).parent / "fixtures" / "h100"
TRAIN = ["gpt_small_train_fp32_ctx512", "gpt_small_train_bf16_ctx512"]

# The rule in SQL: every GPU op whose launch call (same process, same correlationId) starts
# inside an instance of the range, on any thread of that process.
SQL = """
WITH ops AS (
  SELECT correlationId, globalPid, end - start AS dur FROM CUPTI_ACTIVITY_KIND_KERNEL
  UNION ALL SELECT correlationId, globalPid, end - start FROM CUPTI_ACTIVITY_KIND_MEMCPY
  UNION ALL SELECT correlationId, globalPid, end - start FROM CUPTI_ACTIVITY_KIND_MEMSET
),
launched AS (
  SELECT o.dur, r.start AS t, r.globalTid / 16777216 AS pid
  FROM ops o JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
    ON r.correlationId = o.correlationId AND o.globalPid / 16777216 = r.globalTid / 16777216
),
ranges AS (
  SELECT e.start, e.end, e.globalTid / 16777216 AS pid
  FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId
  WHERE s.value = ? AND e.end IS NOT NULL
)
SELECT COALESCE(SUM(l.dur), 0) FROM launched l
WHERE EXISTS (SELECT 1 FROM ranges g WHERE g.pid = l.pid AND l.t BETWEEN g.start AND g.end)
"""


def sql_phase_ns(path: Path, name: str) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(SQL, (name,)).fetchone()[0]


def sql_total_gpu_ns(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return sum(
            con.execute(f"SELECT COALESCE(SUM(end - start), 0) FROM {t}").fetchone()[0]
            for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                      "CUPTI_ACTIVITY_KIND_MEMSET")
        )


@pytest.fixture(scope="module", params=TRAIN)
def capture(request: pytest.FixtureRequest) -> tuple[Path, dict[str, dict]]:
    path = FIXTURES / f"{request.param}.sqlite"
    rows = phase_table(Export(path))
    return path, {r["Range"]: r for r in rows}


def test_backward_gets_its_gpu_time(capture: tuple[Path, dict[str, dict]]) -> None:
    """nsys's projection gives backward_pass ~nothing (autograd's thread launches it)."""
    _, rows = capture
    backward, forward = rows["backward_pass"], rows["forward_pass"]
    assert backward["GPU Time (ns)"] > 0 and backward["Ops"] > 1000
    assert 1.5 <= backward["GPU Time (ns)"] / forward["GPU Time (ns)"] <= 2.5


def test_phases_add_up_to_the_step(capture: tuple[Path, dict[str, dict]]) -> None:
    path, rows = capture
    phases = sum(rows[p]["GPU Time (ns)"] for p in PHASES)
    total = sql_total_gpu_ns(path)
    assert phases == pytest.approx(total, rel=0.01)
    assert phases >= 0.95 * rows["profiled_step"]["GPU Time (ns)"]
    summary = phase_summary(list(rows.values()))
    assert summary["phase_gpu_coverage"] == pytest.approx(1.0, abs=0.01)
    steps = rows["profiled_step"]["Instances"]
    assert summary["phase_gpu_ms_backward_pass"] == pytest.approx(
        rows["backward_pass"]["GPU Time (ns)"] / steps / 1e6
    )


@pytest.mark.parametrize("name", [*PHASES, "profiled_step", "layer_0", "attention_sublayer"])
def test_matches_the_rule_in_sql(capture: tuple[Path, dict[str, dict]], name: str) -> None:
    path, rows = capture
    assert rows[name]["GPU Time (ns)"] == sql_phase_ns(path, name)


def test_no_nvtx_gives_no_rows() -> None:
    assert phase_table(Export(Path(__file__).parent / "fixtures/cpu/cpu_no_nvtx.sqlite")) == []
