"""The answer first: a one-page overview of a results folder, as Markdown and as HTML.

    python -m analysis overview --results R -o R/SUMMARY.md --html R/overview.html

In order: the machine and software the numbers were made on, the optimization ladder (every
rung of every model), the best configuration per model, the top findings with their measured
gains, then one compact table per experiment (CS336's modes, each attention comparison, each
ladder's top ops, the largest batches that fit, the other runs), the failed and flagged runs
and the key figures. The HTML embeds its figures (no request leaves the page), fits 1400 px
and is the report's first result; the Markdown is for a README or a pull request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from analysis.outputs.findings import Finding, finding_sentence
from analysis.outputs.maxbatch import max_batch_table
from analysis.outputs.overview_experiments import attention_tables, other_tables, runs_of
from analysis.outputs.overview_ops import capture_ops, ladder_ops, module_tables
from analysis.outputs.overview_page import (
    Block,
    Cards,
    Figures,
    Grid,
    Heading,
    Items,
    Para,
    Titled,
    rst_alignment,
    rst_inline,
    rst_table,
    to_html,
    to_markdown,
)
from analysis.outputs.overview_tables import (
    best_configurations,
    flagged,
    ladder_table,
    modes_grid,
    modes_table,
    read_ladders,
)
from analysis.outputs.runs import empty_cell, read_json

# The overview shows the first four figures with data (a distributed config has no ladder, a
# CPU matrix no kernels): these first, then the report's other figures in their order.
KEY_FIGURES = ["ladder_waterfall", "scaling", "rank_timeline", "comm_bandwidth",
               "attention_sweep", "phase_gpu_time", "kernel_categories"]
SHOWN_FIGURES = 4
TOP_FINDINGS = 6
LANDING_FINDINGS = 4  # the report's first page: what fits beside the workflow graph
LADDER_TITLE = "Optimization ladder: each rung adds one change"
BEST_TITLE = "Best configuration per model"
MODES_TITLE = "CS336: forward, forward+backward and train step, fp32 eager vs every optimization"


# --- the header: where the numbers were made ----------------------------------------------------


def machine_line(summary: pd.DataFrame, plan: dict[str, Any]) -> str:
    """``GPU: NVIDIA H100 80GB HBM3 · driver … · CUDA … · torch … · nsys … · host · commit …
    · dates``; on a CPU run ``CPU: <its model name>``. Values no run recorded are left out,
    never shown as '?'."""
    parts = [_devices(summary)]
    gpu = _gpu_rows(summary)
    if gpu.any():
        parts += [f"driver {d}" for d in [_values(summary[gpu], "provenance_driver")] if d]
        parts += [f"CUDA {c}" for c in [_values(summary[gpu], "cuda")] if c]
    parts += [f"{name} {v}" for name, col in (("torch", "torch"), ("nsys", "nsys_version"))
              if (v := _values(summary, col))]
    row = summary.iloc[0] if len(summary) else pd.Series(dtype=object)
    env, image = row.get("provenance_environment"), row.get("provenance_definition_sha256")
    if env == "container" and not empty_cell(image):
        parts.append(f"container {str(image)[:12]}")
    elif not empty_cell(env):
        parts.append(str(env))
    git = plan.get("git") or {}
    if git.get("commit"):
        parts.append(f"commit {git['commit'][:12]}" + (" (dirty)" if git.get("dirty") else ""))
    parts.append(_dates(summary))
    return " · ".join(p for p in parts if p)


def _gpu_rows(summary: pd.DataFrame) -> pd.Series:
    """Rows measured on a GPU: they name a CUDA version or a GPU."""
    def filled(col: str) -> pd.Series:
        if col not in summary.columns:
            return pd.Series(False, index=summary.index)
        return summary[col].notna() & (summary[col].astype(str) != "")
    return filled("cuda") | filled("gpu_name")


def _devices(summary: pd.DataFrame) -> str:
    gpu = _gpu_rows(summary)
    named = [("GPU", _values(summary[gpu], "device_name") or _values(summary[gpu], "gpu_name")),
             ("CPU", _values(summary[~gpu], "device_name"))]
    return "; ".join(f"{kind}: {name}" for kind, name in named if name) or "device not recorded"


def _values(table: pd.DataFrame, col: str) -> str:
    if col not in table.columns:
        return ""
    return ", ".join(str(v) for v in table[col].dropna().unique() if str(v) != "")


def _dates(summary: pd.DataFrame) -> str:
    if "provenance_date" not in summary.columns:
        return ""
    dates = pd.to_datetime(summary["provenance_date"].dropna(), utc=True, errors="coerce")
    dates = dates.dropna().sort_values()
    if dates.empty:
        return ""
    first, last = dates.iloc[0], dates.iloc[-1]
    start = first.strftime("%Y-%m-%d %H:%M")
    if first.date() == last.date():
        end = last.strftime("%H:%M")
        return f"{start} UTC" if end == first.strftime("%H:%M") else f"{start}–{end} UTC"
    return f"{start} – {last.strftime('%Y-%m-%d %H:%M')} UTC"


def run_counts(summary: pd.DataFrame) -> str:
    counts = summary["status"].value_counts().to_dict()
    return f"{len(summary)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items())


# --- the page -----------------------------------------------------------------------------------


def answer_tables(results: Path, summary: pd.DataFrame,
                  plan: dict[str, Any] | None = None) -> list[tuple[str, Grid]]:
    """(title, table) of the answer, first on every front page: the optimization ladder and
    the best configuration per model; without a ladder, the attention comparisons."""
    plan = plan if plan is not None else read_json(results / "plan.json") or {}
    ladders = read_ladders(results, summary)
    best = best_configurations(ladders, plan)
    if best.rows:
        return [(LADDER_TITLE, ladder_table(ladders)), (BEST_TITLE, best)]
    return [(t.title, t.grid) for t in attention_tables(runs_of(summary, plan))]


def page(results: Path, figures: list[Path]) -> list[Block]:
    """The overview's blocks, in reading order."""
    summary = pd.read_csv(results / "summary.csv")
    plan = read_json(results / "plan.json") or {}
    ladders = read_ladders(results, summary)
    blocks: list[Block] = [Heading("profbench results", 1),
                           Para(f"{machine_line(summary, plan)} · {run_counts(summary)}")]
    for title, grid in answer_tables(results, summary, plan):
        blocks += [Heading(title), grid]
    findings = _findings(results)
    if findings:
        blocks += [Heading("Top findings"), Items(findings[:TOP_FINDINGS])]
    experiments = experiment_tables(results, summary, plan, ladders)
    if experiments:
        blocks += [Heading("Experiments"), Cards(experiments)]
    blocks += [Heading("Flagged runs"), *flagged(summary)]
    blocks += baseline_section(results)
    if figures:
        blocks += [Heading("Key figures"),
                   Para("Click a figure to see it at full width; every figure is in the "
                        "report's Figures section."), Figures(figures)]
    return blocks


