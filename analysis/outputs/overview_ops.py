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
from analysis.outputs.runs import OK, empty_cell, module_table_suspect

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


def _side_by_side(sides: list[OpTable]) -> Grid:
    header: list[str] = []
    columns: list[list[list[str]]] = []
    for side in sides:
        kind = "ATen op" if side.source == OP_CAPTURE else "compiled kernels' source"
        header += [f"{_rung(side)}: {kind}", "GPU ms/step", "share", "calls/step"]
        columns.append([[op_name(str(r["Op"])), _cell(r["GPU ms/step"]),
                         _share(r["GPU Share of Step"]), _cell(r["Calls/Step"])]
                        for _, r in side.top().iterrows()])
    depth = max(len(c) for c in columns)
    rows = [[cell for c in columns for cell in (c[i] if i < len(c) else ["", "", "", ""])]
            for i in range(depth)]
    caption = f"Top {TOP_OPS} by GPU time per step. " + " ".join(_what_rows_are(sides))
    return Grid(header, rows, caption, shorten=True)


def _rung(side: OpTable) -> str:
    rung = side.run.get("rung")
    return str(side.run["run"]) if empty_cell(rung) else str(rung)


def _what_rows_are(sides: list[OpTable]) -> list[str]:
    """One sentence per kind of op table: which rung's rows are ATen ops, which are the
    sources of compiled kernels."""
    out = []
    for side in sides:
        if side.source == OP_CAPTURE:
            out.append(f"**{_rung(side)}** (eager, `stats/ops.csv`): ATen ops from its op "
                       "capture, each with the GPU time of the kernels it launched itself "
                       f"({_overhead(side.run)}).")
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
        caption = (f"ATen ops from its op capture (`{run['run']}/stats/ops.csv`: torch.profiler's "
                   f"op ranges), by {'GPU' if gpu else 'CPU'} time; {_overhead(run)}.")
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

MODULE_COLUMNS = ["Forward GPU ms/step", "Backward GPU ms/step", "Share of Step"]


def module_tables(results: Path, ladders: dict[str, pd.DataFrame]) -> list[Titled]:
    """Per ladder, its fastest rung's module table at a glance (stats/module_table.csv of a
    model workload): the outermost modules, then every layer summed and each sublayer summed
    over the layers."""
    out = []
    for ladder in ladders.values():
        ok = ladder[(ladder["status"] == OK) & ladder["step_ms"].notna()]
        if ok.empty:
            continue
        run = str(ok.loc[ok["step_ms"].idxmin(), "run"])
        modules = _read_modules(results / run / "stats" / "module_table.csv")
        if modules is None:
            continue
        suspect = module_table_suspect(results, run)
        if suspect:
            out.append(Titled(f"Where the step goes by module: {run}", Grid(
                ["module table not shown"], [[f"it fails its self-check: {suspect}"]],
                f"`{run}/stats/module_table.csv` (docs/analysis.md, the module table).")))
            continue
        glance = module_glance(modules)
        out.append(Titled(f"Where the step goes by module: {run}", Grid(
            list(glance.columns), glance.values.tolist(),
            f"GPU ms per step, inclusive of each module's children (`{run}/stats/"
            "module_table.csv`); shares of the whole step.")))
    return out


def _read_modules(path: Path) -> pd.DataFrame | None:
    if not path.exists() or path.stat().st_size == 0:
        return None
    table = pd.read_csv(path, keep_default_na=False)
    if table.empty or not table["Share of Step"].astype(str).str.len().any():
        return None  # no GPU time (a CPU run)
    return table


def module_glance(table: pd.DataFrame) -> pd.DataFrame:
    """The outermost modules, then all layers and each sublayer over the layers."""
    roots = set(outermost(table["Module"]))
    layers = table[(table["Layer"] != "") & (table["Layer"] == table["Module"])]
    # a sublayer's own row (layers.0.attn), not the modules inside it (layers.0.attn.q_proj)
    sublayers = table[[s != "" and m.split(".")[-1] == s
                       for m, s in zip(table["Module"], table["Sublayer"], strict=True)]]
    rows = [_glance_row(r["Module"], [r]) for _, r in table.iterrows()
            if r["Module"] in roots and r["Module"] not in set(layers["Layer"])]
    if len(layers):
        rows.append(_glance_row(f"{len(layers)} layers ({layers['Module'].iloc[0]}, ...)",
                                [r for _, r in layers.iterrows()]))
        for name, group in sublayers.groupby("Sublayer", sort=False):
            rows.append(_glance_row(f"  {name}, all layers", [r for _, r in group.iterrows()]))
    return pd.DataFrame(rows)


def _glance_row(name: str, rows: list[pd.Series]) -> dict[str, str]:
    fwd, bwd, share = (sum(float(r[c] or 0) for r in rows) for c in MODULE_COLUMNS)
    return {"module": name, "forward ms": f"{fwd:.3g}", "backward ms": f"{bwd:.3g}",
            "share of step": f"{share:.0%}"}
