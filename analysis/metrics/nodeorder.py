"""Layers of a backward graph from its FX node numbers, where launch order cannot tell them.

Inductor may schedule a backward grouped by kind across all layers: on the H100, GPT 2.7B
under autocast runs the input-gradient chain of all 32 layers first, then every layer's
weight-gradient GEMMs, norm-weight reductions and gradient casts.  Those deferred calls have
the same source line in every layer, so counting layers in launch order
(:func:`analysis.metrics.attribution.count_layers`) cannot split them.

The names of the FX nodes a call was generated from (its ``Topologically Sorted Source
Nodes``: ``mm_230``, ``convert_element_type_982``) keep the order in which the graph was
built, before Inductor scheduled it: among the nodes of one kind (the name without its
number), a larger number was made later.  Autograd builds the backward layer by layer, the
last layer first, walking each block's source backwards; the forward ops a backward
recomputes were made first layer first, walking the block forwards.

1. **Anchors**: the clear GEMM calls with one ``mm``-family node, ordered by that node's
   number; a new layer starts where their sublayer goes back, as in launch order.
2. **Votes**: every other call in a layer votes with each of its nodes.  A node between two
   placed nodes of its kind in one layer is in that layer.  Between two layers, it is in the
   one its place in the block fits: at or past the earlier node's place in the order the
   block is walked, or at or before the later node's.  Calls are placed in rounds, certain
   votes first, so that each round compares with more placed nodes; a call still undecided
   after that takes the layer of the nearer node number.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from analysis.reading.sourceregions import INDEXED, Region
from analysis.reading.torchtrace import CompiledGraph

_NUMBERED = re.compile(r"^(?P<kind>.+?)_(?P<number>\d+)$")
_GEMM_NODE = re.compile(r"^(?:mm|bmm|addmm)(?:_\d+)?$")

Path = tuple[Region, ...]


def node_key(name: str) -> tuple[str, int]:
    """(kind, number) of an FX node name; the first node of a kind has no number (0)."""
    m = _NUMBERED.match(name)
    return (m["kind"], int(m["number"])) if m else (name, 0)


@dataclass(frozen=True)
class _Known:
    number: int
    layer: int
    where: tuple[int, ...]  # lines of the ranges below the layer (sublayer first)


def _in_layer(path: Path) -> bool:
    return bool(path) and path[0].name == INDEXED


def _where(path: Path) -> tuple[int, ...]:
    return tuple(r.line for r in path[1:])


def gemm_anchors(graph: CompiledGraph, paths: Sequence[Path], clear: Sequence[bool],
                 is_gemm: Callable[[str], bool]) -> list[int]:
    """The clear GEMM calls in a layer with exactly one GEMM node, in that node's order."""
    numbered = []
    for i, site in enumerate(graph.sites):
        if site.is_triton or not clear[i] or not _in_layer(paths[i]) or not is_gemm(site.kernel):
            continue
        gemms = [node_key(n)[1] for n in site.source_nodes if _GEMM_NODE.match(n)]
        if len(gemms) == 1:
            numbered.append((gemms[0], i))
    return [i for _, i in sorted(numbered)]


def _known_nodes(graph: CompiledGraph, layer: Sequence[int | None],
                 paths: Sequence[Path]) -> dict[str, list[_Known]]:
    """Per node kind, the nodes of the placed calls, by number."""
    seen: dict[str, dict[int, _Known]] = {}
    for i, c in enumerate(layer):
        if c is None:
            continue
        for name in graph.sites[i].source_nodes:
            kind, number = node_key(name)
            seen.setdefault(kind, {}).setdefault(number, _Known(number, c, _where(paths[i])))
    return {kind: [nodes[n] for n in sorted(nodes)] for kind, nodes in seen.items()}


def _node_vote(known: list[_Known], number: int, where: tuple[int, ...],
               loose: bool) -> int | None:
    """The layer a node of a call at ``where`` is in, from the placed nodes of its kind."""
    k = bisect.bisect_left(known, number, key=lambda n: n.number)
    if k < len(known) and known[k].number == number:
        return known[k].layer
    lo = known[k - 1] if k > 0 else None
    hi = known[k] if k < len(known) else None
    if lo is None or hi is None:
        edge = hi or lo
        return edge.layer if loose and edge else None
    if lo.layer == hi.layer:
        return lo.layer
    backwards = hi.layer > lo.layer  # made last layer first: the block walked backwards
    fits_lo = where <= lo.where if backwards else where >= lo.where
    fits_hi = where >= hi.where if backwards else where <= hi.where
    if fits_lo != fits_hi:
        return lo.layer if fits_lo else hi.layer
    if loose:
        return lo.layer if number - lo.number <= hi.number - number else hi.layer
    return None


def _site_vote(graph: CompiledGraph, i: int, where: tuple[int, ...],
               known: dict[str, list[_Known]], loose: bool) -> int | None:
    """The layer most of a call's nodes vote for; None on no vote or a tie."""
    votes: Counter[int] = Counter()
    for name in graph.sites[i].source_nodes:
        kind, number = node_key(name)
        if kind in known:
            v = _node_vote(known[kind], number, where, loose)
            if v is not None:
                votes[v] += 1
    top = votes.most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def place_by_votes(graph: CompiledGraph, paths: Sequence[Path],
                   layer: list[int | None]) -> list[int | None]:
    """``layer`` (the anchors' layers) completed for every call in a layer (step 2)."""
    layer = list(layer)
    loose = False
    while True:
        known = _known_nodes(graph, layer, paths)
        new = {i: _site_vote(graph, i, _where(paths[i]), known, loose)
               for i, c in enumerate(layer) if c is None and _in_layer(paths[i])}
        new = {i: c for i, c in new.items() if c is not None}
        if new:
            for i, c in new.items():
                layer[i] = c
        elif loose:
            return layer
        else:
            loose = True  # certain votes are exhausted: the nearer number decides the rest


__all__ = ["gemm_anchors", "node_key", "place_by_votes"]
