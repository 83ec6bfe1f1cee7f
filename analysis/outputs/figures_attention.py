"""The attention sweep, laid out as FlashAttention's benchmark figures: one panel per head
dim × causal × direction, one line per implementation (and variant), achieved TFLOP/s
against the sequence length.

A line joins only runs that differ in the sequence length, plus the batch when batch × seq
stays constant along it (FlashAttention's sweeps keep the tokens per step fixed); any other
difference starts another line. A run that did not run (OOM, unsupported, ...) is a cross on
its line's axis floor, labelled with its status.
"""

from __future__ import annotations

import math

import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from analysis.outputs import style
from analysis.outputs.figure_data import num, status

TITLE = "Attention: achieved {unit} against sequence length (higher is better)"
WORKLOADS = ("attention", "attention_core")
#: what a panel holds one value of
PANEL_KEYS = ("head_dim", "causal", "mode")
#: configuration keys besides the panel's and the sequence length: a line holds one value of
#: each (batch may vary with a constant batch × seq)
LINE_KEYS = ("workload", "impl_label", "dtype", "heads", "embed", "batch", "device",
             "compile")  # fmt: skip
MODE_LABELS = {"forward": "forward", "forward_backward": "forward + backward"}
_MODE_ORDER = {"forward": 0, "forward_backward": 1}
MAX_COLUMNS = 5  # panels side by side at report width


def impl_label(row: pd.Series) -> str:
    """``naive``, ``sdpa`` (PyTorch picks) or ``sdpa:<backend>`` (pinned)."""
    impl = _text(row.get("impl")) or "?"
    backend = _text(row.get("sdpa_backend"))
    return f"{impl}:{backend}" if impl == "sdpa" and backend not in ("", "auto") else impl


def _text(value: object) -> str:
    """A key's value as text: '' when unset, integers without '.0'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _causal(value: object) -> bool:
    return _text(value).lower() in ("true", "1")


def sweep_points(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per attention run: ``panel`` (head dim, causal, mode), ``line`` (an id), its
    ``label``, ``seq``, ``tflops`` and ``status``; empty without attention runs."""
    if "workload" not in summary:
        return pd.DataFrame()
    runs = summary[summary["workload"].isin(WORKLOADS)].copy()
    if runs.empty:
        return runs
    runs["impl_label"] = runs.apply(impl_label, axis=1)
    # a key a run left unset has the workload's default (workloads/__main__.py): the
    # attention layer has one head (head dim = embed) and no mask; both run forward only
    heads = num(runs, "heads").fillna(1)
    # (0: unknown; a number, so that panels compare and sort)
    runs["head_dim"] = num(runs, "head_dim").fillna(num(runs, "embed") / heads).fillna(0)
    runs["causal"] = runs["causal"].map(_causal) if "causal" in runs else False
    runs["mode"] = runs["mode"].fillna("forward").astype(str) if "mode" in runs else "forward"
    runs["seq"] = num(runs, "seq")
    runs["tflops"] = num(runs, "tflops")
    runs["status"] = status(runs)
    runs["panel"] = list(zip(runs["head_dim"], runs["causal"], runs["mode"], strict=True))
    # the implementation first (the legend's colour), then whatever else varies in the sweep
    keys = ["impl_label", *(k for k in LINE_KEYS if k != "impl_label" and k in runs
                            and runs[k].map(_text).nunique() > 1)]
    runs["line"], runs["label"] = _lines(runs, keys)
    return runs


def _lines(runs: pd.DataFrame, keys: list[str]) -> tuple[pd.Series, pd.Series]:
    """Each run's line id and legend label (see the module's docstring)."""
    base = [k for k in keys if k != "batch"]
    line, label = pd.Series("", index=runs.index), pd.Series("", index=runs.index)
    for _, group in runs.groupby(["panel", *base], dropna=False, sort=False):
        parts = [_key_part(k, group[k].iloc[0]) for k in base]
        for rows, extra in _batch_lines(group, "batch" in keys):
            text = " · ".join(p for p in [*parts, extra] if p)
            label[rows] = text
            line[rows] = f"{group['panel'].iloc[0]}|{text}"
    # the same sequence length twice on one line (repeats of one configuration): apart
    twice = line.groupby([line, runs["seq"]]).transform("size") > 1
    line[twice] = line[twice] + "|" + runs.loc[twice, "run"].astype(str)
    label[twice] = label[twice] + " · " + runs.loc[twice, "run"].astype(str)
    return line, label


