"""Where a ladder's step goes, on the overview: its top ops (the first eager rung with an op
table beside the fastest rung) and its fastest rung's modules.

An op table is a run's ``stats/ops.csv`` (its op capture: ATen ops, torch.profiler's op
ranges) or, for a compiled run, ``stats/compiled_ops.csv`` (its kernel map: each compiled
kernel under the ATen ops Inductor generated it from; docs/analysis.md, "Operator table").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.metrics.modules import outermost
from analysis.outputs.overview_experiments import number
from analysis.outputs.overview_page import EMPTY, Grid, Titled
from analysis.outputs.runs import OK, empty_cell, module_table_suspect, read_json

TOP_OPS = 5
OP_CAPTURE, KERNEL_MAP = "ops.csv", "compiled_ops.csv"


@dataclass
class OpTable:
    run: pd.Series  # the run's summary row
    source: str  # OP_CAPTURE or KERNEL_MAP
    table: pd.DataFrame

    @property
    def on_gpu(self) -> bool:
        return bool(self.table["GPU Self (ns)"].fillna(0).sum() > 0)

    def top(self, n: int = TOP_OPS) -> pd.DataFrame:
        by = "GPU Self (ns)" if self.on_gpu else "CPU Self (ns)"
        return self.table.sort_values(by, ascending=False).head(n)


def op_table(results: Path, run: pd.Series) -> OpTable | None:
    """The run's op capture's table when it has one, else its kernel map's."""
    stats = results / str(run["run"]) / "stats"
    choices = [OP_CAPTURE, KERNEL_MAP] if run.get("ops_status") == OK else [KERNEL_MAP]
    for name in choices:
        path = stats / name
        if path.is_file() and path.stat().st_size:
            table = pd.read_csv(path)
            if not table.empty:
                return OpTable(run, name, table)
    return None


def op_name(name: str) -> str:
    """An op table's row name, shorter: ``fused(aten::add, aten::mul)`` -> ``fused(add, mul)``."""
    if name.startswith("fused(") and name.endswith(")"):
        return "fused(" + re.sub(r"\baten::", "", name[6:-1]) + ")"
    return name


def _eager(run: pd.Series) -> bool:
    return all(empty_cell(run.get(k)) or str(run.get(k)) == "off"
               for k in ("compile", "cuda_graph"))


# --- one table per ladder: its eager rung and its fastest rung side by side ---------------------


def ladder_ops(results: Path, ladders: dict[str, pd.DataFrame],
               summary: pd.DataFrame) -> list[Titled]:
    """Per ladder, the top ops of the first eager rung with an op table and of the fastest
    rung with one, side by side."""
    rows = summary.set_index("run", drop=False)
    out = []
    for name, ladder in ladders.items():
        tables = [t for run in ladder.loc[ladder["status"] == OK, "run"]
                  if run in rows.index and (t := op_table(results, rows.loc[run])) is not None]
        if not tables:
            continue
        best = min(tables, key=lambda t: float(t.run["step_ms"]))
        first = next((t for t in tables if _eager(t.run)), tables[0])
        sides = [first, best] if first is not best else [best]
        out.append(Titled(f"Top ops: {name}", _side_by_side(sides)))
    return out


# What a table of op tables ranks by: GPU time, or CPU self time when no side had GPU work.
RANKED = {True: ("GPU ms/step", "GPU Share of Step", "GPU time per step"),
          False: ("CPU Self ms/step", "CPU Share of Step",
                  "CPU self time per step (no GPU work in these runs: each op's own host "
                  "time, without the ops it called)")}


def _side_by_side(sides: list[OpTable]) -> Grid:
    gpu = any(side.on_gpu for side in sides)
    time, share, ranked_by = RANKED[gpu]
    header: list[str] = []
    columns: list[list[list[str]]] = []
    for side in sides:
        kind = "ATen op" if side.source == OP_CAPTURE else "compiled kernels' source"
        header += [f"{_rung(side)}: {kind}", time.replace("Self", "self"), "share",
                   "calls/step"]
        columns.append([[op_name(str(r["Op"])), _cell(r[time]), _share(r.get(share)),
                         _cell(r["Calls/Step"])] for _, r in side.top().iterrows()])
    depth = max(len(c) for c in columns)
    rows = [[cell for c in columns for cell in (c[i] if i < len(c) else ["", "", "", ""])]
            for i in range(depth)]
    caption = f"Top {TOP_OPS} by {ranked_by}. " + " ".join(_what_rows_are(sides, gpu))
    return Grid(header, rows, caption, shorten=True)


