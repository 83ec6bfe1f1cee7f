"""Compiled code mapped back to the model: GPU op -> compiled call site -> ATen ops and place.

Input: the capture's GPU ops (analysis/metrics/gpuops.py) and the compiled graphs of the
same process read from its TORCH_TRACE (analysis/reading/torchtrace.py).

1. **Where each call site sits** (:func:`places_of`): the module path Inductor recorded
   for the nodes fused into it (the stack-trace line workloads/steps.py
   ``track_module_paths`` adds; a kernel fusing nodes of several modules goes to their
   deepest common module, or to the one most of them name when only the root holds them
   all; an extern kernel, a cuDNN convolution's backward, to the nodes of its own op, not
   those fused into its inputs), and its layer and sublayer by the run's structure (the
   record's globs, workloads/structure.py). Code traced without that line (a capture made
   before it existed) has no place.
2. **Which ops a call site launched** (:func:`align`): the ops of each process in launch
   order (correlationId; by start time inside one CUDA-graph replay).  Triton kernels are
   the anchors: a run of consecutive Triton kernels, launched by one thread, that equals a
   graph's Triton call sites name for name is one invocation of that graph.  The
   non-Triton ops between two anchors of an invocation are its extern calls between them
   (cuBLAS GEMMs, cuDNN attention, their memsets).  Between two invocations, the ops
   launched in the same context as the previous one (same thread and phase, or same
   CUDA-graph replay and phase) go to its trailing externs, those in the context of the
   next one to its leading externs, the rest is eager code between compiled graphs
   (``glue``).  Ops given to externs of different places are spread over them in order,
   matching GEMM kernels to GEMM externs and attention kernels to attention externs, and
   are marked ``ordered``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import cache

import numpy as np

from analysis.metrics.gpuops import KERNEL, GpuOps
from analysis.reading.torchtrace import TRITON_PREFIX, CallSite, CompiledGraph
from workloads.structure import MODULE_PATH_LINE, NODE_OP_LINE, Structure

# per-op status
UNMATCHED, ANCHOR, EXTERN, ORDERED, GLUE = range(5)
STATUS_NAMES = ("unmatched", "triton", "extern", "extern (in order)", "glue")
# the lines workloads/steps.py adds to a compiled node's stack trace, their value captured
_MODULE_LINE = re.compile(re.escape(MODULE_PATH_LINE).replace(re.escape("{}"), r"([^\]]*)"))
_OP_LINE = re.compile(re.escape(NODE_OP_LINE).replace(re.escape("{}"), r"([^\]]*)"))


@dataclass(frozen=True)
class Place:
    """Where a call site sits in the model: its module path ("" for none, relative to the
    eager module range it is called in when a layer is compiled on its own) and that path's
    layer and sublayer by the run's structure."""

    path: str
    layer: str | None = None
    sublayer: str | None = None


@dataclass
class Attribution:
    graphs: list[CompiledGraph]
    places: list[list[Place]]  # [graph][site]
    op_graph: np.ndarray  # per op: graph index, -1
    op_site: np.ndarray  # per op: site index in its graph, -1
    op_invocation: np.ndarray  # per op: invocation number, -1
    op_status: np.ndarray  # per op: UNMATCHED / ANCHOR / EXTERN / ORDERED / GLUE

    def place(self, op: int) -> Place | None:
        g = int(self.op_graph[op])
        return self.places[g][int(self.op_site[op])] if g >= 0 else None


# -- 1. places --------------------------------------------------------------------------------
def site_paths(site: CallSite) -> list[str]:
    """The module paths of the nodes a call site ran. An extern kernel's provenance also holds
    the nodes Inductor fused into its inputs (a convolution's backward gets its batch norm's
    backward nodes, many against its one): only its own op's nodes count, where their traces
    name ops (workloads/steps.py adds the line)."""
    traces = site.stack_traces
    if not site.is_triton:
        op = _extern_op(site.kernel)
        own = tuple(t for t in traces if any(_extern_op(m.group(1)) == op
                                             for m in _OP_LINE.finditer(t)))
        traces = own or traces
    return [m.group(1) for t in traces for m in _MODULE_LINE.finditer(t)]


def _extern_op(name: str) -> str:
    """``torch.ops.aten.convolution_backward.default``, ``aten.convolution_backward.default``
    and ``extern_kernels.convolution_backward`` -> ``convolution_backward``."""
    parts = [p for p in name.split(".") if p not in ("default", "out", "Tensor")]
    return parts[-1] if parts else name


def common_path(paths: list[str]) -> str:
    """The deepest module holding every path; when only the root holds them all (a kernel
    fusing the end of one top-level module with the start of the next, or a weight tied
    between two), the path most of them name."""
    if not paths:
        return ""
    split = [p.split(".") for p in set(paths)]
    common = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    if common:
        return ".".join(common)
    return max(sorted(set(paths)), key=paths.count)


