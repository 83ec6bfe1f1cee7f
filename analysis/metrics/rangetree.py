"""Layers and sublayers among a capture's NVTX range names, read from how its ranges nest.

A workload that opens one range per layer names them as a family ``<stem><i>`` (``block0``
... ``block11``; the published H100 GPT captures have such a family): the names of one stem
numbered 0..n-1 (or 1..n), whose ranges lie inside a phase range. They are the layers. A name
whose ranges open, most of them, directly inside a layer's range is a sublayer (the GPT
captures' attention and FFN ranges); what opens deeper is an op. Nothing here knows a
workload's names: only their numbering and nesting. A model workload's layers are modules
(``module:`` ranges and its run record's structure, analysis/metrics/modules.py), not read
here.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

import numpy as np

LAYER, SUBLAYER = "layer", "sublayer"
_NUMBERED = re.compile(r"^(?P<stem>.*\D)(?P<index>\d+)$")


def parents(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Per range: the innermost range of its thread that holds it (-1 for none). Ranges of
    one thread nest (push/pop); a range starting where another starts is inside it when it
    ends first."""
    out = np.full(start.size, -1, np.int64)
    order = np.lexsort((-end, start, tid))
    stack: list[int] = []
    thread = None
    for i in order.tolist():
        if tid[i] != thread:
            thread, stack = tid[i], []
        while stack and end[stack[-1]] < end[i]:
            stack.pop()  # closed before this one ends: not around it
        if stack:
            out[i] = stack[-1]
        stack.append(i)
    return out


def layer_families(names: Sequence[str], skip: Collection[str] = ()) -> dict[str, list[str]]:
    """Stem -> its names, for the stems numbered 0..n-1 or 1..n (``skip``: names that are
    something else already, e.g. the phases)."""
    by_stem: dict[str, dict[int, str]] = {}
    for name in names:
        m = _NUMBERED.match(name)
        if m and name not in skip:
            by_stem.setdefault(m["stem"], {})[int(m["index"])] = name
    return {stem: [found[i] for i in sorted(found)] for stem, found in by_stem.items()
            if sorted(found) in (list(range(len(found))), list(range(1, len(found) + 1)))}


def layer_kinds(names: Sequence[str], name_of: np.ndarray, start: np.ndarray, end: np.ndarray,
                tid: np.ndarray, phases: Collection[str], skip: Collection[str] = ()
                ) -> dict[str, str]:
    """Name -> ``layer`` or ``sublayer`` (module docstring); names of neither are absent.
    ``name_of``: per range, its index into ``names``; ``phases``: the phase range names."""
    families = layer_families(names, skip={*skip, *phases})
    if not families or start.size == 0:
        return {}
    parent = parents(start, end, tid)
    phase_codes = np.array([i for i, n in enumerate(names) if n in phases], np.int64)
    in_phase = _inside_any(parent, name_of, phase_codes)
    kinds: dict[str, str] = {}
    code = {n: i for i, n in enumerate(names)}
    for members in families.values():
        mine = np.isin(name_of, [code[n] for n in members])
        if mine.any() and in_phase[mine].mean() > 0.5:
            kinds.update(dict.fromkeys(members, LAYER))
    if not kinds:
        return {}
    layer_codes = np.array([code[n] for n in kinds], np.int64)
    parent_is_layer = (parent >= 0) & np.isin(name_of[np.maximum(parent, 0)], layer_codes)
    for i, name in enumerate(names):
        if name in kinds or name in phases or name in skip:
            continue
        mine = name_of == i
        if mine.any() and parent_is_layer[mine].mean() > 0.5:
            kinds[name] = SUBLAYER
    return kinds


def _inside_any(parent: np.ndarray, name_of: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Per range: whether one of its ancestors has a name in ``codes``."""
    hit = np.zeros(parent.size, bool)
    up = parent.copy()
    while (up >= 0).any():
        live = up >= 0
        hit[live] |= np.isin(name_of[up[live]], codes)
        up[live] = parent[up[live]]
    return hit


__all__ = ["LAYER", "SUBLAYER", "layer_families", "layer_kinds", "parents"]