def _rung(side: OpTable) -> str:
    rung = side.run.get("rung")
    return str(side.run["run"]) if empty_cell(rung) else str(rung)


def _what_rows_are(sides: list[OpTable], gpu: bool = True) -> list[str]:
    """One sentence per kind of op table: which rung's rows are ATen ops, which are the
    sources of compiled kernels."""
    out = []
    each = ("the GPU time of the kernels it launched itself" if gpu else
            "its own CPU time, inflated by the op ranges")
    for side in sides:
        if side.source == OP_CAPTURE:
            out.append(f"**{_rung(side)}** (eager, `stats/ops.csv`): ATen ops from its op "
                       f"capture, each with {each} ({_overhead(side.run)}).")
    compiled = [f"**{_rung(s)}**" for s in sides if s.source == KERNEL_MAP]
    if compiled:
        out.append(f"{' and '.join(compiled)} (compiled, `stats/compiled_ops.csv`): what each "
                   "kernel came from: `aten::…` a library kernel (cuBLAS GEMM, cuDNN "
                   "attention) under its op, `fused(…)` a Triton kernel Inductor fused from "
                   "those ops, `triton_…` one whose source ops were not recovered, "
                   "`(outside compiled code)` kernels launched between the compiled graphs.")
    return out


def _overhead(run: pd.Series) -> str:
    overhead = number(run.get("ops_overhead"))
    cost = f"{overhead:+.0%}" if overhead is not None else "not measured"
    return f"the op ranges changed the traced step by {cost} against the lean capture"


# --- the op captures of runs outside the ladders ------------------------------------------------


def capture_ops(results: Path, summary: pd.DataFrame, ladder_runs: set[str]) -> list[Titled]:
    """Per run outside the ladders with an op capture: its top ops by GPU time (CPU time on a
    run without GPU work)."""
    out = []
    for _, run in summary[(summary["status"] == OK)].iterrows():
        if run["run"] in ladder_runs or run.get("ops_status") != OK:
            continue
        table = op_table(results, run)
        if table is None or table.source != OP_CAPTURE:
            continue
        gpu = table.on_gpu
        rows = [[op_name(str(r["Op"])), _cell(r["GPU ms/step"]) if gpu else EMPTY,
                 _share(r["GPU Share of Step"]) if gpu else EMPTY, _cell(r["Calls/Step"]),
                 _cell(r["Kernels/Call"]) if gpu else EMPTY, _cell(r["CPU Self ms/step"])]
                for _, r in table.top().iterrows()]
        by = "GPU time" if gpu else "CPU self time (no GPU work in this run)"
        caption = (f"ATen ops from its op capture (`{run['run']}/stats/ops.csv`: torch.profiler's "
                   f"op ranges), by {by}; {_overhead(run)}.")
        grid = Grid(["ATen op", "GPU ms/step", "GPU share", "calls/step", "kernels/call",
                     "CPU self ms/step"], rows, caption, shorten=True)
        out.append(Titled(f"Top ops: {run['run']}", grid.without_empty_columns()))
    return out


def _cell(value: object) -> str:
    f = number(value)
    return EMPTY if f is None else f"{f:.3g}" if abs(f) < 1000 else f"{f:.0f}"


def _share(value: object) -> str:
    f = number(value)
    return EMPTY if f is None else f"{f:.0%}"


# --- modules -----------------------------------------------------------------------------------

MODULE_COLUMNS = {True: ["Forward GPU ms/step", "Backward GPU ms/step"],
                  False: ["Forward CPU ms/step", "Backward CPU ms/step"]}
# Why a model run's module table has no rows: compiled code runs no module range, and the
# kernel provenance that maps compiled code to modules is of GPU kernels.
NO_MODULES = ("No rows: this rung is compiled and ran on the CPU, where compiled code has no "
              "module ranges (they run in eager code only) and no GPU kernels whose Inductor "
              "provenance would name their modules. Its eager rungs' module tables have rows; "
              "on a GPU the compiled rung's would too.")


