"""Compiled kernels mapped to call sites and model places (analysis/metrics/attribution.py),
on real compiled H100 captures with their TORCH_TRACE, checked against counts taken
independently from the same export by SQL.

These captures predate the module-path line of Inductor's stack traces: the analysis reads
their phases, categories and call sites, and no layers or sublayers (it does not read the
model's source). Captures made with the line have their layers from module paths
(tests/gpu/make_compiled_gpt_fixtures.sh makes them)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from compiled_fixtures import (
    AUTOCAST_WEIGHTS,
    BLOCK_ONCE,
    COMPILED,
    compiled_run,
    query,
    sql_ops,
    sql_phase_ns,
    sql_ranges,
)

from analysis.metrics.attribution import ANCHOR, EXTERN, GLUE, ORDERED, UNMATCHED
from analysis.metrics.categories import CATEGORIES
from analysis.metrics.extras import op_categories
from analysis.metrics.kernelmap import attribution_metrics
from analysis.metrics.phases import PHASES, phase_table
from workloads.structure import MODULE_PATH_LINE

REPO = Path(__file__).resolve().parents[1]
# Eager PyTorch launches through the CUDA runtime; Inductor's Triton kernels, cuBLASLt and
# cuDNN through the driver (cuLaunchKernel[Ex]), cuDNN's memsets through cudaMemsetAsync.
EAGER_APIS = ("cudaLaunchKernel", "cudaMemcpyAsync")


@pytest.fixture(scope="module", params=COMPILED + AUTOCAST_WEIGHTS + BLOCK_ONCE)
def any_run(request: pytest.FixtureRequest):
    """Every compiled fixture, the ladder's autocast rungs included (layer tests)."""
    return compiled_run(request.param)


@pytest.fixture(scope="module", params=COMPILED + BLOCK_ONCE)
def run(request: pytest.FixtureRequest):
    return compiled_run(request.param)


def _steps(path: Path) -> int:
    return len(sql_ranges(path, "profiled_step"))


def test_every_triton_kernel_instance_is_matched(run) -> None:
    (count,) = query(run.sqlite, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN "
                     "StringIds s ON s.id = k.demangledName WHERE s.value LIKE 'triton%'")[0]
    a = run.attribution
    assert count > 0
    assert int((a.op_status == ANCHOR).sum()) == count
    assert int((a.op_status == UNMATCHED).sum()) == 0


def test_each_graph_runs_once_per_step(run) -> None:
    """Per Triton name, the SQL count = steps x its call sites over all graphs."""
    steps = _steps(run.sqlite)
    a = run.attribution
    for g in range(len(run.graphs)):
        assert len(set(a.op_invocation[a.op_graph == g].tolist())) == steps, run.graphs[g].aot_id
    sites = Counter(name for g in run.graphs for name in g.triton_names)
    counted = dict(query(run.sqlite, "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                         "k JOIN StringIds s ON s.id = k.demangledName WHERE s.value LIKE "
                         "'triton%' GROUP BY s.value"))
    assert counted == {name: n * steps for name, n in sites.items()}


def test_glue_is_exactly_the_eagerly_launched_code(run) -> None:
    """Ops launched by eager PyTorch (runtime API) are glue; all others are compiled code."""
    rows = sql_ops(run.sqlite)
    eager = [(d, n) for d, n, api, _ in rows if api.startswith(EAGER_APIS)]
    status = run.attribution.op_status
    glue = status == GLUE
    assert int(glue.sum()) == len(eager) > 0
    assert int(run.ops.dur[glue].sum()) == sum(d for d, _ in eager)
    assert np.isin(status[~glue], (ANCHOR, EXTERN)).all()  # nothing assigned only by order
    assert not (status == ORDERED).any()


def test_externs_get_kernels_of_their_kind(run) -> None:
    a, ops = run.attribution, run.ops
    for op in np.flatnonzero(a.op_status == EXTERN).tolist():
        kernel = run.graphs[a.op_graph[op]].sites[a.op_site[op]].kernel
        name = ops.name(op)
        if name.startswith("[CUDA mem"):
            continue  # a library call's workspace memset
        if "attention" in kernel:
            assert re.search(r"cudnn|sdpa|dot_do_o|convert_dq", name), (kernel, name)
        else:
            assert kernel == "extern_kernels.mm", kernel
            assert re.search(r"nvjet|gemm|xmma|cutlass", name, re.I), (kernel, name)


