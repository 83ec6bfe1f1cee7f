"""The layers and sublayers of the committed H100 eager GPT captures, read from how their
ranges nest (analysis/metrics/rangetree.py), against the reading these captures were
published with, computed here independently by SQL: a ``layer_<i>`` range is a layer, an
``*_sublayer`` range a sublayer, and a range's GPU time is that of the ops whose launch call
starts inside one of its instances (any thread of the process). The layer and sublayer
tables must stay within 2%."""

from __future__ import annotations

import bisect
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from analysis.metrics.phases import phase_table
from analysis.reading.export import Export

H100 = Path(__file__).parent / "fixtures" / "h100"
EAGER_GPT = ["gpt_small_train_bf16_ctx512", "gpt_small_train_fp32_ctx512"]
TOLERANCE = 0.02


def _query(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(sql).fetchall()


def _sql_ranges(path: Path) -> dict[str, list[tuple[int, int]]]:
    """Closed NVTX ranges by name (nsys 2025's leading ':' of the default domain dropped)."""
    rows = _query(path, "SELECT coalesce(s.value, e.text), e.start, e.end FROM NVTX_EVENTS e "
                        "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.end IS NOT NULL "
                        "AND e.end >= e.start")
    out: dict[str, list[tuple[int, int]]] = {}
    for name, start, end in rows:
        if name is not None:
            out.setdefault(name.removeprefix(":"), []).append((start, end))
    return out


def _sql_launches(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(launch start, GPU duration) of every kernel, memcpy and memset, sorted by launch."""
    tables = [t for (t,) in _query(path, "SELECT name FROM sqlite_master WHERE name IN "
                                         "('CUPTI_ACTIVITY_KIND_KERNEL', "
                                         "'CUPTI_ACTIVITY_KIND_MEMCPY', "
                                         "'CUPTI_ACTIVITY_KIND_MEMSET')")]
    ops = " UNION ALL ".join(f"SELECT correlationId c, globalPid p, end - start d FROM {t}"
                             for t in tables)
    rows = _query(path, f"SELECT r.start, o.d FROM ({ops}) o JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                        "ON r.correlationId = o.c AND o.p / 16777216 = r.globalTid / 16777216 "
                        "ORDER BY r.start")
    return np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], np.int64)


def _sql_ns(launch: np.ndarray, dur: np.ndarray, ranges: list[tuple[int, int]]) -> int:
    """GPU time of the ops launched inside the union of ``ranges``."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    cum = np.r_[0, np.cumsum(dur)]
    total = 0
    for start, end in merged:
        lo = bisect.bisect_left(launch, start)
        hi = bisect.bisect_right(launch, end)
        total += int(cum[hi] - cum[lo])
    return total


def _by_old_names(path: Path) -> dict[str, dict[str, int]]:
    """kind -> name -> GPU ns, by the published reading of these captures' range names."""
    ranges = _sql_ranges(path)
    launch, dur = _sql_launches(path)
    out: dict[str, dict[str, int]] = {"layer": {}, "sublayer": {}}
    for name, spans in ranges.items():
        suffix = name.removeprefix("layer_")
        kind = ("layer" if name.startswith("layer_") and suffix.isdigit()
                else "sublayer" if name.endswith("_sublayer") else None)
        if kind:
            out[kind][name] = _sql_ns(launch, dur, spans)
    return out


@pytest.mark.parametrize("stem", EAGER_GPT)
def test_layer_and_sublayer_tables_stay_within_two_percent(stem: str) -> None:
    path = H100 / f"{stem}.sqlite"
    expected = _by_old_names(path)
    assert len(expected["layer"]) == 12 and len(expected["sublayer"]) == 2
    rows = phase_table(Export(path))
    worst = 0.0
    for kind in ("layer", "sublayer"):
        found = {str(r["Range"]): int(r["GPU Time (ns)"]) for r in rows if r["Kind"] == kind}
        assert set(found) == set(expected[kind]), kind
        for name, ns in expected[kind].items():
            assert ns > 0
            worst = max(worst, abs(found[name] - ns) / ns)
    print(f"{stem}: max relative difference of the layer and sublayer rows {worst:.2e}")
    assert worst <= TOLERANCE
