"""Kernels: the heaviest kernels per step, and how long kernels run.

Kernel names are shortened for the eye (no return type, template arguments or parameters);
names that would then read the same (three ``cutlass::Kernel2``) keep the template arguments
that tell them apart.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from analysis.metrics.categories import CATEGORIES, categorize
from analysis.outputs import style
from analysis.outputs.figure_data import captured_steps, num, read_table, run_names, stats_tables

TOP_N = 10
TOP_RUNS = 3
LABEL_CHARS = 60  # of a kernel's label
SHORT_KERNEL_US = 10  # kernels under this are launch-bound territory (metrics/durations.py)

_TEMPLATE = re.compile(r"<[^<>]*>")
# parts of a demangled argument that tell nothing apart: lambdas, call operators, casts
_NOISE = re.compile(r"\[lambda\([^()]*\) \(instance \d+\)\]|::operator \(\)\(\) const"
                    r"|\((?:unsigned |signed )?(?:int|long|bool|char|short)\)")  # fmt: skip
_QUALIFIER = re.compile(r"(?:[A-Za-z_]\w*|<unnamed>|\(anonymous namespace\))::")
_FILLER = {"T1", "T2", "T3", "T4", "T5", "T6", "T7", "const", "unsigned", "char", "long",
           "int", "array", "Params", "void"}  # fmt: skip


def short_kernel(name: str, limit: int = LABEL_CHARS) -> str:
    """A readable kernel name: no return type, template arguments or parameter list."""
    text = str(name)
    for _ in range(6):  # nested templates: innermost first
        new = _TEMPLATE.sub("", text)
        if new == text:
            break
        text = new
    text = re.sub(r"\(.*\)$", "", text.removeprefix("void ")).strip()
    text = re.sub(r"^(at::native::|<unnamed>::|\(anonymous namespace\)::)+", "", text).lstrip(":")
    return style.middle_label(text or str(name), limit)


def template_args(name: str) -> list[str]:
    """The top-level template arguments of a demangled kernel name's own template."""
    text = str(name).removeprefix("void ").replace("<unnamed>::", "")
    start = text.find("<")
    if start < 0:
        return []
    args, current, depth = [], [], 0
    for ch in text[start:]:
        if ch in "<([":
            depth += 1
            if depth == 1:
                continue
        elif ch in ">)]":
            depth -= 1
            if depth == 0:
                break
        elif ch == "," and depth == 1:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    return [*args, "".join(current).strip()]


def _arg_text(arg: str) -> str:
    """A template argument in few words: its identifiers and numbers, once each, without
    namespaces, lambdas, casts or parameter lists."""
    text = _QUALIFIER.sub("", _NOISE.sub("", arg))
    text = re.sub(r"\([^()]*\)", "", text)
    words = dict.fromkeys(w for w in re.findall(r"[A-Za-z_]\w*|\d+", text) if w not in _FILLER)
    return " ".join(words)


def _differences(parts: dict[int, list[str]]) -> dict[int, list[str]]:
    """Per name, its parts that not every name of the group shares: by position when the
    names have as many parts (words every name has dropped, positions with words before
    those of numbers only), else by value."""
    lists = list(parts.values())
    if len({len(p) for p in lists}) > 1:
        common = set.intersection(*(set(p) for p in lists))
        return {i: [w for w in p if w not in common] for i, p in parts.items()}
    differ = [j for j in range(len(lists[0])) if len({p[j] for p in lists}) > 1]
    differ.sort(key=lambda j: all(w.isdigit() for p in lists for w in p[j].split()))
    out = {}
    for i, p in parts.items():
        words = []
        for j in differ:
            shared = set.intersection(*(set(q[j].split()) for q in lists))
            words.append(" ".join(w for w in p[j].split() if w not in shared) or p[j])
        out[i] = words
    return out


def _told_apart(names: dict[int, str], limit: int) -> dict[int, str]:
    """Labels for kernels whose short names collide: the fewest differing parts (template
    arguments, or ``_`` parts of a library kernel's long name) that make them unique."""
    templated = all(template_args(n) for n in names.values())
    parts = {i: [_arg_text(a) for a in template_args(n)] if templated
             else short_kernel(n, 10_000).split("_") for i, n in names.items()}  # fmt: skip
    differ = _differences(parts)
    labels = {}
    for k in range(1, max(len(d) for d in differ.values()) + 1):
        for i, name in names.items():
            base = short_kernel(name, 10_000)
            hint = ", ".join(differ[i][:k]) if templated else "_".join(differ[i][:k])
            room = max(limit - len(hint) - 2, 16)  # the name gives way to what differs
            text = (f"{style.short_label(base, room)}<{hint}>" if templated
                    else f"{style.short_label(base, room)} {hint}")
            labels[i] = style.middle_label(text, limit)
        if len(set(labels.values())) == len(labels):
            break
    return labels


