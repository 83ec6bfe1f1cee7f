"""Compiled kernels mapped to call sites and model places (analysis/metrics/attribution.py),
on real compiled H100 captures with their TORCH_TRACE, checked against counts taken
independently from the same export by SQL."""

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
from analysis.metrics.kernelmap import attribution_metrics
from analysis.metrics.phases import PHASES, phase_table
from analysis.reading.sourceregions import model_layers

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


def test_layers_are_counted_and_numbered(any_run) -> None:
    run = any_run
    a = run.attribution
    assert run.n_layers == model_layers(run.record["params"]["size"]) > 0
    assert a.layers_ok and set(a.layers_found.values()) == {run.n_layers}
    for graph, places in zip(run.graphs, a.places, strict=True):
        sdpa = [p for s, p in zip(graph.sites, places, strict=True) if "attention" in s.kernel]
        if graph.kind == "forward" and sdpa:
            assert [p.layer for p in sdpa] == list(range(run.n_layers))
        if graph.kind == "backward" and sdpa:
            assert [p.layer for p in sdpa] == list(range(run.n_layers))[::-1]
        for p in sdpa:
            assert p.path == (f"layer_{p.layer}", "attention_sublayer",
                              "scaled_dot_product_attention")


def test_a_recomputed_op_ahead_of_the_backward_joins_its_layer() -> None:
    """32 layers (2.7B's count; a CPU compile, tests/fixtures/cpu/make_gpt_32layers_trace.py):
    the backward graph starts with the last layer's attention forward, recomputed ahead of
    the loss head's gradient. Counted alone it made 33 layers and the run lost its layer rows;
    it belongs to the layer the backward starts with."""
    from analysis.metrics.attribution import places_of
    from analysis.reading.torchtrace import read_torch_trace

    graphs = read_torch_trace(REPO / "tests/fixtures/cpu/gpt_32layers_bf16_compile_torch_trace")
    places, found, ok, _ = places_of(graphs, 32)
    assert ok and set(found.values()) == {32}
    backward = next(i for i, g in enumerate(graphs) if g.kind == "backward" and found.get(i))
    graph, row = graphs[backward], places[backward]
    attention = [(s.kernel, p.layer) for s, p in zip(graph.sites, row, strict=True)
                 if "attention" in s.kernel]
    assert attention[0][0].startswith("cpp_fused__scaled_dot_product_flash_attention")
    assert attention[0][1] == 31  # the recompute: the last layer, whose backward comes first
    assert [layer for _, layer in attention[1:]] == list(range(31, -1, -1))
    forward = next(i for i, g in enumerate(graphs) if g.kind == "forward" and found.get(i))
    assert [p.layer for s, p in zip(graphs[forward].sites, places[forward], strict=True)
            if "attention" in s.kernel] == list(range(32))