def _batch_lines(group: pd.DataFrame, batch_varies: bool) -> list[tuple[pd.Index, str]]:
    """Split runs equal in every other key into lines of one batch or of one batch × seq
    (the longest first), with the label part that says which."""
    if not batch_varies:
        return [(group.index, "")]
    batch = num(group, "batch")
    tokens = batch * group["seq"]
    left, out = group.index, []
    while len(left):
        by_batch = batch[left].value_counts(dropna=False)
        by_tokens = tokens[left][batch[left].notna()].value_counts()
        if len(by_tokens) and by_tokens.iloc[0] > by_batch.iloc[0]:
            rows = left[tokens[left] == by_tokens.index[0]]
            out.append((rows, f"batch × seq = {_count(by_tokens.index[0])} tokens"))
        else:
            value = by_batch.index[0]
            rows = left[batch[left].isna()] if pd.isna(value) else left[batch[left] == value]
            out.append((rows, _key_part("batch", value)))
        left = left.difference(rows, sort=False)
    return out


def _key_part(key: str, value: object) -> str:
    text = _text(value)
    if key == "impl_label" or key == "dtype" or not text:
        return text
    if key == "workload":
        return {"attention": "attention layer", "attention_core": ""}.get(text, text)
    if key == "heads":
        return f"{text} head" + ("" if text == "1" else "s")
    return f"{key} {text}"


def _count(value: float) -> str:
    return f"{value / 1024:g}k" if value >= 1024 and value % 1024 == 0 else f"{value:g}"


def panel_title(panel: tuple) -> str:
    head_dim, causal, mode = panel
    dim = _text(head_dim) if head_dim else "?"
    masking = "causal" if causal else "non-causal"
    return f"head dim {dim} · {masking} · {MODE_LABELS.get(mode, mode)}"


def panel_grid(panels: list[tuple]) -> list[list[tuple | None]]:
    """Rows of panels: a row per direction (forward above forward + backward), a column per
    (causal, head dim), non-causal first, head dims ascending; with more than
    :data:`MAX_COLUMNS` such columns, each direction's panels flow over rows of their own."""
    modes = sorted({p[2] for p in panels}, key=lambda m: (_MODE_ORDER.get(m, 9), m))
    columns = sorted({p[:2] for p in panels},
                     key=lambda c: (bool(c[1]), c[0]))
    present = set(panels)
    if len(columns) <= MAX_COLUMNS:
        return [[(*c, mode) if (*c, mode) in present else None for c in columns]
                for mode in modes]  # fmt: skip
    rows = []
    for mode in modes:
        block = [(*c, mode) for c in columns if (*c, mode) in present]
        rows += [block[i:i + MAX_COLUMNS] for i in range(0, len(block), MAX_COLUMNS)]
    return [row + [None] * (MAX_COLUMNS - len(row)) for row in rows]


def draw_attention_sweep(summary: pd.DataFrame) -> Figure:
    points = sweep_points(summary)
    if points.empty:
        raise style.NoData(TITLE.format(unit="TFLOP/s"), "no attention runs in the summary")
    # a CPU reaches GFLOP/s: the unit that keeps the axis' numbers readable
    unit, scale = ("TFLOP/s", 1.0) if points["tflops"].max() >= 1 else ("GFLOP/s", 1e3)
    points["flops"] = points["tflops"] * scale
    grid = panel_grid(list(points["panel"].unique()))
    fig, axes = style.figure(len(grid), len(grid[0]), height=1.6 + 2.3 * len(grid))
    looks = _line_looks(points)
    for row, panels in enumerate(grid):
        for col, panel in enumerate(panels):
            ax = axes[row, col]
            if panel is None:
                ax.set_visible(False)
                continue
            _sweep_panel(ax, points[points["panel"] == panel], looks)
            ax.set_title(panel_title(panel).replace(" · ", "\n", 1), fontsize=8.5)
    for ax in axes[:, 0]:
        ax.set_ylabel(unit, fontsize=8)
    handles = [Line2D([], [], color=c, linestyle=ls, marker=m, label=lab)
               for lab, (c, ls, m) in looks.items()]  # fmt: skip
    if (points["status"] != style.OK).any():
        handles.append(Line2D([], [], color=style.STATUS_COLOR, linestyle="", marker="x",
                              label="did not run (status written above)"))  # fmt: skip
    style.legend_above(fig, handles, TITLE.format(unit=unit))
    return fig