def kernel_labels(names: list[str], limit: int = LABEL_CHARS) -> list[str]:
    """A label per kernel name, unique among ``names``: the short name; where short names
    collide, plus the parts that tell them apart; a number if they still do not."""
    labels = [short_kernel(n, limit) for n in names]
    for label in {lab for lab in labels if labels.count(lab) > 1}:
        group = {i: names[i] for i, lab in enumerate(labels) if lab == label}
        for i, text in _told_apart(group, limit).items():
            labels[i] = text
    for label in {lab for lab in labels if labels.count(lab) > 1}:
        group = [i for i, lab in enumerate(labels) if lab == label]
        for n, i in enumerate(group, 1):
            labels[i] = style.middle_label(label, limit - 3) + f" #{n}"
    return labels


def _kernel_categories(results: Path, run: str) -> dict[str, str]:
    """Kernel name -> the category most of its time got (stats/tensor_core.csv)."""
    table = read_table(results / run / "stats" / "tensor_core.csv")
    if table.empty or not {"Name", "Category"} <= set(table.columns):
        return {}
    return dict(zip(table["Name"].astype(str), table["Category"].astype(str), strict=True))


# -- top kernels ------------------------------------------------------------------------------
def top_kernel_tables(summary: pd.DataFrame, results: Path
                      ) -> dict[str, tuple[pd.DataFrame, int | None]]:
    """The heaviest runs (kernel time per step), each with its top kernels (``ms`` per step,
    ``share`` of the run's kernel time, ``label``) and the steps its capture holds."""
    runs = run_names(summary, results)
    tables = stats_tables(results, runs, "cuda_gpu_kern_sum.csv")
    tables = {r: t for r, t in tables.items() if {"Name", "Total Time (ns)"} <= set(t.columns)}
    steps = {r: captured_steps(read_table(results / r / "stats" / "phase_gpu_time.csv"))
             for r in tables}  # fmt: skip
    per_step = {r: num(t, "Total Time (ns)").sum() / (steps[r] or 1) for r, t in tables.items()}
    out = {}
    for run in sorted(tables, key=lambda r: -per_step[r])[:TOP_RUNS]:
        table = tables[run].assign(ns=num(tables[run], "Total Time (ns)"))
        total = table["ns"].sum()
        top = table.nlargest(TOP_N, "ns").copy()
        top["ms"] = top["ns"] / (steps[run] or 1) / 1e6
        top["share"] = top["ns"] / total
        top["label"] = kernel_labels(top["Name"].astype(str).tolist())
        out[run] = (top, steps[run])
    return out


def draw_top_kernels(summary: pd.DataFrame, results: Path) -> Figure:
    tops = top_kernel_tables(summary, results)
    per_step = all(steps for _, steps in tops.values())
    title = (f"Top {TOP_N} kernels by GPU time per step, in the {TOP_RUNS} runs with the most "
             "kernel time per step")
    if not tops:
        raise style.NoData(title, "no kernels (stats/cuda_gpu_kern_sum.csv)")
    rows = [len(top) for top, _ in tops.values()]
    fig, axes = style.figure(len(tops), 1, height=1.3 + sum(0.24 * n + 0.75 for n in rows),
                             gridspec_kw={"height_ratios": rows})  # fmt: skip
    seen: set[str] = set()
    for ax, (run, (top, steps)) in zip(axes[:, 0], tops.items(), strict=True):
        seen.update(_top_kernel_panel(ax, results, run, top, steps))
    handles = [Patch(color=style.CATEGORY_COLORS[c], label=c) for c in CATEGORIES if c in seen]
    if not per_step:
        title = title.replace("per step", "per step (or in the capture)")
    style.legend_above(fig, handles, f"{title}\n(colour: kernel category)")
    return fig


def _top_kernel_panel(ax: object, results: Path, run: str, top: pd.DataFrame,
                      steps: int | None) -> set[str]:
    known = _kernel_categories(results, run)  # per launch: phase and fused ops count
    cats = [known.get(n) or categorize(n) for n in top["Name"].astype(str)]
    y = np.arange(len(top))
    bars = ax.barh(y, top["ms"], color=[style.CATEGORY_COLORS[c] for c in cats])
    style.bar_labels(ax, bars, [f"{style.fmt_ms(v)} ({style.fmt_pct(s)})"
                                for v, s in zip(top["ms"], top["share"], strict=True)])
    ax.set_yticks(y, top["label"], fontsize=7)
    ax.set_ylim(len(top) - 0.5, -0.5)
    ax.margins(x=0.2)
    total = top["ms"].sum() / max(top["share"].sum(), 1e-12)
    share = "(%: of the run's kernel time)"
    if steps:
        ax.set_title(f"{run}: {style.fmt_ms(total)} of kernels per step "
                     f"({steps} steps captured)", fontsize=9)  # fmt: skip
        ax.set_xlabel(f"GPU time per step (ms) {share}", fontsize=8)
    else:
        ax.set_title(f"{run}: {style.fmt_ms(total)} of kernels in the capture (no step "
                     "range)", fontsize=9)  # fmt: skip
        ax.set_xlabel(f"GPU time in the capture, not per step (ms) {share}", fontsize=8)
    ax.tick_params(axis="x", labelsize=7.5)
    ax.grid(axis="x", alpha=0.3)
    return set(cats)