def test_a_backward_scheduled_by_kind_is_split_by_node_order() -> None:
    """GPT 2.7B bf16 under autocast, compiled, on the H100 (the published compile rung's
    trimmed TORCH_TRACE): Inductor runs the input-gradient chain of all 32 layers, then
    every layer's weight-gradient GEMMs, norm-weight reductions and gradient casts grouped
    by kind. Launch order cannot split that tail; the FX node numbers can."""
    from analysis.metrics.attribution import (
        LAUNCH_ORDER,
        NODE_ORDER,
        count_layers,
        graph_places,
        places_of,
        unanimous,
    )
    from analysis.metrics.nodeorder import node_key
    from analysis.reading.torchtrace import read_torch_trace

    graphs = read_torch_trace(REPO / "tests/fixtures/h100/gpt_train_2.7B_compile_torch_trace")
    places, found, ok, counted_by = places_of(graphs, 32)
    assert ok and set(found.values()) == {32}
    backward = max((i for i, g in enumerate(graphs) if g.kind == "backward"),
                   key=lambda i: len(graphs[i].sites))
    assert counted_by[backward] == NODE_ORDER
    assert {how for i, how in counted_by.items() if i != backward} == {LAUNCH_ORDER}
    graph, row = graphs[backward], places[backward]
    paths, _, _ = graph_places(graph)
    in_order = count_layers(graph, paths, [unanimous(s.stack_traces) for s in graph.sites])
    assert max(c for c in in_order if c is not None) + 1 != 32  # launch order fails here

    # Each attention backward lands in the layer its own node number names (made last first).
    for site, place in zip(graph.sites, row, strict=True):
        names = [n for n in site.source_nodes if "attention_backward" in n]
        if names:
            assert place.layer == 31 - node_key(names[0])[1], site.source_nodes
    # The input-gradient chain (launched layer by layer) keeps the layers launch order gives.
    chain_end = next(i for i, p in enumerate(paths) if p and p[0].name == "final_norm")
    for i in range(chain_end):
        if in_order[i] is not None and row[i].layer is not None:
            assert row[i].layer == 31 - in_order[i], (i, graph.sites[i].kernel)
    # Every layer but the first gets the same calls: the same block, 32 times.
    calls: dict[int, Counter] = {}
    for site, place in zip(graph.sites, row, strict=True):
        if place.layer is not None:
            calls.setdefault(place.layer, Counter())[(site.kernel, place.sublayer)] += 1
    assert sorted(calls) == list(range(32))
    assert all(calls[layer] == calls[1] for layer in range(2, 32))
    assert sum(calls[1].values()) == 32 and sum(calls[0].values()) == 31  # + embedding's grad
    # e.g. the deferred casts of the weight gradients to fp32 (one node each), launched
    # together after the chain: per layer, its 4 attention and 3 FFN weights
    casts = Counter((p.layer, p.sublayer) for s, p in zip(graph.sites, row, strict=True)
                    if p.layer is not None and len(s.source_nodes) == 1
                    and s.source_nodes[0].startswith("convert_element_type"))
    assert casts == {(layer, sub): n for layer in range(32)
                     for sub, n in (("attention_sublayer", 4), ("ffn_sublayer", 3))}


def test_known_sites_sit_where_the_model_code_is(run) -> None:
    for graph, places in zip(run.graphs, run.attribution.places, strict=True):
        for site, place in zip(graph.sites, places, strict=True):
            if graph.function in ("loss", "_adamw_segment"):
                assert place.path == ()  # no NVTX range around the loss or the optimizer
            elif site.kernel.startswith("triton_poi_fused__to_copy__unsafe_view_add_mul_slice"):
                assert place.region == "rope encoding"  # the RoPE forward kernel
            elif "silu" in site.kernel:
                assert place.sublayer == "ffn_sublayer"
    forward = next(g for g in run.graphs if g.kind == "forward" and g.function == "forward")
    places = run.attribution.places[run.graphs.index(forward)]
    assert places[-1].path == ("lm_head",)  # the last launch: the LM head's GEMM
    gemms = [p.region for s, p in zip(forward.sites, places, strict=True)
             if s.kernel == "extern_kernels.mm"]
    assert gemms[:3] == ["attention projections"] * 3  # q, k, v


def test_layers_and_sublayers_cover_forward_and_backward(any_run) -> None:
    run = any_run
    rows = {r["Range"]: r for r in phase_table(run.export, run.ops, run.phases,
                                               run.attribution)}
    fwd_bwd = sql_phase_ns(run.sqlite, "forward_pass", "backward_pass")
    assert rows["forward_pass"]["GPU Time (ns)"] + rows["backward_pass"]["GPU Time (ns)"] \
        == fwd_bwd
    layers = [rows[f"layer_{i}"] for i in range(run.n_layers)]
    assert all(r["Basis"] == "provenance" and r["Kind"] == "layer" for r in layers)
    assert all(r["Phases"] == "forward_pass+backward_pass" for r in layers)
    layer_ns = [int(r["GPU Time (ns)"]) for r in layers]
    assert sum(layer_ns) >= 0.9 * fwd_bwd
    assert max(layer_ns) <= 1.2 * min(layer_ns)  # the same block, n_layers times
    sublayers = rows["attention_sublayer"]["GPU Time (ns)"] + rows["ffn_sublayer"]["GPU Time (ns)"]
    assert sublayers == sum(layer_ns)  # every layer op sits in one of the two sublayers
    steps = _steps(run.sqlite)
    assert rows["attention_sublayer"]["Instances"] == 2 * run.n_layers * steps  # fwd + bwd
    metrics = attribution_metrics(run.ops, run.phases, run.attribution, list(rows.values()))
    assert metrics["kernel_map"] == "ok" and metrics["kernel_map_layers"] == run.n_layers
    assert metrics["kernel_map_layer_order"] == "launch order"
    assert metrics["layer_share_fwd_bwd"] == pytest.approx(sum(layer_ns) / fwd_bwd)
    assert metrics["placed_share_fwd_bwd"] >= 0.95
    assert metrics["unattributed_share_fwd_bwd"] == pytest.approx(
        1 - metrics["placed_share_fwd_bwd"])