def test_without_module_paths_no_site_has_a_place(any_run) -> None:
    """No stack trace of these captures names a module: every call site is placed nowhere,
    and so no layer is found (no guess from the model's source)."""
    run = any_run
    marker = MODULE_PATH_LINE.split("{}")[0]
    assert not any(marker in t for g in run.graphs for s in g.sites for t in s.stack_traces)
    assert all(s.stack_traces for g in run.graphs for s in g.sites)  # Python frames only
    places = [p for row in run.attribution.places for p in row]
    assert places and all(p.path == "" and p.layer is None and p.sublayer is None
                          for p in places)


def test_phases_and_categories_without_layers(any_run) -> None:
    run = any_run
    rows = {r["Range"]: r for r in phase_table(run.export, run.ops, run.phases)}
    fwd_bwd = sql_phase_ns(run.sqlite, "forward_pass", "backward_pass")
    assert rows["forward_pass"]["GPU Time (ns)"] + rows["backward_pass"]["GPU Time (ns)"] \
        == fwd_bwd
    assert not {r["Kind"] for r in rows.values()} & {"layer", "sublayer", "module"}
    assert all(r["Basis"] in ("nvtx range", "") for r in rows.values())
    # categories: every GEMM and attention kernel by SQL lands in its category
    category = op_categories(run.ops, run.phases, run.attribution)
    names = np.array(run.ops.names)[run.ops.name_code]
    for cat, pattern in (("GEMM", r"nvjet|gemm|xmma|cutlass"),
                         ("Attention", r"cudnn|sdpa|dot_do_o|convert_dq|flash|fmha")):
        by_sql = sum(d for d, n, _, _ in sql_ops(run.sqlite) if re.search(pattern, n, re.I))
        mine = np.array([bool(re.search(pattern, n, re.I)) for n in names])
        assert by_sql > 0 and int(run.ops.dur[mine].sum()) == by_sql
        assert (np.array(CATEGORIES)[category[mine]] == cat).mean() > 0.9, cat
    metrics = attribution_metrics(run.ops, run.phases, run.attribution, list(rows.values()))
    assert metrics["kernel_map"] == "ok" and metrics["kernel_map_layers"] is None
    assert metrics["layer_share_fwd_bwd"] is None
    assert metrics["compiled_share_fwd_bwd"] >= 0.95
    assert metrics["placed_share_fwd_bwd"] == 0.0
    assert metrics["unattributed_share_fwd_bwd"] == pytest.approx(1.0)