# -- kernel durations -------------------------------------------------------------------------
def _edge(ns: float) -> str:
    """A bin edge in the unit that reads best."""
    if not np.isfinite(ns):
        return "∞"
    if ns < 1e3:
        return f"{ns:.3g} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns / 1e6:.3g} ms"


def duration_shares(summary: pd.DataFrame, results: Path) -> tuple[pd.DataFrame, list[float]]:
    """run x duration bin: % of the run's kernels, over the bins any run has kernels in; and
    the bins' edges (ns)."""
    tables = stats_tables(results, run_names(summary, results), "kernel_durations.csv")
    tables = {r: t for r, t in tables.items() if num(t, "kernels").sum() > 0}
    if not tables:
        return pd.DataFrame(), []
    first = next(iter(tables.values()))
    low, high = num(first, "bin_low_ns").to_numpy(), num(first, "bin_high_ns").to_numpy()
    frame = pd.DataFrame({run: (num(t, "kernels") / num(t, "kernels").sum() * 100).to_numpy()
                          for run, t in tables.items()}).T  # fmt: skip
    used = np.flatnonzero(frame.sum(axis=0).to_numpy() > 0)
    keep = slice(used[0], used[-1] + 1)
    edges = [*low[keep], high[keep][-1]]
    return frame.iloc[:, keep].set_axis(range(len(edges) - 1), axis=1), edges


def draw_kernel_durations(summary: pd.DataFrame, results: Path) -> Figure:
    title = (f"Kernel durations: % of each run's kernels per duration bin; under "
             f"{SHORT_KERNEL_US} µs is launch-bound territory")
    shares, edges = duration_shares(summary, results)
    if shares.empty:
        raise style.NoData(title, "no stats/kernel_durations.csv with kernels")
    fig, axes = style.figure(1, 2, height=2.2 + style.ROW_IN * len(shares), sharey=True,
                             gridspec_kw={"width_ratios": [3, 1.2]})  # fmt: skip
    ax = axes[0, 0]
    mesh = ax.pcolormesh(shares.to_numpy(), cmap="Blues", vmin=0, vmax=100,
                         edgecolors="white", linewidth=0.5)  # fmt: skip
    for (row, col), value in np.ndenumerate(shares.to_numpy()):
        if value >= 0.5:
            ax.text(col + 0.5, row + 0.5, f"{value:.0f}", ha="center", va="center",
                    fontsize=6.5, color="white" if value > 55 else "#222222")  # fmt: skip
    ax.set_xticks(range(len(edges)), [_edge(e) for e in edges], rotation=45, ha="right",
                  fontsize=7)  # fmt: skip
    ax.set_yticks(np.arange(len(shares)) + 0.5,
                  [style.short_label(str(r), 40) for r in shares.index], fontsize=7.5)
    ax.set_ylim(len(shares), 0)
    cut = int(np.searchsorted(edges, SHORT_KERNEL_US * 1e3))
    if 0 < cut < len(edges) and edges[cut] == SHORT_KERNEL_US * 1e3:
        ax.axvline(cut, color=style.STATUS_COLOR, linestyle="--", linewidth=1.2)
    ax.set_xlabel("kernel duration (bin edges; numbers: % of the run's kernels)", fontsize=8)
    bar = fig.colorbar(mesh, ax=ax, location="top", shrink=0.4, aspect=40, pad=0.01)
    bar.set_label("% of the run's kernels", fontsize=7.5)
    bar.ax.tick_params(labelsize=7)
    under = shares.loc[:, [c for c in shares.columns if edges[c + 1] <= SHORT_KERNEL_US * 1e3]]
    _under_panel(axes[0, 1], under.sum(axis=1))
    fig.suptitle(title, fontsize=11)
    return fig


def _under_panel(ax: object, under: pd.Series) -> None:
    y = np.arange(len(under)) + 0.5
    bars = ax.barh(y, under, height=0.7, color=style.MEASURED_COLOR)
    style.bar_labels(ax, bars, [f"{v:.0f}%" for v in under])
    ax.set_xlim(0, 118)
    ax.set_xlabel(f"% of kernels under {SHORT_KERNEL_US} µs", fontsize=8)
    ax.tick_params(axis="x", labelsize=7.5)
    ax.tick_params(axis="y", left=False)
    ax.grid(axis="x", alpha=0.3)