def module_tables(results: Path, ladders: dict[str, pd.DataFrame]) -> list[Titled]:
    """Per ladder of a model workload, its fastest rung's module table at a glance
    (stats/module_table.csv): the outermost modules, then every layer summed and each
    sublayer summed over the layers; by GPU time, or CPU time on a run without GPU work; an
    empty table says why."""
    out = []
    for ladder in ladders.values():
        ok = ladder[(ladder["status"] == OK) & ladder["step_ms"].notna()]
        if ok.empty:
            continue
        run = str(ok.loc[ok["step_ms"].idxmin(), "run"])
        modules = _read_modules(results / run / "stats" / "module_table.csv")
        if modules is None:
            continue
        title = f"Where the step goes by module: {run}"
        if modules.empty:
            if _compiled_on_cpu(read_json(results / run / "times.json") or {}):
                out.append(Titled(title, Grid(["module", "forward ms", "backward ms"], [],
                                              NO_MODULES)))
            continue
        suspect = module_table_suspect(results, run)
        if suspect:
            out.append(Titled(title, Grid(
                ["module table not shown"], [[f"it fails its self-check: {suspect}"]],
                f"`{run}/stats/module_table.csv` (docs/analysis.md, the module table).")))
            continue
        gpu = bool(modules["Share of Step"].astype(str).str.len().any())
        glance = module_glance(modules, gpu, _step_cpu_ms(results / run / "stats"))
        what = ("GPU ms per step" if gpu else
                "CPU ms per step (no GPU work in this run: the module ranges' own time)")
        out.append(Titled(title, Grid(
            list(glance.columns), glance.values.tolist(),
            f"{what}, inclusive of each module's children (`{run}/stats/module_table.csv`); "
            "shares of the whole step.")))
    return out


def _compiled_on_cpu(record: dict) -> bool:
    """Whether the run's capture record is of compiled code timed on the CPU."""
    compiled = str((record.get("params") or {}).get("compile", "off")) != "off"
    return compiled and record.get("timer") == "wall"


def _read_modules(path: Path) -> pd.DataFrame | None:
    """A model run's module table (empty: header only), None for a run without one (a
    workload without module ranges writes no rows and no model structure)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    table = pd.read_csv(path, keep_default_na=False)
    if table.empty and (read_json(path.parent.parent / "times.json") or {}).get(
            "workload") != "model":
        return None  # no module ranges by design (the GPT's table is always a header)
    return table


def _step_cpu_ms(stats: Path) -> float | None:
    """The step's CPU ms (the phase table's ``profiled_step`` row), for CPU shares."""
    path = stats / "phase_gpu_time.csv"
    if not path.is_file() or path.stat().st_size == 0:
        return None
    table = pd.read_csv(path)
    row = table.loc[table["Range"].astype(str) == "profiled_step", "CPU ms/step"]
    return float(row.iloc[0]) if len(row) and float(row.iloc[0]) > 0 else None


def module_glance(table: pd.DataFrame, gpu: bool = True,
                  step_cpu_ms: float | None = None) -> pd.DataFrame:
    """The outermost modules, then all layers and each sublayer over the layers, by GPU time
    (CPU time when ``gpu`` is false: shares of ``step_cpu_ms``)."""
    roots = set(outermost(table["Module"]))
    layers = table[(table["Layer"] != "") & (table["Layer"] == table["Module"])]
    # a sublayer's own row (layers.0.attn), not the modules inside it (layers.0.attn.q_proj)
    sublayers = table[[s != "" and m.split(".")[-1] == s
                       for m, s in zip(table["Module"], table["Sublayer"], strict=True)]]
    def row(name: str, rows: list[pd.Series]) -> dict[str, str]:
        return _glance_row(name, rows, gpu, step_cpu_ms)

    rows = [row(r["Module"], [r]) for _, r in table.iterrows()
            if r["Module"] in roots and r["Module"] not in set(layers["Layer"])]
    if len(layers):
        rows.append(row(f"{len(layers)} layers ({layers['Module'].iloc[0]}, ...)",
                        [r for _, r in layers.iterrows()]))
        for name, group in sublayers.groupby("Sublayer", sort=False):
            rows.append(row(f"  {name}, all layers", [r for _, r in group.iterrows()]))
    return pd.DataFrame(rows)


def _glance_row(name: str, rows: list[pd.Series], gpu: bool,
                step_cpu_ms: float | None) -> dict[str, str]:
    fwd, bwd = (sum(float(r[c] or 0) for r in rows) for c in MODULE_COLUMNS[gpu])
    if gpu:
        share: str = f"{sum(float(r['Share of Step'] or 0) for r in rows):.0%}"
    else:
        share = f"{(fwd + bwd) / step_cpu_ms:.0%}" if step_cpu_ms else EMPTY
    return {"module": name, "forward ms": f"{fwd:.3g}", "backward ms": f"{bwd:.3g}",
            "share of step": share}