def test_cli_writes_the_kernel_map_and_no_layer_rows(run, tmp_path: Path) -> None:
    out = tmp_path / "stats"
    subprocess.run(
        [sys.executable, "-m", "analysis", "all", str(run.sqlite), "-o", str(out),
         "--record", str(run.sqlite.with_suffix(".json")), "--torch-trace", str(run.trace)],
        cwd=REPO, check=True,
    )
    import pandas as pd

    kmap = pd.read_csv(out / "kernel_map.csv")
    assert len(kmap) == sum(len(g.sites) for g in run.graphs)
    matched = np.isin(run.attribution.op_status, (ANCHOR, EXTERN))
    assert kmap["Ops"].sum() == int(matched.sum())
    adamw = kmap[kmap["Function"] == "_adamw_segment"]
    compiled_optimizer = run.record["params"]["optimizer"] == "adamw_master"
    assert set(adamw["Category"]) == ({"Optimizer"} if compiled_optimizer else set())
    assert kmap["Place"].isna().all() and kmap["Layer"].isna().all()
    assert kmap["Source"].str.contains(r"\.py:\d+$").all()  # the innermost frame's line
    phases = pd.read_csv(out / "phase_gpu_time.csv")
    assert not set(phases["Kind"]) & {"layer", "sublayer"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["kernel_map"] == "ok" and metrics["layer_share_fwd_bwd"] is None
    assert pd.read_csv(out / "module_table.csv").empty


def test_a_trace_without_provenance_gives_no_kernel_map(run, tmp_path: Path) -> None:
    """Code from a cache entry made without provenance tracking has no handles: the run
    says so instead of guessing."""
    import gzip

    trace = tmp_path / "trace"
    trace.mkdir()
    for log in run.trace.iterdir():
        text = gzip.open(log, "rt").read()
        stripped = re.sub(r"\n\t[ \t]*# \[Provenance debug handles\][^\n]*", "", text)
        assert stripped != text
        (trace / log.name.removesuffix(".gz")).write_text(stripped)
    out = tmp_path / "stats"
    subprocess.run(
        [sys.executable, "-m", "analysis", "extras", str(run.sqlite), "-o", str(out),
         "--record", str(run.sqlite.with_suffix(".json")), "--torch-trace", str(trace)],
        cwd=REPO, check=True,
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["kernel_map"] == "no kernel map"
    assert metrics["layer_share_fwd_bwd"] is None
    assert (out / "kernel_map.csv").read_text().count("\n") == 1  # the header only


# -- whole-step CUDA graphs: phases by node counts -------------------------------------------
def _replays(path: Path) -> dict[int, tuple[int, list[int]]]:
    """Per CUDA-graph launch (correlationId): its launch start and its ops' durations in
    start order, by SQL."""
    launches = dict(query(path, "SELECT r.correlationId, r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME"
                                " r JOIN StringIds a ON a.id = r.nameId WHERE a.value LIKE "
                                "'cudaGraphLaunch%'"))
    ops: dict[int, list[tuple[int, int]]] = {}
    for table in ("KERNEL", "MEMSET", "MEMCPY"):
        if not query(path, "SELECT count(*) FROM sqlite_master WHERE name = ?",
                     f"CUPTI_ACTIVITY_KIND_{table}")[0][0]:
            continue
        for corr, start, dur in query(path, f"SELECT correlationId, start, end - start FROM "
                                            f"CUPTI_ACTIVITY_KIND_{table}"):
            if corr in launches:
                ops.setdefault(corr, []).append((start, dur))
    return {c: (launches[c], [d for _, d in sorted(o)]) for c, o in ops.items()}


def _half_of_the_biggest_replay(path: Path) -> list[dict]:
    """Made-up graph_phases for the reduce-overhead capture: its biggest graph (the model's
    backward, one replay per step) split in half between backward and optimizer."""
    size = max(len(durations) for _, durations in _replays(path).values())
    return [{"phase": "backward_pass", "nodes": size // 2},
            {"phase": "optimizer_step", "nodes": size}]


# (fixture, graph_phases maker): a real whole-step graph capture is added with None (its
# record carries graph_phases); until then the reduce-overhead capture stands in.
STEP_GRAPHS = [("compiled_small_reduce-overhead", _half_of_the_biggest_replay)]


@pytest.mark.parametrize(("stem", "make_counts"), STEP_GRAPHS)
def test_graph_node_counts_split_a_replay_into_phases(stem: str, make_counts) -> None:
    from analysis.metrics.phases import op_phases

    run = compiled_run(stem)
    counts = run.record["graph_phases"] if make_counts is None else make_counts(run.sqlite)
    phases = op_phases(run.export, run.ops, counts)
    rows = {r["Range"]: r for r in phase_table(run.export, run.ops, phases)}
    # the expectation, by SQL: phases by launch, except the replays with as many ops as
    # the last count, whose ops (by start) take the phases in turn
    ranges = {p: sql_ranges(run.sqlite, p) for p in PHASES}
    expected = {p: sql_phase_ns(run.sqlite, p) for p in PHASES}
    split = 0
    for launch, durations in _replays(run.sqlite).values():
        if len(durations) != counts[-1]["nodes"]:
            continue
        split += 1
        for p in PHASES:
            if any(s <= launch <= e for s, e in ranges[p]):
                expected[p] -= sum(durations)
        lo = 0
        for c in counts:
            if c["phase"] in PHASES:
                expected[c["phase"]] += sum(durations[lo:c["nodes"]])
            lo = c["nodes"]
    assert split >= 1 and phases.split_replays == split
    assert {p: rows[p]["GPU Time (ns)"] for p in PHASES} == expected
    assert "graph node count" in rows[counts[-1]["phase"]]["Basis"]
    # a count that does not fit the replay changes nothing
    wrong = [dict(c) for c in counts]
    wrong[-1]["nodes"] += 1
    unsplit = op_phases(run.export, run.ops, wrong)
    assert unsplit.split_replays == 0
    assert (unsplit.phase == op_phases(run.export, run.ops).phase).all()


def test_phase_figure_shows_the_eager_layers_and_no_compiled_ones(tmp_path: Path) -> None:
    """Eager and compiled runs side by side: the eager capture's numbered layer ranges and
    the ranges inside them are its layers and sublayers (forward launches); the compiled
    capture, without module paths, has none."""
    from analysis.outputs.figures import (
        SUBLAYER_BASIS,
        layer_frame,
        phase_frame,
        plot_phase_gpu_time,
        sublayer_names,
    )

    results = tmp_path / "results"
    runs = {"eager_bf16": ("gpt_small_train_bf16_ctx512", []),
            "compiled": ("compiled_small_default",
                         ["--torch-trace", str(Path(COMPILED_TRACE))])}
    for run, (stem, extra) in runs.items():
        sqlite = Path(__file__).parent / "fixtures" / "h100" / f"{stem}.sqlite"
        subprocess.run([sys.executable, "-m", "analysis", "all", str(sqlite), "-o",
                        str(results / run / "stats"), *extra], cwd=REPO, check=True)
    phases, parts = phase_frame(results, list(runs))
    assert list(phases.index) == list(runs)
    assert list(parts.index) == ["eager_bf16"]
    assert parts.loc["eager_bf16", SUBLAYER_BASIS] == "fwd"
    assert set(sublayer_names(parts)) == {"attention_sublayer", "ffn_sublayer"}
    layers = layer_frame(results, list(runs))
    assert list(layers.index) == ["eager_bf16"]
    assert list(layers.columns) == [*range(12), SUBLAYER_BASIS]
    import pandas as pd

    table = pd.read_csv(results / "eager_bf16" / "stats" / "phase_gpu_time.csv")
    ms = dict(zip(table["Range"], table["GPU ms/step"], strict=True))
    assert [layers.loc["eager_bf16", i] for i in range(12)] == pytest.approx(
        [ms[f"layer_{i}"] for i in range(12)], rel=1e-5)
    png = plot_phase_gpu_time(pd.DataFrame({"run": list(runs)}), results, tmp_path / "p.png")
    assert png.read_bytes().startswith(b"\x89PNG")


COMPILED_TRACE = Path(__file__).parent / "fixtures" / "h100" / "compiled_small_default_torch_trace"


def test_kernels_of_a_graph_missing_from_the_trace_stay_unmatched(run) -> None:
    """Without the loss's forward graph its two Triton kernels match nothing: they are
    reported as unmatched (kernel_map partial), not as glue, and the rest still maps."""
    from analysis.metrics.attribution import attribute

    missing = next(g for g in run.graphs if g.function == "loss" and g.kind == "forward")
    graphs = [g for g in run.graphs if g is not missing]
    a = attribute(run.ops, run.phases.phase, graphs)
    lost = np.isin(np.array(run.ops.names)[run.ops.name_code], missing.triton_names)
    steps = _steps(run.sqlite)
    assert int(lost.sum()) == len(missing.triton_names) * steps
    assert (a.op_status[lost] == UNMATCHED).all()
    assert int((a.op_status == ANCHOR).sum()) == int((run.attribution.op_status == ANCHOR).sum()
                                                     ) - int(lost.sum())
    rows = phase_table(run.export, run.ops, run.phases)
    metrics = attribution_metrics(run.ops, run.phases, a, rows)
    assert metrics["kernel_map"] == "partial" and metrics["triton_matched_share"] < 1


def test_a_layer_compiled_once_is_placed_per_call_of_its_region() -> None:
    """GPT tiny (2 layers) compiled on the CPU with ``compile_blocks: once`` and the
    module-path line (tests/fixtures/cpu/gpt_tiny_compile_once: its record and trimmed
    TORCH_TRACE, made by ``PROFBENCH_CAPTURE=1 TORCH_TRACE=DIR python -m workloads gpt --size
    tiny --mode train --context 32 --batch 2 --vocab 128 --compile default --compile-blocks
    once --device cpu --warmup 1 --steps 1``). The region was traced in the first layer, so
    every call's nodes name ``layers.0``; call c ran layer c in forward and the last but c
    in backward."""
    from analysis.metrics.attribution import places_of, site_paths
    from analysis.metrics.modules import structure_of
    from analysis.reading.torchtrace import read_torch_trace

    cpu = REPO / "tests" / "fixtures" / "cpu"
    record = json.loads((cpu / "gpt_tiny_compile_once.json").read_text())
    graphs = read_torch_trace(cpu / "gpt_tiny_compile_once")
    places = places_of(graphs, structure_of(record))
    model = [(g, row) for g, row in zip(graphs, places, strict=True) if g.function == "forward"]
    assert [g.kind for g, _ in model] == ["forward", "backward"]
    for graph, row in model:
        region = [(s, p) for s, p in zip(graph.sites, row, strict=True) if s.region_call >= 0]
        assert {s.region_call for s, _ in region} == {0, 1}
        # as traced: the first layer's paths in both calls
        traced = {p.split(".")[1] for s, _ in region for p in site_paths(s)
                  if p.startswith("layers.")}
        assert "0" in traced
        by_call = Counter((s.region_call, p.layer) for s, p in region if p.layer)
        first, second = ("layers.0", "layers.1")[:: -1 if graph.kind == "backward" else 1]
        assert set(by_call) == {(0, first), (1, second)}, by_call
        assert by_call[0, first] == by_call[1, second] > 10  # the same code in both calls
        assert {p.sublayer for _, p in region if p.layer} >= {"attn", "ffn"}