def site_path(site: CallSite, structure: Structure | None = None,
              traced: str | None = None) -> str:
    """The module path of a call site ("" for none). Inside a nested compile region's call
    (a layer compiled once) only the paths in the layer the region was traced in
    (``traced``; any layer without it) count: Inductor also hands the region's kernels
    traces of the outer graph's nodes (the final norm's gradient, the LM head's, in backward
    the last layer's), which would pull them out of the layer."""
    paths = site_paths(site)
    if site.region_call >= 0 and structure is not None:
        paths = [p for p in paths if structure.layer_of(p)] or paths
        if traced is not None:
            paths = [p for p in paths if structure.layer_of(p) == traced] or paths
    return common_path(paths)


def traced_layer(graph: CompiledGraph, structure: Structure) -> str | None:
    """The layer a graph's nested compile region was traced in: the layer its sites' traces
    name most (None without a region)."""
    layers = Counter(structure.layer_of(p) for s in graph.sites if s.region_call >= 0
                     for p in site_paths(s) if structure.layer_of(p))
    return str(layers.most_common(1)[0][0]) if layers else None


def places_of(graphs: list[CompiledGraph], structure: Structure | None = None
              ) -> list[list[Place]]:
    """Places of every call site (module docstring, step 1)."""
    structure = structure or Structure("", "")
    out = []
    for graph in graphs:
        traced = traced_layer(graph, structure)
        paths = _per_region_call([site_path(s, structure, traced) for s in graph.sites],
                                 graph, structure)
        out.append([Place(p, structure.layer_of(p) if p else None,
                          structure.sublayer_of(p) if p else None) for p in paths])
    return out


def _per_region_call(paths: list[str], graph: CompiledGraph, structure: Structure) -> list[str]:
    """A layer compiled once (a nested compile region, ``compile_blocks: once``) was traced in
    one layer, so its nodes name that layer in every call of the region. When the region's
    sites all name one layer ``<stem>.<i>``, call ``c`` of ``n`` ran the layer ``c`` places
    after it: the layers run in order in forward and last first in backward."""
    inside = [k for k, s in enumerate(graph.sites)
              if s.region_call >= 0 and paths[k] and structure.layer_of(paths[k])]
    layers = {structure.layer_of(paths[k]) for k in inside}
    if len(layers) != 1:
        return paths
    traced = str(layers.pop())
    stem, _, index = traced.rpartition(".")
    if not index.isdigit():
        return paths
    calls = sorted({graph.sites[k].region_call for k in inside})
    order = {c: n for n, c in enumerate(calls[::-1] if graph.kind == "backward" else calls)}
    out = list(paths)
    for k in inside:
        layer = f"{stem}.{int(index) + order[graph.sites[k].region_call]}"
        out[k] = layer + paths[k][len(traced):]
    return out


# -- 2. alignment -----------------------------------------------------------------------------
_GEMM_EXTERN = re.compile(r"\b(?:extern_kernels\.)?_?(?:mm|bmm|addmm|baddbmm|addmv|"
                          r"scaled_mm|int_mm|convolution|matmul)\b")
_ATTENTION_EXTERN = re.compile(r"attention|sdpa|flash|efficient|cudnn_attention")
_GEMM_KERNEL = re.compile(r"gemm|gemv|xmma|nvjet|cutlass|cublas|wgmma|hmma|splitk",
                          re.IGNORECASE)
_ATTENTION_KERNEL = re.compile(r"flash|fmha|attention|attn|sdpa|dot_do_o|convert_dq",
                               re.IGNORECASE)


def _extern_family(kernel: str) -> str:
    if _ATTENTION_EXTERN.search(kernel):
        return "attention"
    return "gemm" if _GEMM_EXTERN.search(kernel) else "other"


def _kernel_family(name: str) -> str:
    if _ATTENTION_KERNEL.search(name):
        return "attention"
    return "gemm" if _GEMM_KERNEL.search(name) else "other"