def test_cli_writes_the_kernel_map_and_layer_rows(run, tmp_path: Path) -> None:
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
    phases = pd.read_csv(out / "phase_gpu_time.csv")
    layer_rows = phases[phases["Kind"] == "layer"]
    assert len(layer_rows) == run.n_layers and set(layer_rows["Basis"]) == {"provenance"}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["kernel_map"] == "ok" and metrics["layer_share_fwd_bwd"] >= 0.9


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


def test_phase_figure_shows_compiled_layers_and_sublayers(tmp_path: Path) -> None:
    """Eager and compiled runs side by side: the compiled one's layers and sublayers come
    from provenance and cover forward and backward."""
    from analysis.outputs.figures import (
        SUBLAYER_BASIS,
        layer_frame,
        phase_frame,
        plot_phase_gpu_time,
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
    assert parts.loc["eager_bf16", SUBLAYER_BASIS] == "fwd"
    assert parts.loc["compiled", SUBLAYER_BASIS] == "fwd+bwd, provenance"
    compiled = compiled_run("compiled_small_default")
    rows = {r["Range"]: r for r in phase_table(compiled.export, compiled.ops, compiled.phases,
                                               compiled.attribution)}
    assert parts.loc["compiled", "ffn_sublayer"] == pytest.approx(
        rows["ffn_sublayer"]["Share of Step"], rel=1e-5)
    layers = layer_frame(results, list(runs))
    assert list(layers.index) == list(runs)
    assert list(layers.columns) == [*range(12), SUBLAYER_BASIS]
    assert layers.loc["compiled", SUBLAYER_BASIS] == "fwd+bwd, provenance"
    assert [layers.loc["compiled", i] for i in range(12)] == pytest.approx(
        [rows[f"layer_{i}"]["GPU ms/step"] for i in range(12)], rel=1e-5)
    import pandas as pd

    png = plot_phase_gpu_time(pd.DataFrame({"run": list(runs)}), results, tmp_path / "p.png")
    assert png.read_bytes().startswith(b"\x89PNG")


COMPILED_TRACE = Path(__file__).parent / "fixtures" / "h100" / "compiled_small_default_torch_trace"


def test_kernels_of_a_graph_missing_from_the_trace_stay_unmatched(run) -> None:
    """Without the loss's forward graph its two Triton kernels match nothing: they are
    reported as unmatched (kernel_map partial), not as glue, and the rest still maps."""
    from analysis.metrics.attribution import attribute

    missing = next(g for g in run.graphs if g.function == "loss" and g.kind == "forward")
    graphs = [g for g in run.graphs if g is not missing]
    a = attribute(run.ops, run.phases.phase, graphs, run.n_layers)
    lost = np.isin(np.array(run.ops.names)[run.ops.name_code], missing.triton_names)
    steps = _steps(run.sqlite)
    assert int(lost.sum()) == len(missing.triton_names) * steps
    assert (a.op_status[lost] == UNMATCHED).all()
    assert int((a.op_status == ANCHOR).sum()) == int((run.attribution.op_status == ANCHOR).sum()
                                                     ) - int(lost.sum())
    rows = phase_table(run.export, run.ops, run.phases, a)
    metrics = attribution_metrics(run.ops, run.phases, a, rows)
    assert metrics["kernel_map"] == "partial" and metrics["triton_matched_share"] < 1
    assert a.layers_ok
