"""The overview's compact table per experiment: the runs a matrix swept, one row per shape.

A run's parameters come from the plan that ran (``plan.json``), so rows sort by their values
(b1, b4, b8, b16; s4096 before s16384), not by their text. Attention runs are pivoted: one
column per implementation (naive, each SDPA backend), forward and forward+backward side by
side, TFLOP/s in the cells; runs comparing the same implementations form one table, whose
caption names what all its rows share. Other runs a ladder or the CS336 table does not show
are listed per workload with the parameters that differ between them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.outputs.overview_page import EMPTY, Grid, Titled
from analysis.outputs.runs import OK, empty_cell

# Keys that say how a run was measured, not what it computed: never a column or a label.
MEASUREMENT_KEYS = {"device", "seed", "warmup", "steps", "workload", "memory_limit_mb",
                    "peak_tflops", "op_ranges", "timeout_min"}
IMPLEMENTATION_KEYS = ("impl", "sdpa_backend")
# Label order and prefixes: b8 h16 s4096 d128 (the FlashAttention benchmark's spelling).
LABEL_ORDER = ["size", "batch", "heads", "seq", "context", "head_dim", "embed", "causal",
               "dtype", "mode"]
PREFIX = {"batch": "b", "heads": "h", "seq": "s", "head_dim": "d", "embed": "e",
          "context": "ctx"}
MODE_LABEL = {"forward": "fwd", "forward_backward": "fwd+bwd", "train": "train"}
# Implementations in the order the README compares them: the hand-written one, then SDPA's
# backends from the reference (math) to the fastest kernels.
IMPLEMENTATION_ORDER = ["naive", "sdpa", "math", "efficient", "flash", "cudnn"]
ATTENTION_WORKLOADS = {
    "attention_core": "Attention kernel (q·kᵀ, softmax, ·v)",
    "attention": "Attention module (projections and attention)",
}


@dataclass
class Run:
    name: str
    params: dict[str, Any]
    row: pd.Series

    @property
    def ok(self) -> bool:
        return self.row.get("status") == OK


def runs_of(summary: pd.DataFrame, plan: dict[str, Any]) -> list[Run]:
    """Every summary row with the parameters the plan ran it with (the summary's own
    columns for a run the plan lacks)."""
    planned = plan.get("runs") or {}
    out = []
    for _, row in summary.iterrows():
        params = (planned.get(str(row["run"])) or {}).get("params")
        if params is None:
            params = {k: row[k] for k in ("workload", *LABEL_ORDER, *IMPLEMENTATION_KEYS)
                      if k in row.index and not empty_cell(row[k])}
        out.append(Run(str(row["run"]), dict(params), row))
    return out


def sort_value(key: str, value: Any, run: Run | None = None) -> tuple[int, float, str]:
    """A parameter's value as a sort key: numbers by value (16 after 4), a GPT size by its
    parameter count, text by text."""
    if key == "size" and run is not None and not empty_cell(run.row.get("params_count")):
        return (0, float(run.row["params_count"]), "")
    if key == "mode" and value in MODE_LABEL:
        return (0, float(list(MODE_LABEL).index(value)), "")
    if isinstance(value, bool):
        return (0, float(value), "")
    try:
        number = float(value)
    except (TypeError, ValueError):
        return (1, 0.0, str(value))
    return (1, 0.0, str(value)) if math.isnan(number) else (0, number, "")


def ordered_keys(keys: Iterable[str]) -> list[str]:
    keys = set(keys)
    return [k for k in LABEL_ORDER if k in keys] + sorted(keys - set(LABEL_ORDER))


def label(params: dict[str, Any], keys: Iterable[str]) -> str:
    """``b8 h16 s4096 d128 causal bf16``: the given keys of a run, short."""
    parts = []
    for key in ordered_keys(keys):
        value = params.get(key)
        if empty_cell(value):
            continue
        if key in PREFIX:
            parts.append(f"{PREFIX[key]}{_int(value)}")
        elif key == "causal":
            parts.append("causal" if _truthy(value) else "non-causal")
        elif key == "mode":
            parts.append(MODE_LABEL.get(str(value), str(value)))
        elif key in ("size", "dtype"):
            parts.append(str(value))
        else:
            parts.append(f"{key} {value}")
    return " ".join(parts)


def varying(params: list[dict[str, Any]], keys: Iterable[str]) -> list[str]:
    """The keys whose value differs between some of the runs."""
    return ordered_keys(k for k in keys if len({_hashable(p.get(k)) for p in params}) > 1)


# --- attention: one column per implementation --------------------------------------------------


def implementation(params: dict[str, Any]) -> str:
    impl = str(params.get("impl") or "sdpa")
    backend = params.get("sdpa_backend")
    if impl == "sdpa" and not empty_cell(backend) and str(backend) != "auto":
        return str(backend)
    return impl


def attention_tables(runs: list[Run]) -> list[Titled]:
    """Per attention workload, one table per set of implementations compared: rows are the
    shapes (numerically sorted), columns the implementations (per mode), cells TFLOP/s."""
    tables = []
    for workload, title in ATTENTION_WORKLOADS.items():
        mine = [r for r in runs if r.params.get("workload") == workload]
        for group in _comparisons(mine):
            if any(r.ok for r in group):  # the failed ones are under "Flagged runs"
                tables.append(_attention_table(title, group))
    return tables


def _shape(run: Run) -> tuple:
    return tuple(sorted((k, _hashable(v)) for k, v in run.params.items()
                        if k not in MEASUREMENT_KEYS and k not in IMPLEMENTATION_KEYS))


def _comparisons(runs: list[Run]) -> list[list[Run]]:
    """The runs grouped by the implementations their shape was run with: a sweep comparing
    naive and SDPA is one table, one comparing the flash and cuDNN backends another."""
    by_shape: dict[tuple, list[Run]] = {}
    for run in runs:
        by_shape.setdefault(_shape(run), []).append(run)
    groups: dict[frozenset, list[Run]] = {}
    for shape_runs in by_shape.values():
        impls = frozenset(implementation(r.params) for r in shape_runs)
        groups.setdefault(impls, []).extend(shape_runs)
    return sorted(groups.values(), key=lambda g: min(runs.index(r) for r in g))


@dataclass
class _Layout:
    """How a comparison's runs lay out: the keys that tell its rows apart, those all its rows
    share (the title's), and its columns: (mode or None, implementation)."""
    row_keys: list[str]
    shared: list[str]
    columns: list[tuple[str | None, str]]

    @property
    def by_mode(self) -> bool:
        return self.columns[0][0] is not None


def _layout(params: list[dict[str, Any]]) -> _Layout:
    keys = {k for p in params for k in p} - MEASUREMENT_KEYS - set(IMPLEMENTATION_KEYS)
    moving = varying(params, keys)
    # a single shape is named by its dimensions; the rest of what it shares goes to the title
    row_keys = [k for k in moving if k != "mode"] or ordered_keys(k for k in keys if k in PREFIX)
    shared = [k for k in ordered_keys(keys) if k not in moving and k not in row_keys]
    impls = sorted({implementation(p) for p in params}, key=_impl_order)
    if "mode" not in moving:
        return _Layout(row_keys, shared, [(None, i) for i in impls])
    # forward and forward+backward side by side, not two rows per shape
    modes = sorted({str(p.get("mode")) for p in params}, key=lambda m: sort_value("mode", m))
    return _Layout(row_keys, shared, [(m, i) for m in modes for i in impls])


def _attention_table(title: str, runs: list[Run]) -> Titled:
    layout = _layout([r.params for r in runs])
    cells: dict[tuple, dict[tuple, Run]] = {}
    for run in runs:
        row = tuple(_hashable(run.params.get(k)) for k in layout.row_keys)
        mode = str(run.params.get("mode")) if layout.by_mode else None
        cells.setdefault(row, {})[(mode, implementation(run.params))] = run
    rows = sorted(cells.items(), key=lambda item: [
        sort_value(k, v) for k, v in zip(layout.row_keys, item[0], strict=True)])
    header = ["shape"] + [f"{MODE_LABEL.get(m, m)} {i}" if m else i for m, i in layout.columns]
    body = [[label(dict(zip(layout.row_keys, row, strict=True)), layout.row_keys),
             *_bold_best([_attention_cell(found.get(c)) for c in layout.columns],
                         layout.columns)]
            for row, found in rows]
    caption = ("TFLOP/s (analytic FLOPs / untraced step time); **bold**: the fastest per row"
               + (" and mode" if layout.by_mode else "") + ".")
    shared = label(runs[0].params, layout.shared)
    return Titled(f"{title}{' · ' + shared if shared else ''}",
                  Grid(header, body, caption).without_empty_columns())


def _attention_cell(run: Run | None) -> tuple[str, float | None]:
    if run is None:
        return EMPTY, None
    if not run.ok:
        return str(run.row.get("status")), None
    value = number(run.row.get("tflops"))
    return (EMPTY, None) if value is None else (f"{value:.4g}", value)


def _bold_best(values: list[tuple[str, float | None]], columns: list[tuple]) -> list[str]:
    """The cells' text, the fastest of each mode in bold (when it beat another one)."""
    out = [text for text, _ in values]
    for mode in {m for m, _ in columns}:
        mine = [(v, i) for i, ((_, v), (m, _)) in enumerate(zip(values, columns, strict=True))
                if m == mode and v is not None]
        if len(mine) > 1:
            best = max(mine)[1]
            out[best] = f"**{out[best]}**"
    return out


def _impl_order(name: str) -> tuple[int, str]:
    return (IMPLEMENTATION_ORDER.index(name) if name in IMPLEMENTATION_ORDER
            else len(IMPLEMENTATION_ORDER), name)


# --- the other runs, per workload ----------------------------------------------------------------


def other_tables(runs: list[Run], shown: set[str]) -> list[Titled]:
    """Per workload, its runs that no other table shows (when one of them finished)."""
    rest = [r for r in runs if r.name not in shown
            and r.params.get("workload") not in ATTENTION_WORKLOADS]
    groups: dict[str, list[Run]] = {}
    for run in rest:
        groups.setdefault(str(run.params.get("workload")), []).append(run)
    # a group of failed runs only: they are under "Flagged runs"
    return [_workload_table(w, mine) for w, mine in groups.items() if any(r.ok for r in mine)]


def _workload_table(workload: str, runs: list[Run]) -> Titled:
    """The parameters that differ between the runs, their untraced step time and MFU, in the
    parameters' numeric order."""
    keys = {k for r in runs for k in r.params} - MEASUREMENT_KEYS
    moving = varying([r.params for r in runs], keys)
    runs = sorted(runs, key=lambda r: [sort_value(k, r.params.get(k), r) for k in moving])
    rows = [([_param_cell(k, r.params.get(k)) for k in moving] if moving else [r.name])
            + _time_and_mfu(r) for r in runs]
    shared = [k for k in ordered_keys(keys) if k not in moving and k in LABEL_ORDER]
    common = label(runs[0].params, shared) if moving else ""
    caption = f"All {len(runs)}: {common}." if common else ""
    if any(EMPTY in row[:len(moving)] for row in rows):
        caption += " —: not set (the workload's default)."
    header = (moving or ["run"]) + ["ms/step [95% CI]", "MFU"]
    return Titled(f"Other runs: {workload}",
                  Grid(header, rows, caption).without_empty_columns())


def _param_cell(key: str, value: Any) -> str:
    if empty_cell(value):
        return EMPTY
    if key in PREFIX:
        return _int(value)
    return label({key: value}, [key]) if key in ("causal", "mode") else str(value)


def _time_and_mfu(run: Run) -> list[str]:
    return [step_cell(run.row), _percent(run.row.get("mfu")) if run.ok else ""]


def step_cell(row: pd.Series) -> str:
    """``58.54 [57.34, 66.04]``: the untraced step time and its 95% CI; a failed run's
    status."""
    if row.get("status") != OK:
        return str(row.get("status"))
    return (f"{ms(row.get('step_ms'))} [{ms(row.get('step_ci_low_ms'))}, "
            f"{ms(row.get('step_ci_high_ms'))}]")


def ms(value: Any) -> str:
    f = number(value)
    return EMPTY if f is None else (f"{f:.2f}" if f < 100 else f"{f:.1f}")


def _percent(value: Any) -> str:
    f = number(value)
    return EMPTY if f is None else f"{f:.0%}"


def number(value: Any) -> float | None:
    """A CSV cell as a float; None for an empty or non-numeric one."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _int(value: Any) -> str:
    """A shape value as written in the config (CSV floats like 4096.0 back to 4096)."""
    try:
        return str(int(float(value)))
    except (TypeError, ValueError):
        return str(value)


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("true", "1", "1.0", "yes")


def _hashable(value: Any) -> Any:
    if empty_cell(value):
        return None
    return value if isinstance(value, (str, int, float, bool)) else str(value)