@cache
def spread(groups: tuple[str, ...], externs: tuple[str, ...]) -> tuple[int, ...]:
    """Extern index per op group: in order (non-decreasing), each extern getting a group
    where it can, preferring GEMM groups on GEMM externs and attention on attention."""
    g, m = len(groups), len(externs)
    if m == 1:
        return (0,) * g
    neg = -1e9
    # best[i][j]: score with groups[:i+1] placed and group i on extern j
    best = [[neg] * m for _ in range(g)]
    back = [[-1] * m for _ in range(g)]

    def fit(i: int, j: int) -> float:
        return 1.0 if groups[i] == externs[j] and groups[i] != "other" else 0.0

    for j in range(m):
        best[0][j] = fit(0, j) - j  # externs before j stay empty
    for i in range(1, g):
        for j in range(m):
            for k in range(j + 1):
                gap = j - k - 1 if j > k else 0
                score = best[i - 1][k] + fit(i, j) - gap
                if score > best[i][j]:
                    best[i][j], back[i][j] = score, k
    j = max(range(m), key=lambda j: best[g - 1][j] - (m - 1 - j))
    out = [0] * g
    for i in range(g - 1, -1, -1):
        out[i] = j
        j = back[i][j]
    return tuple(out)


def by_kind(groups: tuple[str, ...], externs: tuple[str, ...]) -> bool:
    """Whether kernel kinds alone decide the assignment: no unknown kind, and per kind one
    extern (taking all its kernels) or as many kernels as externs (one each, in order)."""
    if "other" in groups or "other" in externs or set(groups) != set(externs):
        return False
    g, e = Counter(groups), Counter(externs)
    return all(e[f] == 1 or g[f] == e[f] for f in e)


def _groups(names: list[str], kinds: list[int]) -> list[list[int]]:
    """Ops (positions in ``names``) grouped as each kernel with the memsets/memcpys just
    before it (a library call's workspace clear), trailing memops with the last kernel."""
    groups: list[list[int]] = []
    pending: list[int] = []
    for i, kind in enumerate(kinds):
        pending.append(i)
        if kind == KERNEL:
            groups.append(pending)
            pending = []
    if pending:
        if groups:
            groups[-1].extend(pending)
        else:
            groups.append(pending)
    return groups


@dataclass
class _Invocation:
    graph: int
    anchors: list[tuple[int, int]]  # (position in launch order, site index)


