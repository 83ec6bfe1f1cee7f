"""The TORCH_TRACE reader (analysis/reading/torchtrace.py), on the real traces of the compiled
H100 captures, checked against the raw log text. Their stack traces hold Python frames only
(no module-path line): the analysis reads no place from them, and no model source."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from compiled_fixtures import BLOCK_ONCE, COMPILED, H100

from analysis.metrics.attribution import site_path
from analysis.reading.torchtrace import innermost_frame, launch_order, launches, read_torch_trace

REPO = Path(__file__).resolve().parents[1]


def _raw_output_codes(trace: Path) -> list[str]:
    """The inductor_output_code payloads of the log, split from the raw text."""
    codes = []
    for log in sorted(trace.iterdir()):
        text = gzip.open(log, "rt").read()
        for block in re.split(r"\n(?=[VIWEC]\d{4} )", text):
            head, _, body = block.partition("\n")
            if '"inductor_output_code"' in head:
                codes.append("\n".join(line[1:] for line in body.split("\n")))
    return codes


@pytest.fixture(scope="module", params=COMPILED)
def trace(request: pytest.FixtureRequest) -> Path:
    return H100 / f"{request.param}_torch_trace"


def test_graphs_and_call_sites_match_the_raw_code(trace: Path) -> None:
    graphs = read_torch_trace(trace)
    codes = _raw_output_codes(trace)
    assert len(graphs) == len(codes) >= 4  # model and loss: forward, backward; optimizer
    assert [g.kind for g in graphs].count("backward") == 2
    assert {g.function for g in graphs} == {"forward", "loss", "_adamw_segment"}
    for g, code in zip(graphs, codes, strict=True):
        assert g.aot_id in code.splitlines()[0]
        # every launch carries a handle; Triton kernels are launched as `<name>.run(`
        assert len(g.sites) == code.count("[Provenance debug handles]")
        assert g.triton_names == re.findall(r"^\s+(triton_\w+)\.run\(", code, re.M)
        assert all(s.aten_ops and s.stack_traces for s in g.sites)
    forward = graphs[0]
    assert forward.kind == "forward" and forward.function == "forward"
    externs = {s.kernel for s in forward.sites if not s.is_triton}
    assert externs == {"extern_kernels.mm",
                       "torch.ops.aten._scaled_dot_product_cudnn_attention.default"}
    mm = next(s for s in forward.sites if s.kernel == "extern_kernels.mm")
    assert "aten.mm" in mm.aten_ops


def test_stack_traces_are_frames_without_module_paths(trace: Path) -> None:
    """The innermost frame of the attention call is the model's attention core; no frame
    line names a module, so the site has no module path."""
    forward = read_torch_trace(trace)[0]
    sdpa = next(s for s in forward.sites if "attention" in s.kernel)
    file, line = innermost_frame(sdpa.stack_traces[0])
    raw = re.findall(r'File "([^"]+)", line (\d+)', sdpa.stack_traces[0])
    assert (file, line) == (raw[-1][0], int(raw[-1][1])) and line > 0
    assert site_path(sdpa) == ""
    assert innermost_frame("no frame here") is None


def test_partitions_are_inlined_in_call_order() -> None:
    """A graph split into CUDA-graph partitions launches partition 0, then what call()
    itself launches, then partition 1 (the shape of the reduce-overhead wrapper)."""
    text = _raw_output_codes(H100 / "compiled_small_reduce-overhead_torch_trace")[0]
    assert "def partition_0(args):" in text  # the real wrapper: one partition
    handles = [h for h, _, _ in launch_order(text)]
    assert handles and handles == re.findall(r"\[Provenance debug handles\] (\S+)", text)
    two = (
        "def partition_0(args):\n    # [Provenance debug handles] triton_a:1\n    pass\n"
        "def partition_1(args):\n    # [Provenance debug handles] triton_c:3\n    pass\n"
        "class Runner:\n    def call(self, args):\n        self.partitions[0](args)\n"
        "        # [Provenance debug handles] extern_kernels.mm:2\n"
        "        self.partitions[1](args)\n"
    )
    assert [h for h, _, _ in launch_order(two)] == ["triton_a:1", "extern_kernels.mm:2",
                                                    "triton_c:3"]


@pytest.mark.parametrize("stem", BLOCK_ONCE)
def test_a_nested_region_is_expanded_once_per_call(stem: str) -> None:
    """The block compiled once (H100 captures): the region's subgraph function is defined
    once in the output code and called once per layer; its launches are counted in every
    call, in the order they run."""
    trace = H100 / f"{stem}_torch_trace"
    graphs = read_torch_trace(trace)
    codes = _raw_output_codes(trace)
    from workloads.gpt import SIZES

    n_layers = SIZES[json.loads((H100 / f"{stem}.json").read_text())["params"]["size"]][
        "n_layers"]
    for g, code in zip(graphs, codes, strict=True):
        if g.function != "forward":
            assert all(s.region_call == -1 for s in g.sites)  # the loss: no region
            continue
        subgraphs = re.findall(r"^def (\w*subgraph\w*)\(", code, re.M)
        assert len(subgraphs) == 1
        calls = re.findall(rf"= {subgraphs[0]}\(", code)
        assert len(calls) == n_layers
        in_region = [s for s in g.sites if s.region_call >= 0]
        assert sorted({s.region_call for s in in_region}) == list(range(n_layers))
        per_call = [[s.handle for s in in_region if s.region_call == c] for c in range(n_layers)]
        assert all(handles == per_call[0] for handles in per_call)  # the same code every time
        handles_defined = len(re.findall(r"\[Provenance debug handles\]", code))
        outer = len(g.sites) - len(in_region)
        assert outer + len(per_call[0]) == handles_defined  # each launch written once
        assert [s.index for s in g.sites] == list(range(len(g.sites)))
        assert launch_order(code) == [x[:3] for x in launches(code)]


def test_records_are_read_from_plain_and_gzipped_logs(tmp_path: Path) -> None:
    src = H100 / "compiled_small_default_torch_trace"
    for log in src.iterdir():
        (tmp_path / log.name.removesuffix(".gz")).write_text(gzip.open(log, "rt").read())
    plain, zipped = read_torch_trace(tmp_path), read_torch_trace(src)
    assert [(g.aot_id, [s.handle for s in g.sites]) for g in plain] == \
        [(g.aot_id, [s.handle for s in g.sites]) for g in zipped]
    assert json.dumps([len(g.sites) for g in plain]) == "[158, 2, 1, 305, 1, 1]"
