"""The Perfetto trace of a capture's measured steps (analysis/outputs/trace.py), on real H100
and H200 captures: read back with Perfetto's own proto definitions and loaded into Perfetto's
trace processor (the UI's WebAssembly build, tests/perfetto_engine.py), and held against the
export itself: the same window computed here with plain SQL, the kernels per stream counted
and summed with plain SQL."""

from __future__ import annotations

import gzip
import re
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent
from perfetto_engine import TraceProcessor

from analysis.cli import main
from analysis.metrics.extras import RunInputs
from analysis.outputs.style import has_data
from analysis.outputs.trace import TIMELINE_FILE, TRACE_FILE, write_run_trace

FIXTURES = Path(__file__).parent / "fixtures"
H100, H200 = FIXTURES / "h100", FIXTURES / "h200x2"
RO = H100 / "compiled_small_fused_reduce-overhead"
MODEL = H100 / "models" / "model_compiled"
# (exports, record, TORCH_TRACE): eager, compiled with CUDA graphs, one DDP rank, a model
CASES = {
    "eager": ([H100 / "gpt_small_train_bf16_ctx512.sqlite"], None, None),
    "cuda_graphs": ([RO.with_suffix(".sqlite")], RO.with_suffix(".json"),
                    RO.parent / (RO.name + "_torch_trace")),
    "ddp_rank": ([H200 / "gpt_small_ddp2_rank1.sqlite"], None, None),
    "model_compiled": ([MODEL / "profile.sqlite"], MODEL / "times.json", MODEL / "torch_trace"),
}
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
GPU_TABLES = (KERNEL, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
STREAM_TRACK = re.compile(r"^GPU (\d+) stream (\d+)(?: \(\d+\))?$")


# -- the export, in plain SQL ---------------------------------------------------------------------
def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def sql_window(path: Path) -> tuple[int, int]:
    """The default window: the median profiled_step by host time and the next (the one
    before for the last), to the end of the last GPU op launched inside them."""
    with _connect(path) as con:
        steps = con.execute(
            "SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId"
            " WHERE e.eventType IN (59, 70) AND e.end IS NOT NULL"
            " AND coalesce(s.value, e.text) = 'profiled_step' ORDER BY e.start").fetchall()
        n = len(steps)
        median = sorted(range(n), key=lambda i: (steps[i][1] - steps[i][0], i))[(n - 1) // 2]
        chosen = [median, median + 1] if median + 1 < n else [median - 1, median]
        lo, hi = steps[chosen[0]][0], steps[chosen[-1]][1]
        last = hi
        tables = {t for (t,) in con.execute("SELECT name FROM sqlite_master")}
        for table in tables.intersection(GPU_TABLES):
            (end,) = con.execute(
                f"SELECT max(g.end) FROM {table} g JOIN CUPTI_ACTIVITY_KIND_RUNTIME r"
                " ON r.correlationId = g.correlationId"
                " AND (r.globalTid & -16777216) = g.globalPid"
                " WHERE r.start BETWEEN ? AND ?", (lo, hi)).fetchone()
            last = max(last, end or last)
    return lo, last


def sql_kernels(path: Path, lo: int, hi: int) -> dict[tuple[int, int], tuple[int, int]]:
    """(device, stream) -> (kernels, summed kernel time) of the kernels overlapping [lo, hi]."""
    with _connect(path) as con:
        rows = con.execute(f"SELECT deviceId, streamId, count(*), sum(end - start) FROM {KERNEL}"
                           " WHERE end >= ? AND start <= ? GROUP BY 1, 2", (lo, hi)).fetchall()
    return {(d, s): (n, t) for d, s, n, t in rows}


def sql_count(path: Path, sql: str, lo: int, hi: int) -> int:
    with _connect(path) as con:
        return con.execute(sql, (lo, hi)).fetchone()[0]


GRAPH_NODES = (f"SELECT count(*) FROM {KERNEL} WHERE end >= ? AND start <= ?"
               " AND graphNodeId IS NOT NULL")
API_CALLS = "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE end >= ? AND start <= ?"
NVTX_RANGES = ("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71)"
               " AND end IS NOT NULL AND end >= start AND end >= ? AND start <= ?")


def session_ns(path: Path) -> int:
    with _connect(path) as con:
        return con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]


# -- the trace, through Perfetto's proto definitions ------------------------------------------
def parse(path: Path) -> dict:
    """Slices per track name (name, start, end, category, args) and the processes, from
    the packets as Perfetto's protos read them; begin/end must pair up per track."""
    trace = Trace()
    trace.ParseFromString(gzip.decompress(path.read_bytes()))
    names, cats, arg_names, arg_strings = {}, {}, {}, {}
    tracks, processes, open_slices = {}, {}, defaultdict(list)
    slices = defaultdict(list)
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks[d.uuid] = d
            if d.HasField("process"):
                processes[d.uuid] = d.process
        if p.HasField("interned_data"):
            i = p.interned_data
            names.update({e.iid: e.name for e in i.event_names})
            cats.update({e.iid: e.name for e in i.event_categories})
            arg_names.update({e.iid: e.name for e in i.debug_annotation_names})
            arg_strings.update({e.iid: e.str.decode() for e in i.debug_annotation_string_values})
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        assert e.track_uuid in tracks, "an event on a track that was never described"
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:
            args = {arg_names[a.name_iid]: (arg_strings[a.string_value_iid]
                                            if a.HasField("string_value_iid") else a.int_value)
                    for a in e.debug_annotations}
            open_slices[e.track_uuid].append((names[e.name_iid], p.timestamp,
                                              cats[e.category_iids[0]], args))
        else:
            assert e.type == TrackEvent.TYPE_SLICE_END
            name, start, cat, args = open_slices[e.track_uuid].pop()
            assert p.timestamp >= start
            slices[e.track_uuid].append((name, start, p.timestamp, cat, args))
    assert not any(open_slices.values()), "a slice began and never ended"
    return {"tracks": tracks, "processes": processes, "slices": slices}


def _track_name(parsed: dict, uuid: int) -> str:
    d = parsed["tracks"][uuid]
    return d.name if d.HasField("name") else f"thread {d.thread.tid}"


def trace_kernels(parsed: dict, process: int | None = None
                  ) -> dict[tuple[int, int], tuple[int, int]]:
    """(device, stream) -> (kernels, summed time) of the GPU stream tracks (of a process)."""
    out: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for uuid, rows in parsed["slices"].items():
        track = parsed["tracks"][uuid]
        match = STREAM_TRACK.match(track.name)
        if not match or (process is not None and track.parent_uuid != process):
            continue
        key = (int(match.group(1)), int(match.group(2)))
        for name, start, end, _, _ in rows:
            if not name.startswith("[CUDA mem"):
                out[key][0] += 1
                out[key][1] += end - start
    return {k: (n, t) for k, (n, t) in out.items()}


def _write(tmp_path: Path, case: str, steps: str = "median") -> Path:
    exports, record, torch_trace = CASES[case]
    write_run_trace(exports, tmp_path, steps, RunInputs.load(record, torch_trace), case)
    return tmp_path / TRACE_FILE


@pytest.mark.parametrize("case", sorted(CASES))
def test_trace_has_the_exports_kernels_per_stream(tmp_path: Path, case: str) -> None:
    path = _write(tmp_path, case)
    export = CASES[case][0][0]
    lo, hi = sql_window(export)
    parsed = parse(path)
    expected = sql_kernels(export, lo, hi)
    assert sum(n for n, _ in expected.values()) > 100
    assert trace_kernels(parsed) == expected
    gpu = [args for uuid, rows in parsed["slices"].items()
           if STREAM_TRACK.match(_track_name(parsed, uuid)) for *_, args in rows]
    # every op has its category and the kernels their launch configuration
    assert all("category" in a for a in gpu)
    assert sum("grid" in a and "block" in a for a in gpu) == sum(n for n, _ in expected.values())
    assert sum("graph node" in a for a in gpu) == sql_count(export, GRAPH_NODES, lo, hi)
    assert (tmp_path / TIMELINE_FILE).is_file()


def test_cuda_graph_node_kernels_are_in_the_trace(tmp_path: Path) -> None:
    """The reduce-overhead capture replays CUDA graphs (--cuda-graph-trace=node): their
    kernels are slices of their own, with their graph node and phase. The capture predates
    the module-path line of compiled code's stack traces: its kernels have no layer."""
    parsed = parse(_write(tmp_path, "cuda_graphs"))
    export = CASES["cuda_graphs"][0][0]
    nodes = [args for rows in parsed["slices"].values() for *_, args in rows
             if "graph node" in args]
    lo, hi = sql_window(export)
    assert len(nodes) == sql_count(export, GRAPH_NODES, lo, hi) > 1000
    assert {a.get("layer") for a in nodes} == {None}
    assert {a.get("phase") for a in nodes} >= {"forward_pass", "backward_pass"}


@pytest.mark.parametrize("case", ["cuda_graphs", "eager"])
def test_trace_loads_in_perfetto_trace_processor(tmp_path: Path, case: str) -> None:
    """Perfetto's trace processor reads every slice: kernels per stream as in the export,
    the window's NVTX ranges and CUDA API calls, an arrow from each launch call to its ops,
    and no import errors."""
    path = _write(tmp_path, case)
    export = CASES[case][0][0]
    lo, hi = sql_window(export)
    with TraceProcessor(path) as tp:
        problems = tp.query("SELECT name, idx, value FROM stats WHERE value > 0"
                            " AND severity IN ('error', 'data_loss')")
        rows = tp.query("SELECT t.name AS track, count(*) AS n, sum(s.dur) AS total"
                        " FROM slice s JOIN track t ON s.track_id = t.id"
                        " WHERE t.name GLOB 'GPU * stream *' AND s.name NOT GLOB '[[]CUDA mem*'"
                        " GROUP BY t.name")
        by_category = {r["category"]: r["n"] for r in tp.query(
            "SELECT category, count(*) AS n FROM slice GROUP BY category")}
        flows = tp.query("SELECT count(*) AS n FROM flow")[0]["n"]
        nodes = tp.query("SELECT count(*) AS n FROM slice s JOIN args a USING (arg_set_id)"
                         " WHERE a.key = 'debug.graph node'")[0]["n"]
    assert problems == []
    kernels: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        match = STREAM_TRACK.match(r["track"])
        kernels[(int(match.group(1)), int(match.group(2)))][0] += r["n"]
        kernels[(int(match.group(1)), int(match.group(2)))][1] += r["total"]
    assert {k: tuple(v) for k, v in kernels.items()} == sql_kernels(export, lo, hi)
    assert by_category["nvtx"] == sql_count(export, NVTX_RANGES, lo, hi)
    assert by_category["cuda_api"] == sql_count(export, API_CALLS, lo, hi)
    assert nodes == sql_count(export, GRAPH_NODES, lo, hi)
    # a flow joins a launch call to its op (a graph launch: through its node kernels)
    assert flows >= 0.9 * sum(n for n, _ in sql_kernels(export, lo, hi).values())


def test_ranks_are_processes_on_one_clock(tmp_path: Path) -> None:
    """Two ranks' exports: one process per rank (their RANK), each with its own kernels per
    stream, its timestamps moved by the difference of the captures' session starts."""
    exports = [H200 / "gpt_small_fsdp2_rank0.sqlite", H200 / "gpt_small_ddp2_rank1.sqlite"]
    write_run_trace(exports, tmp_path)
    parsed = parse(tmp_path / TRACE_FILE)
    first = min(session_ns(p) for p in exports)
    by_rank = {}
    for uuid, proc in parsed["processes"].items():
        match = re.match(r"^rank (\d+) · ", proc.process_name)
        if match and any(parsed["tracks"][u].parent_uuid == uuid for u in parsed["slices"]):
            by_rank[int(match.group(1))] = uuid
    assert sorted(by_rank) == [0, 1]
    for rank, export in enumerate(exports):
        lo, hi = sql_window(export)
        expected = sql_kernels(export, lo, hi)
        assert trace_kernels(parsed, by_rank[rank]) == expected
        with _connect(export) as con:
            (earliest,) = con.execute(f"SELECT min(start) FROM {KERNEL} WHERE end >= ?"
                                      " AND start <= ?", (lo, hi)).fetchone()
        starts = [s for u, rows in parsed["slices"].items()
                  if parsed["tracks"][u].parent_uuid == by_rank[rank]
                  and STREAM_TRACK.match(parsed["tracks"][u].name) for _, s, *_ in rows]
        assert min(starts) == earliest + session_ns(export) - first


def test_a_failed_run_gets_an_empty_trace_and_a_placeholder(tmp_path: Path) -> None:
    record = tmp_path / "times.json"
    record.write_text('{"status": "oom", "message": "CUDA out of memory"}')
    write_run_trace([tmp_path / "profile.sqlite"], tmp_path / "out", run=RunInputs.load(record))
    assert parse(tmp_path / "out" / TRACE_FILE)["slices"] == {}
    assert not has_data(tmp_path / "out" / TIMELINE_FILE)


def test_steps_choose_the_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    export = CASES["eager"][0][0]
    assert main(["trace", str(export), "-o", str(tmp_path), "--steps", "3-4"]) == 0
    assert "ui.perfetto.dev" in capsys.readouterr().out
    with _connect(export) as con:
        steps = con.execute(
            "SELECT e.start, e.end FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId"
            " WHERE s.value = 'profiled_step' ORDER BY e.start").fetchall()
    expected = sql_kernels(export, steps[3][0], steps[4][1])
    assert trace_kernels(parse(tmp_path / TRACE_FILE)) == expected
    assert main(["trace", str(export), "-o", str(tmp_path), "--steps", "10"]) == 2
    assert "measured steps 0-9" in capsys.readouterr().err


def test_two_ranks_of_one_run_share_the_clock(tmp_path: Path) -> None:
    """Both ranks of one DDP run (CPU, gloo): a gradient all-reduce completes on both ranks
    at once, so on one clock the two ranks' ``comm all_reduce`` ranges of a step end
    together (0.15 ms apart here); on the captures' own clocks (each from its session
    start) no pair comes within 10 ms."""
    run = FIXTURES / "cpu" / "gpt_tiny_ddp2"
    exports = [run / "profile.rank0.sqlite", run / "profile.rank1.sqlite"]
    write_run_trace(exports, tmp_path, run=RunInputs.load(run / "times.json"))
    parsed = parse(tmp_path / TRACE_FILE)
    ends: dict[str, list[int]] = defaultdict(list)
    for uuid, rows in parsed["slices"].items():
        proc = parsed["processes"].get(parsed["tracks"][uuid].parent_uuid)
        if proc is not None:
            ends[proc.process_name.split(" · ")[0]] += [e for name, _, e, *_ in rows
                                                        if name.startswith("comm all_reduce")]
    assert sorted(ends) == ["rank 0", "rank 1"]
    pairs = list(zip(sorted(ends["rank 0"]), sorted(ends["rank 1"]), strict=True))
    assert len(pairs) >= 2
    assert min(abs(a - b) for a, b in pairs) < 1_000_000
    apart = session_ns(exports[0]) - session_ns(exports[1])
    assert min(abs(a - apart - b) for a, b in pairs) > 10_000_000  # the captures' own clocks
