"""Inductor's record of the code it generated: a TORCH_TRACE folder -> compiled graphs.

``TORCH_TRACE=<dir>`` makes PyTorch write a structured log (one ``*.log`` per process,
``*.log.gz`` accepted too): glog-prefixed JSON records, each optionally followed by a payload
of tab-indented lines.  With ``torch._inductor.config.trace.provenance_tracking_level = 1``
(workloads/steps.py) Inductor adds, per compiled graph,

* ``inductor_output_code``: the wrapper module.  Its ``call()`` (and the ``partition_<n>``
  functions it calls, and the subgraph functions of nested compile regions, e.g.
  ``partitioned_fw_subgraph_0_0``, called once per layer of a model whose layer is compiled
  once: ``compile_blocks: once``) launches the graph's kernels in order; before every launch stand
  ``# Topologically Sorted Source Nodes: [...], Original ATen: [...]`` and
  ``# [Provenance debug handles] <kernel>:<handle>``.  The first line, ``# AOT ID:
  ['0_forward']``, says which graph of the compiled function it is (forward, backward,
  inference).
* ``inductor_provenance_tracking_kernel_stack_traces`` (JSON): ``"<kernel>:<handle>"`` ->
  the Python stack traces of the FX nodes fused into that call.

:func:`read_torch_trace` returns the graphs in log order (= compile or cache-load order; not
necessarily execution order: an AOTAutograd cache hit loads a backward with its forward),
each with its call sites in launch order.  Nothing else of the log is read.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

# "V1124 06:31:29.612000 508 torch/_dynamo/utils.py:2126] {...}", optionally "[rank0]:V..."
_RECORD = re.compile(r"^(?:\[rank\d+\]:)?[VIWEC]\d{4} [\d:.]+\s+\d+ [^\]]*\] (\{.*\})\s*$")
_AOT_ID = re.compile(r"#\s*AOT ID:\s*\['([^']*)'\]")
_HANDLE = re.compile(r"#\s*\[Provenance debug handles\]\s*(\S+)\s*$")
_ORIGINS = re.compile(
    r"#\s*Topologically Sorted Source Nodes:\s*\[(.*)\],\s*Original ATen:\s*\[(.*)\]")
_DEF = re.compile(r"^(\s*)def (\w+)\(")
_TRITON_RUN = re.compile(r"^\s*(triton_\w+)\.run\(")
UNHANDLED = "unhandled"  # the handle number of a launch Inductor gave no provenance handle
_PARTITION_CALL = re.compile(r"(?:self\.partitions\[(\d+)\]|\bpartition_(\d+))\(")
_SUBGRAPH_CALL = re.compile(r"=\s*(\w*subgraph\w*)\(")  # buf1 = partitioned_fw_subgraph_0_0(
TRITON_PREFIX = "triton_"
GRAPH_KINDS = ("forward", "backward", "inference")


@dataclass(frozen=True)
class CallSite:
    """One kernel launch (or extern call) in a compiled graph's ``call()``."""

    index: int  # position in launch order within the graph
    handle: str  # "<kernel>:<n>", the provenance debug handle
    kernel: str  # Triton kernel name as launched, or the extern, e.g. "extern_kernels.mm"
    source_nodes: tuple[str, ...]
    aten_ops: tuple[str, ...]  # e.g. ("aten.mm", "aten.view")
    stack_traces: tuple[str, ...]
    # which call of a nested compile region's subgraph launched it (0, 1, ... in launch
    # order), -1 outside one
    region_call: int = -1

    @property
    def is_triton(self) -> bool:
        return self.kernel.startswith(TRITON_PREFIX)


@dataclass
class CompiledGraph:
    """One Inductor output module (a forward, backward or inference graph)."""

    index: int  # position in the log (compile / cache-load order)
    aot_id: str  # e.g. "0_forward"
    kind: str  # forward | backward | inference | "" (unknown)
    compile_id: str  # dynamo "frame/frame_compile" (e.g. "0/0"); "" when absent
    function: str  # the compiled Python function (co_name), "" when unknown
    sites: list[CallSite] = field(default_factory=list)

    @cached_property
    def triton_names(self) -> list[str]:
        return [s.kernel for s in self.sites if s.is_triton]


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in ')


def innermost_frame(trace: str) -> tuple[str, int] | None:
    """(file, line) of the innermost frame of one Python stack trace text (the last one)."""
    frames = _FRAME.findall(trace)
    return (frames[-1][0], int(frames[-1][1])) if frames else None


def log_files(folder: str | Path) -> list[Path]:
    """The structured logs of a TORCH_TRACE folder (one per process), by name."""
    path = Path(folder)
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.name.endswith((".log", ".log.gz")))


def records(path: str | Path) -> Iterator[tuple[dict, str]]:
    """(metadata, payload) of every record of one structured log."""
    opener = gzip.open if str(path).endswith(".gz") else open
    meta: dict | None = None
    payload: list[str] = []
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if line.startswith("\t"):
                if meta is not None:
                    payload.append(line[1:])
                continue
            m = _RECORD.match(line)
            if m is None:
                continue
            if meta is not None:
                yield meta, "".join(payload)
            try:
                meta, payload = json.loads(m.group(1)), []
            except json.JSONDecodeError:
                meta, payload = None, []
    if meta is not None:
        yield meta, "".join(payload)


def read_torch_trace(folder: str | Path) -> list[CompiledGraph]:
    """Every compiled graph of the folder's logs, with its call sites in launch order."""
    graphs: list[CompiledGraph] = []
    for path in log_files(folder):
        graphs.extend(_graphs_of(path, start=len(graphs)))
    return graphs


