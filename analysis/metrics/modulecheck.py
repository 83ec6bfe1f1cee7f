"""The module table's self-check: the invariants any true inclusive attribution keeps.

* a parent holds at least what its children hold inside it (children that overlap, e.g.
  ranges left open into a sibling's time, sum past their parent);
* modules side by side (the outermost ones) never sum past the step, nor does any one module;
* every module range closes inside the step it opened in.

Times are per step, in one unit (GPU ms on a GPU run, CPU ms on a CPU run). A child's time
counts only inside its parent, so a module called from elsewhere too (one projection shared
by every layer, whose path names only the first) does not make its parent look short; a
module called from inside a sibling (a rotary embedding held by the root, called in every
layer's attention) is a guest there: its time is already its host's, so it does not count
again in its siblings' sum. The worst violation is returned as a sentence (None: the table passes);
analysis/metrics/modules.py flags the run ``module_attribution_suspect`` with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# How far a sum may pass its whole before it is a violation: rounding of per-step
# milliseconds, and a launch that falls on a range's edge.
REL_TOLERANCE = 0.005
ABS_TOLERANCE_MS = 0.002


def _nearest_parent(path: str, present: set[str]) -> str | None:
    """The closest ancestor of ``path`` among ``present`` (None: an outermost module)."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in present:
            return prefix
    return None


def children_of(paths: Sequence[str]) -> dict[str | None, list[str]]:
    """Nearest present parent (None for the outermost modules) -> its child paths, in order:
    a ModuleList that is never called has no row, so its layers are the model's children."""
    present = set(paths)
    children: dict[str | None, list[str]] = {}
    for path in paths:
        children.setdefault(_nearest_parent(path, present), []).append(path)
    return children


def _over(part: float, whole: float) -> bool:
    return part > whole * (1 + REL_TOLERANCE) + ABS_TOLERANCE_MS


def check_module_table(paths: Sequence[str], total: Callable[[str], float],
                       within: Callable[[str, str | None], float], step: float | None,
                       range_problems: Sequence[str], unit: str) -> str | None:
    """The worst violation of the table's invariants as a sentence, or None.

    ``total(path)``: the module's inclusive time per step; ``within(child, parent)``: the
    child's time inside its parent's (parent None: inside the step), outside the siblings it
    is a guest of; ``step``: the step's time per step (None: unknown, the
    step checks are skipped); ``range_problems``: ranges that left their step."""
    children = children_of(paths)
    worst: tuple[float, str] | None = None

    def note(ratio: float, text: str) -> None:
        nonlocal worst
        if worst is None or ratio > worst[0]:
            worst = (ratio, text)

    for parent, kids in children.items():
        if parent is None:
            continue
        inside = sum(within(k, parent) for k in kids)
        whole = total(parent)
        if _over(inside, whole):
            note(inside / whole if whole else float("inf"),
                 f"the children of {parent} ({_names(kids)}) hold {inside:.4g} {unit}/step "
                 f"inside it, more than its own {whole:.4g}")
    if step:
        roots = children.get(None, [])
        summed = sum(within(r, None) for r in roots)
        if _over(summed, step):
            note(summed / step, f"the outermost modules ({_names(roots)}) sum to "
                 f"{summed / step:.0%} of the step ({summed:.4g} of {step:.4g} {unit}/step)")
        for path in paths:
            if _over(total(path), step):
                note(total(path) / step, f"{path} holds {total(path) / step:.0%} of the step")
    if range_problems:
        text = "; ".join(range_problems[:3]) + (
            f" (and {len(range_problems) - 3} more)" if len(range_problems) > 3 else "")
        return text if worst is None else f"{worst[1]}; {text}"
    return None if worst is None else worst[1]


def check_table_alone(rows: Sequence[dict[str, str]], column: str = "GPU ms/step",
                      unit: str = "GPU ms") -> str | None:
    """The same check on a module table's rows alone (``module_table.csv``: Module and each
    module's inclusive ``column``), for a table whose run predates the check and whose
    capture is gone: each child's whole time stands for its time inside its parent (a
    shared module's calls from elsewhere count too, so this errs toward a flag) and the
    ranges and the step are not known."""
    times = {r["Module"]: float(r.get(column) or 0) for r in rows if r.get("Module")}
    if not any(times.values()):
        return None
    return check_module_table(list(times), times.__getitem__,
                              lambda child, parent: times[child], None, [], unit)


def _names(paths: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(paths[:most])
    return shown + (f", … {len(paths)} in all" if len(paths) > most else "")