def experiment_tables(results: Path, summary: pd.DataFrame, plan: dict[str, Any],
                      ladders: dict[str, pd.DataFrame]) -> list[Titled]:
    """One compact table per experiment: CS336's modes, each attention comparison, each
    ladder's top ops and modules, the op captures, the largest batches that fit (`batch:
    max`) and the other runs."""
    tables: list[Titled] = []
    modes = modes_table(summary, results)
    if not modes.empty:
        tables.append(Titled(MODES_TITLE, modes_grid(modes)))
    runs = runs_of(summary, plan)
    tables += attention_tables(runs)
    tables += ladder_ops(results, ladders, summary)
    tables += module_tables(results, ladders)
    ladder_runs = {str(r) for t in ladders.values() for r in t["run"]}
    tables += capture_ops(results, summary, ladder_runs)
    tables += max_batch_table(summary)
    shown = ladder_runs | (set(modes["run"]) if not modes.empty else set())
    tables += other_tables(runs, shown)
    return tables


def markdown(results: Path, figures: list[Path]) -> str:
    return to_markdown(page(results, figures), results)


def key_figures(results: Path) -> list[Path]:
    """The figures with data in ``results/plots``, key ones first, at most
    :data:`SHOWN_FIGURES`."""
    # matplotlib's modules: imported only when figures are picked
    from analysis.outputs.figures import FIGURES
    from analysis.outputs.style import has_data

    names = KEY_FIGURES + [n for n in FIGURES if n not in KEY_FIGURES]
    paths = [results / "plots" / f"{name}.png" for name in names]
    return [p for p in paths if p.is_file() and has_data(p)][:SHOWN_FIGURES]


def baseline_section(results: Path) -> list[Block]:
    """The diff against the config's `baseline:` folder (rules/report.smk), when there is one:
    the verdict counts and the runs that changed."""
    path = results / "diff" / "runs.csv"
    if not path.is_file():
        return []
    runs = pd.read_csv(path)
    counts = runs["verdict"].fillna(runs["presence"]).value_counts().to_dict()
    changed = runs[runs["verdict"].isin(["faster", "slower"])]
    cols = ["run", "verdict", "old_ms", "new_ms", "change_pct", "speedup"]
    blocks: list[Block] = [Heading("Against the baseline"), Para(
        ", ".join(f"{n} {v}" for v, n in counts.items()) + " (diff/summary.md has why)")]
    if len(changed):
        table = changed[cols].round(3).astype(str)
        blocks.append(Grid(cols, table.values.tolist()))
    return blocks