def _graphs_of(path: Path, start: int) -> list[CompiledGraph]:
    graphs: list[CompiledGraph] = []
    functions: dict[str, str] = {}  # compile id -> co_name
    pending: tuple[str, str] | None = None  # (compile id, code) awaiting its stack traces
    pending_traces: dict[str, list[str]] | None = None

    def flush() -> None:
        nonlocal pending, pending_traces
        if pending is not None:
            graphs.append(_graph(start + len(graphs), pending[0], pending[1],
                                 pending_traces or {}))
        pending, pending_traces = None, None

    for meta, payload in records(path):
        cid = _compile_id(meta)
        if "inductor_output_code" in meta:
            flush()
            pending = (cid, payload)
        elif _artifact(meta) == "inductor_provenance_tracking_kernel_stack_traces":
            if pending is not None and pending[0] == cid and pending_traces is None:
                pending_traces = _json_or_empty(payload)
        elif "compilation_metrics" in meta:
            functions.setdefault(cid, (meta["compilation_metrics"] or {}).get("co_name") or "")
    flush()
    for g in graphs:
        g.function = functions.get(g.compile_id, "")
    return graphs


def _compile_id(meta: dict) -> str:
    frame, compile_ = meta.get("frame_id"), meta.get("frame_compile_id")
    return "" if frame is None else f"{frame}/{compile_}"


def _artifact(meta: dict) -> str | None:
    art = meta.get("artifact")
    return art.get("name") if isinstance(art, dict) else None


def _json_or_empty(payload: str) -> dict[str, list[str]]:
    try:
        data = json.loads(payload)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _graph(index: int, compile_id: str, code: str,
           traces: dict[str, list[str]]) -> CompiledGraph:
    m = _AOT_ID.search(code[:2000])
    aot_id = m.group(1) if m else ""
    kind = next((k for k in GRAPH_KINDS if aot_id.endswith(k)), "")
    sites = [
        CallSite(index=i, handle=handle, kernel=handle.rsplit(":", 1)[0],
                 source_nodes=nodes, aten_ops=aten,
                 stack_traces=tuple(traces.get(handle, ())), region_call=call)
        for i, (handle, nodes, aten, call) in enumerate(launches(code))
    ]
    if all(site.handle.endswith(":" + UNHANDLED) for site in sites):
        sites = []  # code made without provenance tracking: no handles to map by
    return CompiledGraph(index=index, aot_id=aot_id, kind=kind, compile_id=compile_id,
                         function="", sites=sites)


def launch_order(code: str) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """(handle, source nodes, ATen ops) of every launch in ``call()``, partitions and
    subgraphs inlined: a subgraph's launches once per call, as they run."""
    return [launch[:3] for launch in launches(code)]


def launches(code: str) -> list[tuple[str, tuple[str, ...], tuple[str, ...], int]]:
    """:func:`launch_order` with, per launch, the subgraph call that made it (0, 1, ... over
    the graph's subgraph calls; -1 outside one)."""
    bodies = _function_bodies(code)
    if "call" not in bodies:
        return []
    seen: set[str] = set()
    calls = itertools.count()  # numbers the subgraph calls in launch order

    def walk(name: str, inside: tuple[str, ...] = (), call: int = -1) -> Iterator[
            tuple[str, tuple[str, ...], tuple[str, ...], int]]:
        if name in inside or (name.startswith("partition_") and name in seen):
            return  # a partition is called once, nothing calls itself: guard against odd code
        seen.add(name)
        origins: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        handled: str | None = None  # the kernel of the last handle, until its launch
        for line in bodies[name]:
            if m := _ORIGINS.search(line):
                origins = (_split_list(m.group(1)), _split_list(m.group(2)))
            elif m := _HANDLE.search(line):
                yield m.group(1), *origins, call
                origins, handled = ((), ()), m.group(1).rsplit(":", 1)[0]
            elif line.lstrip().startswith("#"):
                continue
            elif m := _TRITON_RUN.match(line):
                # a launch without a handle (e.g. a "mix order reduction" kernel): a site
                # all the same, so the launches stay in step with the capture's kernels
                if m.group(1) != handled:
                    yield f"{m.group(1)}:{UNHANDLED}", *origins, call
                    origins = ((), ())
                handled = None
            elif m := _PARTITION_CALL.search(line):
                yield from walk(f"partition_{m.group(1) or m.group(2)}", (*inside, name), call)
            elif (m := _SUBGRAPH_CALL.search(line)) and m.group(1) in bodies:
                yield from walk(m.group(1), (*inside, name),
                                call if call >= 0 else next(calls))

    return list(walk("call"))


def _function_bodies(code: str) -> dict[str, list[str]]:
    """Lines of every ``call`` / ``partition_<n>`` / subgraph function (module level or
    method)."""
    bodies: dict[str, list[str]] = {}
    current: str | None = None
    indent = 0
    for line in code.splitlines():
        m = _DEF.match(line)
        if m:
            name = m.group(2)
            wanted = name == "call" or name.startswith("partition_") or "subgraph" in name
            current = name if wanted else None
            indent = len(m.group(1))
            if current is not None:
                bodies[current] = []
            continue
        if current is None:
            continue
        stripped = line.strip()
        if stripped and len(line) - len(line.lstrip()) <= indent:
            current = None  # dedent: the function ended
            continue
        bodies[current].append(line)
    return bodies


def _split_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


__all__ = ["CallSite", "CompiledGraph", "launch_order", "launches", "log_files",
           "read_torch_trace", "records"]