def _line_looks(points: pd.DataFrame) -> dict[str, tuple[str, object, str]]:
    """Legend label -> (colour, line style, marker): the colour says the implementation,
    the style the variant (dtype, heads, ...), the same in every panel."""
    impls = sorted(points["impl_label"].unique())
    fallback = style.palette_colors([i for i in impls if i not in style.IMPL_COLORS])
    variants = sorted({_variant(lab, imp) for lab, imp in
                       zip(points["label"], points["impl_label"], strict=True)})  # fmt: skip
    looks = {}
    for label, impl in sorted(set(zip(points["label"], points["impl_label"], strict=True))):
        line_style, marker = style.VARIANT_STYLES[
            variants.index(_variant(label, impl)) % len(style.VARIANT_STYLES)]
        looks[label] = (style.IMPL_COLORS.get(impl) or fallback[impl], line_style, marker)
    return looks


def _variant(label: str, impl: str) -> str:
    return label.removeprefix(impl).strip(" ·")


def _sweep_panel(ax: object, part: pd.DataFrame, looks: dict) -> None:
    seqs = sorted(part["seq"].dropna().unique())
    lines = list(part.sort_values("seq").groupby("line", sort=False))
    failed: list[tuple[float, str, str]] = []  # (seq, status, colour)
    for i, (line_id, group) in enumerate(lines):
        color, line_style, marker = looks[group["label"].iloc[0]]
        ok = (group["status"] == style.OK) & group["flops"].notna()
        good = group[ok]
        # one sequence length: points side by side, each with its value, none hidden
        x = good["seq"] * (2 ** (0.12 * (i - (len(lines) - 1) / 2)) if len(seqs) == 1 else 1)
        if not good.empty:
            ax.plot(x, good["flops"], color=color, linestyle=line_style, marker=marker,
                    markersize=4, linewidth=1.4, gid=line_id)  # fmt: skip
        if len(seqs) == 1:
            for xi, value in zip(x, good["flops"], strict=True):
                ax.annotate(f"{value:.3g}", (xi, value), xytext=(0, 4), ha="center",
                            textcoords="offset points", fontsize=7)  # fmt: skip
        failed += [(seq, state, color) for seq, state in
                   zip(group["seq"][~ok], group["status"][~ok], strict=True)]  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs, [_count(s) for s in seqs])
    ax.xaxis.set_minor_locator(mticker.NullLocator())
    pad = 1.6 if len(seqs) == 1 else 1.25
    ax.set_xlim(seqs[0] / pad, seqs[-1] * pad)
    top = np.nanmax(part["flops"].to_numpy(), initial=0)
    ax.set_ylim(0, top * 1.18 if top > 0 else 1)
    ax.set_xlabel("sequence length", fontsize=8)
    ax.tick_params(labelsize=7.5)
    ax.grid(alpha=0.3)
    _mark_failed(ax, failed, seqs)


def _mark_failed(ax: object, failed: list[tuple[float, str, str]], seqs: list[float]) -> None:
    """Runs that did not run: crosses side by side on the axis floor, each in its line's
    colour, and above them each status once (OOM, unsupported, ...); at the panel's edges
    both grow inward, so they stay over their panel."""
    for seq in sorted({f[0] for f in failed}):
        here = [f for f in failed if f[0] == seq]
        align, first = "center", -(len(here) - 1) / 2
        if seq == seqs[-1] != seqs[0]:
            align, first = "right", -(len(here) - 1)
        elif seq == seqs[0] != seqs[-1]:
            align, first = "left", 0
        for i, (_, _, color) in enumerate(here):
            ax.plot([seq * 2 ** (0.1 * (first + i))], [0], marker="x", color=color,
                    markersize=7, markeredgewidth=2, linestyle="", clip_on=False, zorder=4)
        states = list(dict.fromkeys(style.status_label(f[1]) for f in here))
        ax.annotate("\n".join(states), (seq, 0), xytext=(0, 7), textcoords="offset points",
                    ha=align, va="bottom", fontsize=7, color=style.STATUS_COLOR,
                    fontweight="bold", zorder=5)  # fmt: skip
