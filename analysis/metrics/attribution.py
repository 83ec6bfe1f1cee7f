"""Compiled code mapped back to the model: GPU op -> compiled call site -> ATen ops and place.

Input: the capture's GPU ops (analysis/metrics/gpuops.py) and the compiled graphs of the
same process read from its TORCH_TRACE (analysis/reading/torchtrace.py).

1. **Where each call site sits** (:func:`graph_places`): the stack traces of a call site
   give the ``with rng("<name>")`` blocks around their source lines
   (analysis/reading/sourceregions.py); a fused kernel whose traces disagree goes where most
   of them are, level by level.  The layer index is not in the traces (one loop line
   ``x = block(x)``): it is counted in launch order from the GEMM and attention calls, a
   new layer starting where their sublayer goes back (forward: ffn -> attention; backward,
   which runs the layers last to first: attention -> ffn); the kernels Inductor moves
   between them join their neighbours' layer.  A run whose graphs do not all show
   ``n_layers`` layers keeps its sublayers but loses its layer indices.
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
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from analysis.metrics.gpuops import KERNEL, GpuOps
from analysis.metrics.nodeorder import gemm_anchors, place_by_votes
from analysis.reading.sourceregions import INDEXED, Region, trace_regions
from analysis.reading.torchtrace import TRITON_PREFIX, CallSite, CompiledGraph

# per-op status
UNMATCHED, ANCHOR, EXTERN, ORDERED, GLUE = range(5)
STATUS_NAMES = ("unmatched", "triton", "extern", "extern (in order)", "glue")
LAYER = "layer_{}"  # the name the eager run gives layer i (workloads/gpt.py)
# how a graph's layers were counted (graph_places)
LAUNCH_ORDER, NODE_ORDER = "launch order", "FX node order"


@dataclass(frozen=True)
class Place:
    """Where a call site sits in the model."""

    path: tuple[str, ...]  # range names outermost first, e.g. layer_3 > attention_sublayer
    layer: int | None
    sublayer: str | None
    region: str | None  # innermost named range


@dataclass
class Attribution:
    graphs: list[CompiledGraph]
    places: list[list[Place]]  # [graph][site]
    op_graph: np.ndarray  # per op: graph index, -1
    op_site: np.ndarray  # per op: site index in its graph, -1
    op_invocation: np.ndarray  # per op: invocation number, -1
    op_status: np.ndarray  # per op: UNMATCHED / ANCHOR / EXTERN / ORDERED / GLUE
    n_layers: int | None  # expected (from the run's size), None when unknown
    layers_found: dict[int, int] = field(default_factory=dict)  # graph position -> layers
    layers_ok: bool = False
    # graph position -> how its layers were counted (LAUNCH_ORDER or NODE_ORDER)
    layers_counted_by: dict[int, str] = field(default_factory=dict)

    def place(self, op: int) -> Place | None:
        g = int(self.op_graph[op])
        return self.places[g][int(self.op_site[op])] if g >= 0 else None


# -- 1. places --------------------------------------------------------------------------------
@cache
def _regions(trace: str) -> tuple[Region, ...]:
    return trace_regions(trace)


def majority_path(traces: tuple[str, ...]) -> tuple[Region, ...]:
    """The range path most of the traces share, chosen level by level (outermost first);
    it stops where more traces end than continue into any one range."""
    candidates = [_regions(t) for t in traces]
    chosen: list[Region] = []
    level = 0
    while candidates:
        heads = Counter(p[level] for p in candidates if len(p) > level)
        if not heads:
            break
        top, count = heads.most_common(1)[0]
        if sum(1 for p in candidates if len(p) <= level) > count:
            break
        chosen.append(top)
        candidates = [p for p in candidates if len(p) > level and p[level] == top]
        level += 1
    return tuple(chosen)


def unanimous(traces: tuple[str, ...]) -> bool:
    """Whether the traces of a site that lie in a layer all name the same sublayer."""
    subs = {p[1] if len(p) > 1 else None for p in map(_regions, traces)
            if p and p[0].name == INDEXED}
    return len(subs) <= 1


def own_traces(site: CallSite) -> tuple[str, ...]:
    """The stack traces that place a site: inside a nested compile region's call, only those
    in a layer (the region is the block; Inductor also hands its kernels traces of the
    outer graph's nodes, e.g. the final norm's gradient, which would pull them out of it)."""
    if site.region_call < 0:
        return site.stack_traces
    in_layer = tuple(t for t in site.stack_traces
                     if (p := _regions(t)) and p[0].name == INDEXED)
    return in_layer or site.stack_traces


def count_layers(graph: CompiledGraph, paths: list[tuple[Region, ...]],
                 clear: list[bool]) -> list[int | None]:
    """Per site: the layer counted in launch order (0 = the first layer launched).

    Only anchors start a layer: ``clear`` sites (all traces in one sublayer) that are GEMM
    or attention calls, which stay in their layer's order; a new layer starts where the
    sublayer goes back (a later block in the source in a backward graph, an earlier one
    otherwise).  Inductor moves small kernels across layers (under autocast, the bf16 casts
    of the next layer's weights and its norm-weight gradient run amid this layer's
    attention backward, which made a 12-layer backward count 35), so they only join a
    layer: that of their anchor neighbours, of the next one when its sublayer is theirs,
    else of the previous one.  A graph without GEMM or attention calls counts every clear
    site.
    """
    anchors = [clear[i] and not site.is_triton and _extern_family(site.kernel) != "other"
               for i, site in enumerate(graph.sites)]
    if not any(anchors):
        anchors = clear
    order = [i for i, path in enumerate(paths)
             if path and path[0].name == INDEXED and anchors[i]]
    counted = count_anchors(order, paths, backward=graph.kind == "backward")
    clear_sites = [i for i, c in enumerate(counted) if c is not None]
    for i, path in enumerate(paths):
        if counted[i] is not None or not path or path[0].name != INDEXED:
            continue
        before = [j for j in clear_sites if j < i]
        after = [j for j in clear_sites if j > i]
        prev = before[-1] if before else None
        nxt = after[0] if after else None
        if prev is None or nxt is None or counted[prev] == counted[nxt]:
            counted[i] = counted[prev if prev is not None else nxt] if clear_sites else 0
            continue
        sub = path[1].name if len(path) > 1 else None
        next_sub = paths[nxt][1].name if len(paths[nxt]) > 1 else None
        counted[i] = counted[nxt] if sub is not None and sub == next_sub else counted[prev]
    return counted


def count_anchors(order: list[int], paths: list[tuple[Region, ...]], backward: bool
                  ) -> list[int | None]:
    """Per site: the layer of the anchors in ``order`` (0 = the first), a new layer starting
    where the sublayer goes back (a later block in the source when the block is walked
    backwards, an earlier one otherwise); stray layers merged; None for the other sites."""
    counted: list[int | None] = [None] * len(paths)
    index, prev_line = -1, None
    for i in order:
        path = paths[i]
        line = path[1].line if len(path) > 1 else None
        if index < 0:
            index = 0
        elif line is not None and prev_line is not None and (
            line > prev_line if backward else line < prev_line
        ):
            index += 1  # the sublayer went back: the next layer
        if line is not None:
            prev_line = line
        counted[i] = index
    return _merge_stray_layers(counted)


def count_layers_by_node_order(graph: CompiledGraph, paths: list[tuple[Region, ...]],
                               clear: list[bool]) -> list[int | None]:
    """Per site: the layer counted in the order the backward graph was built, read from its
    FX node numbers (analysis/metrics/nodeorder.py), for a graph whose launch order mixes
    its layers."""
    order = gemm_anchors(graph, paths, clear, lambda kernel: _extern_family(kernel) == "gemm")
    return place_by_votes(graph, paths, count_anchors(order, paths, backward=True))


def _merge_stray_layers(counted: list[int | None]) -> list[int | None]:
    """Layers counted from anchors, with stray ones folded into their neighbour.

    Inductor's partitioner may recompute an op of the layer the backward starts with at the
    very top of the backward graph, before the loss head's gradient (seen on 32 layers:
    the last layer's attention forward, one anchor ahead of 32 layers of 15): counted alone it
    is one layer too many.  A layer with fewer than half the median anchors per layer joins
    the next layer in launch order (the previous one at the end), and layers are renumbered.
    """
    sizes = Counter(c for c in counted if c is not None)
    if len(sizes) < 2:
        return counted
    typical = sorted(sizes.values())[len(sizes) // 2]
    order = sorted(sizes)
    target: dict[int, int] = {}
    for pos, layer in enumerate(order):
        if sizes[layer] * 2 >= typical:
            continue
        rest = order[pos + 1:] or order[:pos][::-1]
        target[layer] = next((n for n in rest if sizes[n] * 2 >= typical), layer)
    kept = sorted({target.get(c, c) for c in order})
    renumber = {layer: n for n, layer in enumerate(kept)}
    return [None if c is None else renumber[target.get(c, c)] for c in counted]


def _layers(counted: list[int | None]) -> int:
    return max((c for c in counted if c is not None), default=-1) + 1


def graph_places(graph: CompiledGraph, n_layers: int | None = None
                 ) -> tuple[list[tuple[Region, ...]], list[int | None], str]:
    """(majority range path, layer counted) of every call site, and how layers were counted:
    in launch order, or, for a backward graph where that does not find ``n_layers``, in the
    order of its FX node numbers when that does."""
    traces = [own_traces(s) for s in graph.sites]
    paths = [majority_path(t) for t in traces]
    clear = [unanimous(t) for t in traces]
    counted = count_layers(graph, paths, clear)
    if n_layers and graph.kind == "backward" and _layers(counted) not in (0, n_layers):
        by_nodes = count_layers_by_node_order(graph, paths, clear)
        if _layers(by_nodes) == n_layers:
            return paths, by_nodes, NODE_ORDER
    return paths, counted, LAUNCH_ORDER


def _place(path: tuple[Region, ...], layer: int | None) -> Place:
    names = [r.name for r in path]
    if names and names[0] == INDEXED:
        rest = names[1:]
        shown = ([LAYER.format(layer)] if layer is not None else []) + rest
        return Place(tuple(shown), layer, rest[0] if rest else None,
                     rest[-1] if rest else None)
    return Place(tuple(names), None, None, names[-1] if names else None)


def places_of(graphs: list[CompiledGraph], n_layers: int | None
              ) -> tuple[list[list[Place]], dict[int, int], bool, dict[int, str]]:
    """Places of every call site; layers are kept only when every graph with layers shows
    ``n_layers`` of them (or, without ``n_layers``, when they all show the same number).
    Also: layers counted and how, per graph position (graphs with layers)."""
    found: dict[int, int] = {}  # graph position -> layers counted
    counted_by: dict[int, str] = {}
    parts = []
    for i, g in enumerate(graphs):
        paths, counted, how = graph_places(g, n_layers)
        if layers := _layers(counted):
            found[i], counted_by[i] = layers, how
        parts.append((g, paths, counted))
    counts = set(found.values())
    ok = bool(found) and (counts == {n_layers} if n_layers is not None else len(counts) == 1)
    places = []
    for i, (g, paths, counted) in enumerate(parts):
        n = found.get(i, 0)
        row = []
        for path, c in zip(paths, counted, strict=True):
            layer = None
            if ok and c is not None:
                layer = n - 1 - c if g.kind == "backward" else c
            row.append(_place(path, layer))
        places.append(row)
    return places, found, ok, counted_by


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
              n_layers: int | None) -> Attribution:
    """Every op's compiled call site and place (module docstring)."""
    places, found, ok, counted_by = places_of(graphs, n_layers)
    n = ops.size
    out = Attribution(
        graphs=graphs, places=places,
        op_graph=np.full(n, -1, np.int64), op_site=np.full(n, -1, np.int64),
        op_invocation=np.full(n, -1, np.int64), op_status=np.full(n, UNMATCHED, np.int64),
        n_layers=n_layers, layers_found=found, layers_ok=ok, layers_counted_by=counted_by,
    )
    if graphs and n:
        align(ops, phase, graphs, places, out)
    return out


__all__ = ["ANCHOR", "EXTERN", "GLUE", "LAUNCH_ORDER", "LAYER", "NODE_ORDER", "ORDERED",
           "STATUS_NAMES", "UNMATCHED", "Attribution", "Place", "align", "attribute",
           "count_anchors", "count_layers", "count_layers_by_node_order", "graph_places",
           "majority_path", "places_of", "spread", "unanimous"]
