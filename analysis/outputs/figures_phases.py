"""Where a step's time goes: per run, the training phases (NVTX ranges of workloads/steps.py)
as shares of the step with the step's total beside them, the sublayers and the steps inside
attention, each layer's time, and a model workload's top modules (its module table,
analysis/metrics/modules.py) forward and backward, all in the same rows.

Layers and sublayers come from the phase table's ``layer`` and ``sublayer`` rows (numbered
NVTX ranges and the ranges directly inside them, analysis/metrics/rangetree.py: a capture
whose workload opened such ranges), else from the module table (the run's structure: a
layer's row and its sublayers' rows, summed over the layers, eager or compiled).

GPU time per phase where the run launched GPU work; on a CPU (no GPU activity in the
capture) the CPU time inside the same NVTX ranges, labelled as such.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis.metrics.modules import natural_key, outermost
from analysis.outputs import style
from analysis.outputs.figure_data import STEP_RANGE, num, run_names, stats_tables
from analysis.outputs.runs import module_table_suspect

# NVTX ranges inside attention (workloads/attention.py), in execution order
ATTENTION_STEPS = tuple(style.ATTENTION_STEP_COLORS)
SUBLAYER_BASIS = "basis"  # column of phase_frame's sublayer frame: how the rows were made
MODULE_BASIS = "module table"  # the basis of layers and sublayers read from the module table
CLOCK = "clock"  # column of phase_times' frame: "GPU", or "CPU" where no GPU work ran
TABLE = "phase_gpu_time.csv"
MODULE_TABLE = "module_table.csv"  # a model workload's (analysis/metrics/modules.py)
TOP_MODULES = 3  # module groups per run in the modules panel, one bar under another
MODULE_ROW_IN = 0.45  # a run's row when it holds that many bars
_OUTSIDE = "(step, outside phases)"


def phase_frame(results: Path, runs: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(run x phase ms/step, run x sublayer/attention-step share of step)."""
    tables = stats_tables(results, runs, TABLE)
    modules = trusted_modules(results, runs)
    return phase_times(tables).drop(columns=CLOCK), _part_shares(tables, modules)


def layer_frame(results: Path, runs: list[str]) -> pd.DataFrame:
    """run x layer index: ms/step of each layer (module docstring), and the rows' basis."""
    return _layer_frame(stats_tables(results, runs, TABLE), trusted_modules(results, runs))


def sublayer_names(parts: pd.DataFrame) -> list[str]:
    """The sublayer columns of :func:`phase_frame`'s second frame, in their order."""
    return [c for c in parts.columns if c not in (*ATTENTION_STEPS, SUBLAYER_BASIS)]


def _clock(table: pd.DataFrame) -> str | None:
    """Which time the run's table measures its phases in: GPU where its phases launched GPU
    work, else CPU where the phase ranges have CPU time, else None."""
    phases = table[table["Range"].astype(str).isin(style.PHASE_RANGES)]
    if num(phases, "GPU ms/step").fillna(0).sum() > 0:
        return "GPU"
    if num(phases, "CPU ms/step").fillna(0).sum() > 0:
        return "CPU"
    return None


def _ms(table: pd.DataFrame, clock: str) -> pd.Series:
    """Range -> ms per step in ``clock``."""
    return num(table, f"{clock} ms/step").set_axis(table["Range"].astype(str))


def _clocked(tables: dict[str, pd.DataFrame]) -> Iterator[tuple[str, pd.DataFrame, str]]:
    """(run, its phase table, "GPU" or "CPU") for each run whose table has a clock to read."""
    for run, table in tables.items():
        clock = _clock(table) if "Range" in table else None
        if clock is not None:
            yield run, table, clock