def _findings(results: Path) -> list[str]:
    path = results / "findings.csv"
    if not path.is_file():
        return []
    table = pd.read_csv(path)
    records = [{k: (None if empty_cell(v) else v) for k, v in r.items()}
               for r in table.to_dict("records")]
    # the front page shows each rule's strongest finding before a rule's second one
    firsts, seen = [], set()
    for rec in records:
        if rec["rule"] not in seen:
            seen.add(rec["rule"])
            firsts.append(rec)
    rest = [rec for rec in records if not any(rec is f for f in firsts)]
    return [finding_sentence(Finding(**rec)) for rec in firsts + rest]


# --- the Snakemake report's first page -------------------------------------------------------


def landing_rst(results: Path) -> str:
    """The report's landing text (reStructuredText), short enough to be seen whole beside the
    workflow graph: provenance, the answer tables, the top findings and how the numbers were
    made, every setting read from the plan that ran."""
    summary = pd.read_csv(results / "summary.csv")
    plan = read_json(results / "plan.json") or {}
    tables = answer_tables(results, summary, plan)
    names = [f"answer-{i}" for i in range(len(tables))]
    align = "".join(rst_alignment(t, n) for (_, t), n in zip(tables, names, strict=True))
    parts = [".. raw:: html", "", f"   {_LANDING_STYLE}<style>{align}</style>", "",
             f"**profbench results** · {machine_line(summary, plan)}", ""]
    for (title, table), name in zip(tables, names, strict=True):
        parts += [f".. rubric:: {title}", "", rst_table(table, name), ""]
    findings = _findings(results)
    if findings:
        parts += [".. rubric:: Top findings", ""]
        parts += [f"{i}. {rst_inline(s)}" for i, s in enumerate(findings[:LANDING_FINDINGS], 1)]
        parts += [""]
    parts += [".. rubric:: How these numbers were made", "", _settings_text(summary, plan), ""]
    # Snakemake renders this page through Jinja: kernel names may hold braces.
    return "{% raw %}\n" + "\n".join(parts) + "\n{% endraw %}\n"


# Snakemake's report centres its first page vertically (a page taller than the window loses
# its top) in a narrow column: start at the top, take more width, keep tables compact.
_LANDING_STYLE = ("<style>div.h-screen.items-center{align-items:flex-start}"
                  "div.prose.max-w-lg{max-width:60rem}p.rubric{font-weight:600;margin-top:1em}"
                  "div.prose table{font-size:.85em;margin:.3em 0}"
                  "div.prose td,div.prose th{padding:.15em .5em}</style>")


def _settings_text(summary: pd.DataFrame, plan: dict[str, Any]) -> str:
    timing, nsys = plan.get("timing") or {}, plan.get("nsys") or {}
    counts = summary["status"].value_counts().to_dict()
    runs = f"{len(summary)} runs (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"
    return (f"{runs}. Each run's step time is the median of {timing.get('repeats', '?')} "
            "untraced timing processes with a 95% bootstrap CI (flagged unstable above "
            f"±{float(timing.get('unstable_threshold', 0.03)):.0%}); captured runs were also "
            f"profiled with ``nsys profile --trace={nsys.get('trace', '?')}``, capturing "
            f"{_CAPTURE_TEXT.get(nsys.get('capture'), 'the whole process')}. Sections: 1. "
            "Overview (figures, the findings with the CSV cell each rests on), 2. Figures, "
            "3. the baseline diff (when configured), 4. per-run tables; ``summary.csv`` has "
            "every number with its provenance.")


_CAPTURE_TEXT = {
    "nvtx": "only the measured steps (NVTX range ``profiled_region``; warm-up runs before it)",
    "cudaProfilerApi": "only the measured steps (cudaProfilerStart/Stop)",
}


def write_overview(results: Path, md_path: Path, html_path: Path | None,
                   figures: list[Path], rst_path: Path | None = None) -> None:
    blocks = page(results, figures)
    md_path.write_text(to_markdown(blocks, results))
    if html_path is not None:
        html_path.write_text(to_html(blocks, results))
    if rst_path is not None:
        rst_path.write_text(landing_rst(results))


__all__ = ["write_overview", "markdown", "page", "landing_rst", "machine_line",
           "answer_tables", "key_figures", "modes_table"]