class _Aligner:
    """The alignment of one process's ops (positions = launch order)."""

    def __init__(self, ops: GpuOps, phase: np.ndarray, order: np.ndarray,
                 graphs: list[CompiledGraph], places: list[list[Place]], out: Attribution,
                 invocation_base: int) -> None:
        self.ops, self.order, self.graphs, self.places, self.out = ops, order, graphs, places, out
        self.names = [ops.names[c] for c in ops.name_code[order].tolist()]
        self.triton = [n.startswith(TRITON_PREFIX) for n in self.names]
        self.kinds = ops.kind[order].tolist()
        self.tid = ops.tid[order]
        graph_corr = np.where(ops.graph_launch[order], ops.corr[order], -1)
        self.ctx = list(zip(graph_corr.tolist(), self.tid.tolist(), phase[order].tolist(),
                            strict=True))
        self.base = invocation_base

    def run(self) -> int:
        invocations = self.segment()
        if not invocations:  # no compiled graph ran in this process: nothing to tell
            return 0
        for number, inv in enumerate(invocations):
            for pos, site in inv.anchors:
                self.mark(pos, inv.graph, site, number, ANCHOR)
            for (p0, s0), (p1, s1) in zip(inv.anchors, inv.anchors[1:], strict=False):
                self.interior(inv, number, p0, s0, p1, s1)
        for k in range(len(invocations) + 1):
            prev = invocations[k - 1] if k > 0 else None
            nxt = invocations[k] if k < len(invocations) else None
            self.boundary(prev, k - 1, nxt, k)
        return len(invocations)

    def segment(self) -> list[_Invocation]:
        """Runs of Triton kernels that replay a graph's Triton call sites, name for name."""
        tpos = [i for i, t in enumerate(self.triton) if t]
        tnames = [self.names[i] for i in tpos]
        by_first: dict[str, list[int]] = {}
        for g in sorted(range(len(self.graphs)), key=lambda g: -len(self.graphs[g].sites)):
            names = self.graphs[g].triton_names
            if names:
                by_first.setdefault(names[0], []).append(g)
        triton_sites = [[s.index for s in g.sites if s.is_triton] for g in self.graphs]
        found: list[_Invocation] = []
        i = 0
        while i < len(tnames):
            for g in by_first.get(tnames[i], ()):
                names = self.graphs[g].triton_names
                span = tpos[i:i + len(names)]
                one_thread = bool(np.all(self.tid[span] == self.tid[span[0]]))
                if tnames[i:i + len(names)] == names and one_thread:
                    found.append(_Invocation(g, list(zip(span, triton_sites[g], strict=True))))
                    i += len(names)
                    break
            else:
                i += 1  # a Triton kernel of no known graph: stays unmatched
        return found

    def mark(self, pos: int, graph: int, site: int, number: int, status: int) -> None:
        op = self.order[pos]
        out = self.out
        out.op_graph[op], out.op_site[op] = graph, site
        out.op_invocation[op], out.op_status[op] = self.base + number, status

    def glue(self, positions: list[int]) -> None:
        for pos in positions:
            self.out.op_status[self.order[pos]] = GLUE

    def interior(self, inv: _Invocation, number: int, p0: int, s0: int, p1: int,
                 s1: int) -> None:
        """Ops between two anchors of one invocation: its extern calls between them."""
        g = self.graphs[inv.graph]
        externs = [s.index for s in g.sites[s0 + 1:s1]]
        thread = self.tid[p0]
        between = [p for p in range(p0 + 1, p1) if not self.triton[p]]
        mine = [p for p in between if self.tid[p] == thread]
        self.glue([p for p in between if self.tid[p] != thread])
        self.assign(mine, [(inv.graph, number, s) for s in externs])

    def boundary(self, prev: _Invocation | None, prev_number: int, nxt: _Invocation | None,
                 next_number: int) -> None:
        """Ops between two invocations: trailing externs of one, leading of the next, and
        eager code in between."""
        start = prev.anchors[-1][0] + 1 if prev else 0
        stop = nxt.anchors[0][0] if nxt else len(self.names)
        # a Triton kernel here matched no graph: it stays unmatched, never glue
        region = [p for p in range(start, stop) if not self.triton[p]]
        if not region:
            return
        trailing = leading = []
        t_ctx = l_ctx = None
        if prev is not None:
            g, last = self.graphs[prev.graph], prev.anchors[-1]
            trailing = [(prev.graph, prev_number, s.index) for s in g.sites[last[1] + 1:]]
            t_ctx = self.ctx[last[0]]
        if nxt is not None:
            g, first = self.graphs[nxt.graph], nxt.anchors[0]
            leading = [(nxt.graph, next_number, s.index) for s in g.sites[:first[1]]]
            l_ctx = self.ctx[first[0]]
        n = len(region)
        t_end = 0
        while trailing and t_end < n and self.ctx[region[t_end]] == t_ctx:
            t_end += 1
        l_start = n
        while leading and l_start > 0 and self.ctx[region[l_start - 1]] == l_ctx:
            l_start -= 1
        if t_end <= l_start:
            self.assign(region[:t_end], trailing)
            self.assign(region[l_start:], leading)
            self.glue(region[t_end:l_start])
        else:  # one context: the split between the two graphs' externs is by order
            self.assign(region, trailing + leading)

    def assign(self, positions: list[int], externs: list[tuple[int, int, int]]) -> None:
        """Give ``positions`` (launch order) to the extern call sites ``externs``."""
        if not positions:
            return
        if not externs:
            self.glue(positions)
            return
        groups = _groups([self.names[p] for p in positions], [self.kinds[p] for p in positions])
        fams = tuple(_kernel_family(self.names[positions[grp[-1]]]) for grp in groups)
        efams = tuple(_extern_family(self.graphs[g].sites[s].kernel) for g, _, s in externs)
        choice = spread(fams, efams)
        distinct = {self.places[g][s] for g, _, s in externs}
        status = EXTERN if len(distinct) == 1 or by_kind(fams, efams) else ORDERED
        for grp, e in zip(groups, choice, strict=True):
            g, number, s = externs[e]
            for k in grp:
                self.mark(positions[k], g, s, number, status)


def align(ops: GpuOps, phase: np.ndarray, graphs: list[CompiledGraph],
          places: list[list[Place]], out: Attribution) -> None:
    """Fill ``out``'s per-op arrays (see the module docstring, step 2)."""
    launched = ops.launch >= 0
    base = 0
    for pid in np.unique(ops.pid[launched]).tolist():
        idx = np.flatnonzero(launched & (ops.pid == pid))
        order = idx[np.lexsort((ops.start[idx], ops.corr[idx]))]
        base += _Aligner(ops, phase, order, graphs, places, out, base).run()


def attribute(ops: GpuOps, phase: np.ndarray, graphs: list[CompiledGraph],
              structure: Structure | None = None) -> Attribution:
    """Every op's compiled call site and place (module docstring)."""
    places = places_of(graphs, structure)
    n = ops.size
    out = Attribution(
        graphs=graphs, places=places,
        op_graph=np.full(n, -1, np.int64), op_site=np.full(n, -1, np.int64),
        op_invocation=np.full(n, -1, np.int64), op_status=np.full(n, UNMATCHED, np.int64),
    )
    if graphs and n:
        align(ops, phase, graphs, places, out)
    return out


__all__ = ["ANCHOR", "EXTERN", "GLUE", "ORDERED", "STATUS_NAMES", "UNMATCHED", "Attribution",
           "Place", "align", "attribute", "common_path", "places_of", "site_path", "site_paths",
           "spread"]