def phase_times(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """run x phase: ms per step, and the run's clock (:data:`CLOCK`)."""
    rows = {}
    for run, table, clock in _clocked(tables):
        ms = _ms(table, clock)
        row = {phase: float(ms.get(r, 0) or 0) for r, phase in style.PHASE_RANGES.items()
               if r != _OUTSIDE}  # fmt: skip
        outside = ms.get(_OUTSIDE)
        if clock == "CPU" or pd.isna(outside):
            # CPU time outside the phases is not measured per range: the step's rest
            step = ms.get(STEP_RANGE)
            outside = max(float(step) - sum(row.values()), 0.0) if pd.notna(step) else 0.0
        rows[run] = {**row, style.PHASE_RANGES[_OUTSIDE]: float(outside), CLOCK: clock}
    return pd.DataFrame.from_dict(rows, orient="index", columns=[*style.PHASES, CLOCK])


def _part_shares(tables: dict[str, pd.DataFrame],
                 modules: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """run x (sublayer, attention step): share of the step, and the rows' basis."""
    parts = {}
    for run, table, clock in _clocked(tables):
        if clock == "GPU":
            share = num(table, "Share of Step").set_axis(table["Range"].astype(str))
        else:
            ms = _ms(table, "CPU")
            step = ms.get(STEP_RANGE)
            share = ms / step if pd.notna(step) and step > 0 else ms * np.nan
        kind = table["Kind"].astype(str) if "Kind" in table else pd.Series("", table.index)
        sublayers = list(table.loc[kind == "sublayer", "Range"].astype(str))
        row = {r: float(share[r]) for r in (*sublayers, *ATTENTION_STEPS)
               if r in share.index and pd.notna(share[r])}  # fmt: skip
        basis = _sublayer_basis(table, sublayers)
        if not sublayers:
            by_module = _module_sublayers((modules or {}).get(run), clock,
                                          _ms(table, clock).get(STEP_RANGE))
            if by_module:
                row, basis = {**by_module, **row}, MODULE_BASIS
        if row:
            parts[run] = {**row, SUBLAYER_BASIS: basis}
    return pd.DataFrame.from_dict(parts, orient="index")


def _module_sublayers(table: pd.DataFrame | None, clock: str, step: float | None
                      ) -> dict[str, float]:
    """Sublayer -> its share of the step, summed over the layers: the module table's rows of
    the sublayers themselves (``layers.0.attn``, not the modules inside them)."""
    if table is None or "Sublayer" not in table or pd.isna(step) or not step > 0:
        return {}
    paths = table["Module"].astype(str)
    sub = table["Sublayer"].fillna("").astype(str)
    own = [s != "" and p.split(".")[-1] == s for p, s in zip(paths, sub, strict=True)]
    ms = _module_ms(table, clock)
    out: dict[str, float] = {}
    for name, value in zip(sub[own], ms[own], strict=True):
        out[name] = out.get(name, 0.0) + float(value) / float(step)
    return {k: v for k, v in out.items() if v > 0}


def _module_ms(table: pd.DataFrame, clock: str) -> pd.Series:
    """A module table's ms per step in ``clock``, forward + backward."""
    fwd = num(table, f"Forward {clock} ms/step").fillna(0)
    bwd = num(table, f"Backward {clock} ms/step").fillna(0)
    return fwd + bwd


def _layer_frame(tables: dict[str, pd.DataFrame],
                 modules: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    layers = {}
    for run, table in tables.items():
        clock = _clock(table) if "Range" in table else None
        if clock is None or "Kind" not in table:
            continue
        rows = table[table["Kind"].astype(str) == "layer"]
        ms = num(rows, f"{clock} ms/step").set_axis(rows["Range"].astype(str))
        basis = _sublayer_basis(table, list(table.loc[table["Kind"].astype(str) == "sublayer",
                                                      "Range"].astype(str)))
        if rows.empty:
            ms, basis = _module_layers((modules or {}).get(run), clock), MODULE_BASIS
        ordered = sorted(ms.index, key=natural_key)
        row = {i: float(ms[name]) for i, name in enumerate(ordered)
               if pd.notna(ms[name]) and ms[name] > 0}
        if row:
            layers[run] = {**row, SUBLAYER_BASIS: basis}
    frame = pd.DataFrame.from_dict(layers, orient="index")
    numbered = sorted(c for c in frame.columns if c != SUBLAYER_BASIS)
    return frame[[*numbered, SUBLAYER_BASIS]] if layers else frame


def _module_layers(table: pd.DataFrame | None, clock: str) -> pd.Series:
    """Layer path -> ms per step: the module table's rows of the structure's layers."""
    if table is None or "Layer" not in table:
        return pd.Series(dtype=float)
    paths = table["Module"].astype(str)
    is_layer = (table["Layer"].fillna("").astype(str) == paths).to_numpy()
    return _module_ms(table, clock)[is_layer].set_axis(paths[is_layer])


def module_frame(results: Path, runs: list[str]) -> dict[str, list[tuple[str, float, float]]]:
    """run -> its top module groups: (label, forward share, backward share of the step)."""
    return _module_groups(stats_tables(results, runs, TABLE), trusted_modules(results, runs))


def trusted_modules(results: Path, runs: list[str]) -> dict[str, pd.DataFrame]:
    """The runs' module tables that pass their self-check (a suspect one is not drawn)."""
    return _split_modules(results, runs)[0]


def _split_modules(results: Path, runs: list[str]) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """(the runs' module tables that pass their self-check, the runs whose table fails it)."""
    tables = stats_tables(results, runs, MODULE_TABLE)
    suspect = [run for run in tables if module_table_suspect(results, run) is not None]
    return {run: t for run, t in tables.items() if run not in suspect}, suspect


def _module_groups(phase_tables: dict[str, pd.DataFrame], module_tables: dict[str, pd.DataFrame]
                   ) -> dict[str, list[tuple[str, float, float]]]:
    out = {}
    for run, table, clock in _clocked(phase_tables):
        modules = module_tables.get(run)
        step = _ms(table, clock).get(STEP_RANGE)
        if modules is None or "Module" not in modules or pd.isna(step) or not step > 0:
            continue
        # a group under half a percent of the step would read "0%": nothing to see
        groups = [(name, fwd / step, bwd / step) for name, fwd, bwd in top_modules(
            modules, clock) if (fwd + bwd) / step >= 0.005]
        if groups:
            out[run] = groups
    return out


def top_modules(table: pd.DataFrame, clock: str, n: int = TOP_MODULES
                ) -> list[tuple[str, float, float]]:
    """(label, forward ms, backward ms per step) of the module table's ``n`` largest groups:
    all the structure's layers summed ("12 layers"), and each outermost module outside them.
    A module that holds layers (a ModuleList, HF's ``transformer``) is left out, its time
    being theirs; a module shared into the layers (a RoPE table registered at the top)
    stands on its own: the groups are not stacked, they may overlap."""
    paths = table["Module"].astype(str)
    layer = table["Layer"].fillna("").astype(str) if "Layer" in table else paths.map(
        lambda _: "")
    fwd = num(table, f"Forward {clock} ms/step").fillna(0).to_numpy()
    bwd = num(table, f"Backward {clock} ms/step").fillna(0).to_numpy()
    is_layer = ((layer == paths) & (layer != "")).to_numpy()
    groups = []
    if is_layer.any():
        count = int(is_layer.sum())
        name = f"{count} layers" if count > 1 else str(paths[is_layer].iloc[0])
        groups.append((name, float(fwd[is_layer].sum()), float(bwd[is_layer].sum())))
    holders = {".".join(p.split(".")[:i]) for p in paths[is_layer]
               for i in range(1, p.count(".") + 1)}
    outside = [p for p, lay in zip(paths, layer, strict=True) if not lay and p not in holders]
    row = {p: i for i, p in enumerate(paths)}
    groups += [(p, float(fwd[row[p]]), float(bwd[row[p]])) for p in outermost(outside)]
    return sorted(groups, key=lambda g: g[1] + g[2], reverse=True)[:n]


def _sublayer_basis(table: pd.DataFrame, sublayers: list[str]) -> str:
    """How a run's sublayer rows were attributed: ranges a workload opens in its forward see
    forward launches only."""
    rows = table[table["Range"].astype(str).isin(sublayers)]
    phases = " ".join(str(v) for v in rows.get("Phases", []) if pd.notna(v))
    return "fwd+bwd" if "backward" in phases else "fwd"


# -- the figure -------------------------------------------------------------------------------
def _title(clocks: set[str]) -> tuple[str, str]:
    """(figure title, what the shares are of)."""
    if clocks == {"CPU"}:
        return ("CPU time per training phase (no GPU activity captured: CPU time inside each "
                "NVTX phase range)", "% of the step's CPU time")
    if clocks == {"GPU"}:
        return ("GPU time per training phase (by launch inside each NVTX phase range)",
                "% of the step's GPU time")
    return ("Time per training phase: GPU time by launch inside each NVTX phase range; "
            "CPU time where a run had no GPU activity", "% of the step's time")


def draw_phase_gpu_time(summary: pd.DataFrame, results: Path) -> Figure:
    tables = stats_tables(results, run_names(summary, results), TABLE)
    phases = phase_times(tables)
    if phases.empty:
        raise style.NoData("Time per training phase",
                           f"no stats/{TABLE} with phase ranges")  # fmt: skip
    runs = list(phases.index)
    # a run whose module table failed its self-check: said in its row, not drawn
    trusted, suspect = _split_modules(results, runs)
    parts = _part_shares(tables, trusted)
    parts = parts.loc[[r for r in phases.index if r in parts.index]]
    layers = _layer_frame(tables, trusted)
    layers = layers.loc[[r for r in phases.index if r in layers.index]]
    modules = _module_groups(tables, trusted)
    title, share_of = _title(set(phases[CLOCK]))
    panels = (not parts.empty) + (not layers.empty) + bool(modules or suspect)
    # four panels: the sublayer and layer panels narrower, room for the modules' names
    narrow = 2.4 if panels == 3 else 3.0
    widths = ([4.0] + [narrow] * ((not parts.empty) + (not layers.empty))
              + [3.4 if panels == 3 else 3.0] * bool(modules or suspect))
    row_in = MODULE_ROW_IN if modules or suspect else style.ROW_IN
    fig, axes = style.figure(1, len(widths), height=1.9 + row_in * len(phases),
                             sharey=True, gridspec_kw={"width_ratios": widths})  # fmt: skip
    handles = _phase_panel(axes[0, 0], phases, share_of)
    column = 1
    if not parts.empty:
        handles += _sublayer_panel(axes[0, column], phases.index, parts, share_of)
        column += 1
    if not layers.empty:
        _layer_panel(axes[0, column], phases, layers)
        column += 1
    if modules or suspect:
        _module_panel(axes[0, column], phases.index, modules, share_of, suspect)
    style.legend_above(fig, handles, title)
    return fig


def _phase_panel(ax: object, phases: pd.DataFrame, share_of: str) -> list[Patch]:
    """100% bars by phase, one per run; the step's total ms at the right."""
    y = np.arange(len(phases))
    ms = phases[list(style.PHASES)]
    total = ms.sum(axis=1)
    left = np.zeros(len(phases))
    handles = []
    for phase in style.PHASES:
        share = (ms[phase] / total).fillna(0).to_numpy() * 100
        ax.barh(y, share, left=left, height=0.75, color=style.PHASE_COLORS[phase])
        left += share
        if share.any():
            handles.append(Patch(color=style.PHASE_COLORS[phase], label=phase))
    ax.set_yticks(y, [style.short_label(str(r), 40) for r in phases.index], fontsize=7.5)
    ax.set_ylim(len(phases) - 0.5, -0.5)
    ax.set_xlim(0, 100)
    ax.set_xlabel(share_of, fontsize=8)
    ax.tick_params(axis="x", labelsize=7.5)
    ax.set_title("phases\n(right: the step's total time)", fontsize=9)
    mixed = phases[CLOCK].nunique() > 1
    right = ax.secondary_yaxis("right")
    right.set_yticks(y, [f"{style.fmt_ms(t)}" + (f" {c}" if mixed else "")
                         for t, c in zip(total, phases[CLOCK], strict=True)],
                     fontsize=7.5)  # fmt: skip
    return handles


def _sublayer_panel(ax: object, rows: pd.Index, parts: pd.DataFrame,
                    share_of: str) -> list[Patch]:
    """Per run: its sublayers (upper half-bar) and the steps inside attention (lower
    half-bar), as % of the step; the basis (fwd, fwd+bwd, or the module table's) at the
    bar's end."""
    position = {run: i for i, run in enumerate(rows)}
    seen: set[str] = set()
    widest = 0.0
    sublayers = sublayer_names(parts)
    sublayer_colors = {n: style.part_color(i) for i, n in enumerate(sublayers)}
    for run, row in parts.iterrows():
        ends = []
        for names, colors, offset in ((sublayers, sublayer_colors, -0.19),
                                      (ATTENTION_STEPS, style.ATTENTION_STEP_COLORS, 0.19)):
            present = [n for n in names if n in row and pd.notna(row[n])]
            left = 0.0
            for name in present:
                ax.barh(position[run] + offset, row[name] * 100, left=left, height=0.36,
                        color=colors[name])  # fmt: skip
                left += row[name] * 100
                seen.add(name)
            ends.append(left)
        widest = max(widest, *ends)
        ax.annotate(str(row.get(SUBLAYER_BASIS, "fwd")), (max(ends), position[run]),
                    xytext=(3, 0), textcoords="offset points", va="center", fontsize=6.5,
                    color="#555555")  # fmt: skip
    ax.set_xlim(0, max(widest, 1.0) * 1.5)  # room for the basis at the bars' ends
    ax.set_xlabel(share_of, fontsize=8)
    ax.tick_params(axis="x", labelsize=7.5)
    ax.tick_params(axis="y", left=False)
    ax.set_title("sublayers (upper bar)\ninside attention (lower bar)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    colors = {**sublayer_colors, **style.ATTENTION_STEP_COLORS}
    return [Patch(color=colors[n], label=n.replace("_", " ")) for n in colors if n in seen]


def _layer_panel(ax: object, phases: pd.DataFrame, layers: pd.DataFrame) -> None:
    """Each layer's ms per step, a row of dots per run, coloured first to last layer: the
    same block n times lines up; an outlier layer stands apart."""
    numbered = [c for c in layers.columns if c != SUBLAYER_BASIS]
    position = {run: i for i, run in enumerate(phases.index)}
    for run, row in layers.iterrows():
        ms = row[numbered].astype(float).dropna()
        ax.scatter(ms.to_numpy(), np.full(len(ms), position[run]), s=9, zorder=3,
                   c=[style.layer_color(i, len(ms)) for i in range(len(ms))])  # fmt: skip
        ax.annotate(f"{len(ms)}", (ms.max(), position[run]), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=6.5,
                    color="#555555")  # fmt: skip
    ax.set_xscale("log")
    style.log_axis(ax.xaxis)
    ax.margins(x=0.15)
    clocks = set(phases.loc[layers.index, CLOCK])
    clock = clocks.pop() + " " if len(clocks) == 1 else ""
    ax.set_xlabel(f"{clock}ms per step, per layer (log)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7.5)
    ax.tick_params(axis="y", left=False)
    ax.set_title("each layer (n at right)\ndot colour: first → last", fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def _module_panel(ax: object, rows: pd.Index, modules: dict[str, list[tuple[str, float, float]]],
                  share_of: str, suspect: list[str]) -> None:
    """Per run, its top module groups one bar under another, largest first: forward then
    backward (the phases' colours), as % of the step; name and share at the bar's end. A run
    whose table failed its self-check gets a line that says so instead of bars."""
    position = {run: i for i, run in enumerate(rows)}
    for run in suspect:
        ax.annotate("module table fails its self-check:\nnot drawn",
                    (0, position[run]), xytext=(2, 0), textcoords="offset points",
                    va="center", fontsize=6, color="#555555", style="italic")
    pitch = 0.84 / TOP_MODULES
    widest = 0.0
    for run, groups in modules.items():
        for k, (name, fwd, bwd) in enumerate(groups):
            y = position[run] - 0.42 + pitch * (k + 0.5)
            for left, width, phase in ((0.0, fwd, "forward"), (fwd, bwd, "backward")):
                ax.barh(y, width * 100, left=left * 100, height=pitch * 0.8,
                        color=style.PHASE_COLORS[phase])  # fmt: skip
            ax.annotate(f"{style.short_label(name, 24)} {style.fmt_pct(fwd + bwd)}",
                        ((fwd + bwd) * 100, y), xytext=(2, 0), textcoords="offset points",
                        va="center", fontsize=6, color="#555555")  # fmt: skip
            widest = max(widest, (fwd + bwd) * 100)
    ax.set_xlim(0, max(widest, 1.0) * 1.75)  # room for the names at the bars' ends
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= 100])  # no share above the step
    ax.set_xlabel(share_of, fontsize=8)
    ax.tick_params(axis="x", labelsize=7.5)
    ax.tick_params(axis="y", left=False)
    ax.set_title(f"top {TOP_MODULES} modules (module table)\nforward | backward", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
