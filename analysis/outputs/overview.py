"""The answer first: a one-page overview of a results folder, as Markdown and as HTML.

    python -m analysis overview --results R -o R/SUMMARY.md --html R/overview.html

Provenance line, headline table (best ladder rung per model: ms/step with its 95% CI, MFU,
speed-up over the first rung), the attention backends' best TFLOP/s, the top findings with
their measured gains, the runs whose numbers are flagged, and the key figures. The HTML embeds
its figures (no request leaves the page) and is the report's first result; the Markdown is for
a README or a pull request.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.outputs.findings import finding_sentence, findings_table
from analysis.outputs.runs import OK, empty_cell, read_json

# The overview shows the first four figures with data (a distributed config has no ladder, a
# CPU matrix no kernels): these first, then the report's other figures in their order.
KEY_FIGURES = ["ladder_waterfall", "rank_timeline", "comm_bandwidth", "attention_sweep",
               "phase_gpu_time", "kernel_categories"]
SHOWN_FIGURES = 4
TOP_FINDINGS = 6
LANDING_FINDINGS = 4  # the report's first page: what fits beside the workflow graph


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _ms(v: Any) -> str:
    f = _num(v)
    return "—" if f is None else (f"{f:.2f}" if f < 100 else f"{f:.1f}")


def md_table(table: pd.DataFrame) -> str:
    """A DataFrame as a GitHub Markdown table (no extra dependency)."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in table.columns) + " |",
             "|" + "---|" * len(table.columns)]
    for row in table.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)


def provenance_line(summary: pd.DataFrame, plan: dict[str, Any]) -> str:
    row = summary.iloc[0] if len(summary) else pd.Series(dtype=object)

    def first(col: str) -> str:
        values = summary[col].dropna().unique() if col in summary.columns else []
        return ", ".join(str(v) for v in values) or "?"

    git = plan.get("git") or {}
    commit = (git.get("commit") or "?")[:12] + (" (dirty)" if git.get("dirty") else "")
    env = row.get("provenance_environment", "?")
    image = row.get("provenance_definition_sha256")
    where = f"container {str(image)[:12]}" if env == "container" and image else str(env)
    dates = sorted(summary["provenance_date"].dropna().astype(str)) if (
        "provenance_date" in summary.columns) else []
    when = f"{dates[0]} – {dates[-1]}" if len(dates) > 1 else (dates[0] if dates else "?")
    return (f"GPU: {first('device_name')} · driver {first('provenance_driver')} · torch "
            f"{first('torch')} (CUDA {first('cuda')}) · nsys {first('nsys_version')} · "
            f"{where} · commit {commit} · {when}")


def headline(results: Path) -> pd.DataFrame:
    """Best rung per ladder table: fastest untraced step among the rungs that ran."""
    rows = []
    for path in sorted((results / "ladders").glob("*.csv")):
        table = pd.read_csv(path)
        ok = table[table["status"] == OK]
        if ok.empty:
            continue
        best = ok.loc[ok["step_ms"].idxmin()]
        base = ok.iloc[0]
        rows.append({
            "ladder": path.stem,
            "best rung": best["rung"],
            "ms/step": _ms(best["step_ms"]),
            "95% CI": f"{_ms(best['step_ci_low_ms'])}–{_ms(best['step_ci_high_ms'])}",
            "MFU": f"{best['mfu']:.0%}" if _num(best.get("mfu")) is not None else "—",
            f"× vs {base['rung']}": (f"{base['step_ms'] / best['step_ms']:.1f}×"
                                    if best["run"] != base["run"] else "1.0×"),
            "first rung ms": _ms(base["step_ms"]),
        })
    return pd.DataFrame(rows)


def attention_best(summary: pd.DataFrame) -> pd.DataFrame:
    """Per attention_core shape and mode: TFLOP/s of each implementation/backend."""
    att = summary[(summary["workload"] == "attention_core") & (summary["status"] == OK)]
    if att.empty or "tflops" not in att.columns:
        return pd.DataFrame()
    def column(name: str) -> pd.Series:  # a key no run set is not a column of the summary
        return att[name] if name in att.columns else pd.Series([None] * len(att), index=att.index)

    att = att.assign(
        variant=[f"{i}:{_text(b) or 'auto'}" if i == "sdpa" else str(i)
                 for i, b in zip(column("impl"), column("sdpa_backend"), strict=True)],
        shape=[" ".join(p for p in (f"b{_int(b)} h{_int(h)} s{_int(s)} d{_int(d)}",
                                    _text(m), _text(dt)) if p)
               for b, h, s, d, m, dt in zip(column("batch"), column("heads"), column("seq"),
                                            column("head_dim"), column("mode"), column("dtype"),
                                            strict=True)],
    )
    return att.pivot_table(index="shape", columns="variant", values="tflops", aggfunc="max")


# The keys that say how a GPT step is computed (mode, optimizer, step counts aside): runs with
# the same values are the same configuration in another mode.
CONFIGURATION_KEYS = {"size": None, "context": None, "batch": None, "dtype": None,
                      "attention": None, "sdpa_backend": "auto", "compile": "off",
                      "cuda_graph": "off"}
MODES = ("forward", "forward_backward", "train")
PHASE_COLUMNS = {"forward_pass": "fwd", "loss_computation": "loss", "backward_pass": "bwd",
                 "optimizer_step": "opt"}


def _configuration(row: pd.Series) -> tuple:
    def value(key: str, default: Any) -> Any:
        v = row.get(key)
        if empty_cell(v):
            return default
        return _int(v) if key in ("context", "batch") else str(v)

    return tuple(value(k, d) for k, d in CONFIGURATION_KEYS.items())


def modes_table(summary: pd.DataFrame) -> pd.DataFrame:
    """CS336's table: per GPT ladder, its first rung's configuration (fp32 eager) and its
    last (every optimization), in each mode: the untraced step time with its CI and, where
    the run was captured, its GPU time per phase. The train row is the ladder's rung; the
    forward and forward+backward rows are the runs of the same configuration in that mode."""
    gpt = summary[summary["workload"] == "gpt"]
    if "rung_index" not in gpt.columns or gpt["rung_index"].dropna().empty:
        return pd.DataFrame()
    rows = []
    for (_, group), rungs in gpt.dropna(subset=["rung_index"]).groupby(
            ["ladder", "ladder_group"], sort=False):
        rungs = rungs.sort_values("rung_index")
        for rung in (rungs.iloc[0], rungs.iloc[-1]):
            config = _configuration(rung)
            same = gpt[[_configuration(r) == config for _, r in gpt.iterrows()]]
            for mode in MODES:
                run = rung if mode == "train" else _first(same[same["mode"] == mode])
                if run is None:
                    continue
                rows.append({"model": f"GPT {group}", "configuration": str(rung["rung"]),
                             "mode": mode, "run": run["run"], **_time_cells(run)})
    return pd.DataFrame(rows)


def _first(table: pd.DataFrame) -> pd.Series | None:
    return None if table.empty else table.iloc[0]


def _time_cells(run: pd.Series) -> dict[str, str]:
    if run.get("status") != OK:
        return {"ms/step [95% CI]": str(run.get("status"))}
    cells = {"ms/step [95% CI]": f"{_ms(run['step_ms'])} [{_ms(run.get('step_ci_low_ms'))}, "
                                 f"{_ms(run.get('step_ci_high_ms'))}]"}
    phases = [f"{short} {_ms(run.get(f'phase_gpu_ms_{name}'))}"
              for name, short in PHASE_COLUMNS.items()
              if _num(run.get(f"phase_gpu_ms_{name}")) is not None]
    if not _num(run.get("phase_gpu_ms_step")):  # no GPU work captured (a CPU run)
        phases = []
    cells["GPU ms per phase (capture)"] = " · ".join(phases) or "—"
    return cells


def _int(value: Any) -> str:
    """A shape value as written in the config (CSV floats like 4096.0 back to 4096)."""
    try:
        return str(int(float(value)))
    except (TypeError, ValueError):
        return str(value)


MESSAGE_CHARS = 160  # of a failed run's message on the front page (summary.csv has it all)


def _text(value: Any) -> str:
    """A CSV cell as text; an empty cell (NaN) is no text."""
    return "" if empty_cell(value) else str(value)


def flagged(summary: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in ("run", "status", "flags", "message") if c in summary.columns]
    mask = summary["flags"].fillna("").astype(str) != "" if "flags" in summary else False
    table = summary.loc[mask, cols].copy()
    if "message" in table:
        table["message"] = [m if not isinstance(m, str) or len(m) <= MESSAGE_CHARS
                            else m[: MESSAGE_CHARS - 1] + "…" for m in table["message"]]
    return table


def answer_tables(results: Path, summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(title, table) of the answer, in the order every front page shows them: the best
    configuration per ladder, then the attention backends' TFLOP/s."""
    tables = []
    head = headline(results)
    if not head.empty:
        tables.append(("Best configuration per model (untraced step time, 95% CI)", head))
    att = attention_best(summary)
    if not att.empty:
        tables.append(("Attention TFLOP/s by implementation and backend",
                       att.map(_tflops).reset_index()))
    return tables


def key_figures(results: Path) -> list[Path]:
    """The figures with data in ``results/plots``, key ones first, at most
    :data:`SHOWN_FIGURES`."""
    # matplotlib's modules: imported only when figures are picked
    from analysis.outputs.figures import FIGURES
    from analysis.outputs.style import has_data

    names = KEY_FIGURES + [n for n in FIGURES if n not in KEY_FIGURES]
    paths = [results / "plots" / f"{name}.png" for name in names]
    return [p for p in paths if p.is_file() and has_data(p)][:SHOWN_FIGURES]


def markdown(results: Path, figures: list[Path]) -> str:
    summary = pd.read_csv(results / "summary.csv")
    plan = read_json(results / "plan.json") or {}
    findings = _findings(results)
    parts = ["# profbench results", "", provenance_line(summary, plan), ""]
    for title, table in answer_tables(results, summary):
        parts += [f"## {title}", "", md_table(table), ""]
    modes = modes_table(summary)
    if not modes.empty:
        parts += ["## Forward, forward+backward and train step: fp32 eager vs every "
                  "optimization (CS336)", "", md_table(modes), ""]
    if len(findings):
        parts += ["## Top findings", ""]
        parts += [f"{i}. {s}" for i, s in enumerate(findings[:TOP_FINDINGS], 1)] + [""]
    parts += ops_section(results, summary)
    parts += module_section(results)
    flags = flagged(summary)
    if len(flags):
        parts += ["## Flagged runs", "", md_table(flags.fillna("")), ""]
    parts += baseline_section(results)
    for fig in figures:
        parts += [f"![{fig.stem}]({fig.relative_to(results).as_posix()})", ""]
    counts = summary["status"].value_counts().to_dict()
    parts += [f"{len(summary)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items()), ""]
    return "\n".join(parts)


MODULE_COLUMNS = ["Forward GPU ms/step", "Backward GPU ms/step", "Share of Step"]


def module_section(results: Path) -> list[str]:
    """Per ladder, its best rung's module table at a glance (stats/module_table.csv of a
    model workload): the outermost modules, then every layer summed (with the mean layer)
    and each sublayer summed over the layers."""
    parts: list[str] = []
    for path in sorted((results / "ladders").glob("*.csv")):
        table = pd.read_csv(path)
        ok = table[table["status"] == OK]
        if ok.empty:
            continue
        run = ok.loc[ok["step_ms"].idxmin(), "run"]
        modules = _read_modules(results / str(run) / "stats" / "module_table.csv")
        if modules is None:
            continue
        parts += [f"## Where the step goes by module: {run}", "",
                  f"GPU ms per step, inclusive of each module's children "
                  f"(`{run}/stats/module_table.csv`); shares of the whole step.", "",
                  md_table(module_glance(modules)), ""]
    return parts


def _read_modules(path: Path) -> pd.DataFrame | None:
    if not path.exists() or path.stat().st_size == 0:
        return None
    table = pd.read_csv(path, keep_default_na=False)
    if table.empty or not table["Share of Step"].astype(str).str.len().any():
        return None  # no GPU time (a CPU run)
    return table


def module_glance(table: pd.DataFrame) -> pd.DataFrame:
    """The outermost modules, then all layers and each sublayer over the layers."""
    paths = set(table["Module"])
    roots = table[[not any(".".join(m.split(".")[:i]) in paths
                           for i in range(1, m.count(".") + 1)) for m in table["Module"]]]
    layers = table[(table["Layer"] != "") & (table["Layer"] == table["Module"])]
    # a sublayer's own row (layers.0.attn), not the modules inside it (layers.0.attn.q_proj)
    sublayers = table[[s != "" and m.split(".")[-1] == s
                       for m, s in zip(table["Module"], table["Sublayer"], strict=True)]]
    rows = [_glance_row(r["Module"], [r]) for _, r in roots.iterrows()
            if r["Module"] not in set(layers["Layer"])]
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


TOP_OPS = 5
OPS_COLUMNS = {"Op": "op", "GPU ms/step": "GPU ms/step", "GPU Share of Step": "GPU share",
               "Calls/Step": "calls/step", "Kernels/Call": "kernels/call",
               "CPU Self ms/step": "CPU self ms/step"}


def ops_section(results: Path, summary: pd.DataFrame) -> list[str]:
    """Per run with an operator table: its top ops by GPU time (CPU time where there is none):
    from its op capture (ops.csv, with what the op ranges cost), or, for a compiled run, from
    its kernel map (compiled_ops.csv: each compiled kernel under its source ATen ops;
    docs/analysis.md, "Operator table")."""
    parts: list[str] = []
    for _, row in summary[summary["status"] == OK].iterrows():
        source, table = _op_table(results, row)
        if table.empty:
            continue
        by = "GPU Self (ns)" if table["GPU Self (ns)"].sum() > 0 else "CPU Self (ns)"
        top = table.sort_values(by, ascending=False).head(TOP_OPS)[list(OPS_COLUMNS)]
        top = top.rename(columns=OPS_COLUMNS)
        top["GPU share"] = [f"{v:.0%}" if _num(v) is not None else "—" for v in top["GPU share"]]
        if source == "ops.csv":
            overhead = _num(row.get("ops_overhead"))
            cost = f"{overhead:+.0%}" if overhead is not None else "not measured"
            how = (f"From its op capture (`{row['run']}/stats/ops.csv`); the op ranges changed "
                   f"the traced step by {cost} against the lean capture.")
        else:
            how = (f"From its kernel map (`{row['run']}/stats/compiled_ops.csv`): each compiled "
                   "kernel under the ATen ops Inductor generated it from.")
        parts += [f"## Top ops: {row['run']}", "", how, "", md_table(top.round(3).fillna("—")),
                  ""]
    return parts


def _op_table(results: Path, row: pd.Series) -> tuple[str, pd.DataFrame]:
    stats = results / str(row["run"]) / "stats"
    choices = ["compiled_ops.csv"]
    if row.get("ops_status") == OK:
        choices.insert(0, "ops.csv")
    for name in choices:
        path = stats / name
        if path.is_file() and path.stat().st_size:
            table = pd.read_csv(path)
            if not table.empty:
                return name, table
    return "", pd.DataFrame()


def _tflops(value: float) -> str:
    """Four significant digits: 639.2 on an H100, 0.0004123 on a CPU (not a bare 0.0)."""
    return "—" if pd.isna(value) else f"{value:.4g}"


def baseline_section(results: Path) -> list[str]:
    """The diff against the config's `baseline:` folder (rules/report.smk), when there is one:
    the verdict counts and the runs that changed."""
    path = results / "diff" / "runs.csv"
    if not path.is_file():
        return []
    runs = pd.read_csv(path)
    counts = runs["verdict"].fillna(runs["presence"]).value_counts().to_dict()
    changed = runs[runs["verdict"].isin(["faster", "slower"])]
    cols = ["run", "verdict", "old_ms", "new_ms", "change_pct", "speedup"]
    parts = ["## Against the baseline", "",
             ", ".join(f"{n} {v}" for v, n in counts.items()) + " (diff/summary.md has why)", ""]
    if len(changed):
        parts += [md_table(changed[cols].round(3)), ""]
    return parts


def _findings(results: Path) -> list[str]:
    path = results / "findings.csv"
    if not path.is_file():
        return []
    table = pd.read_csv(path)
    from analysis.outputs.findings import Finding

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


def to_html(md: str, results: Path) -> str:
    """Markdown -> a self-contained page (tables, lists, embedded PNGs); no network."""
    body, table, in_list = [], [], False
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if table:
            body.append(_html_table(table))
            table = []
        is_item = line[:1].isdigit() and ". " in line[:4]
        if in_list and not is_item:  # the list ends before whatever follows it
            body.append("</ol>")
            in_list = False
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("!["):
            src = line[line.index("(") + 1 : -1]
            data = base64.b64encode((results / src).read_bytes()).decode()
            body.append(f'<img alt="{html.escape(src)}" src="data:image/png;base64,{data}">')
        elif is_item:
            if not in_list:
                body.append("<ol>")
                in_list = True
            body.append(f"<li>{_inline(line.split('. ', 1)[1])}</li>")
        elif line:
            body.append(f"<p>{_inline(line)}</p>")
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}"
             "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
             "padding:3px 8px;text-align:right}img{max-width:100%;margin:.5em 0}"
             "li,p{overflow-wrap:anywhere}")
    # Marks how many figures the browser decoded (the report test reads it back).
    script = ("<script>window.addEventListener('load',()=>{const i=[...document.images];"
              "document.body.dataset.images=i.length;document.body.dataset.imagesDecoded="
              "i.filter(x=>x.complete&&x.naturalWidth>0).length;});</script>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>profbench results"
            f"</title><style>{style}</style></head><body>{''.join(body)}{script}</body></html>")


def _inline(text: str) -> str:
    out, parts = [], html.escape(text).split("**")
    for i, p in enumerate(parts):
        out.append(f"<b>{p}</b>" if i % 2 else p)
    s = "".join(out)
    code = s.split("`")
    return "".join(f"<code>{c}</code>" if i % 2 else c for i, c in enumerate(code))


def _html_table(lines: list[str]) -> str:
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    head, body = rows[0], rows[2:]
    th = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                  for r in body)
    return f"<table><tr>{th}</tr>{trs}</table>"


# --- the Snakemake report's first page -------------------------------------------------------


def landing_rst(results: Path) -> str:
    """The report's landing text (reStructuredText), short enough to be seen whole beside the
    workflow graph: provenance, the headline table, the top findings and how the numbers were
    made, every setting read from the plan that ran."""
    summary = pd.read_csv(results / "summary.csv")
    plan = read_json(results / "plan.json") or {}
    parts = [".. raw:: html", "", f"   {_LANDING_STYLE}", "",
             f"**profbench results** · {provenance_line(summary, plan)}", ""]
    for title, table in answer_tables(results, summary):
        parts += [f".. rubric:: {title}", "", _rst_table(table), ""]
    findings = _findings(results)
    if findings:
        parts += [".. rubric:: Top findings", ""]
        parts += [f"{i}. {_rst_inline(s)}" for i, s in enumerate(findings[:LANDING_FINDINGS], 1)]
        parts += [""]
    parts += [".. rubric:: How these numbers were made", "", _settings_text(summary, plan), ""]
    # Snakemake renders this page through Jinja: kernel names may hold braces.
    return "{% raw %}\n" + "\n".join(parts) + "\n{% endraw %}\n"


# Snakemake's report centres its first page vertically (a page taller than the window loses
# its top) in a narrow column: start at the top and take more width.
_LANDING_STYLE = ("<style>div.h-screen.items-center{align-items:flex-start}"
                  "div.prose.max-w-lg{max-width:52rem}p.rubric{font-weight:600;margin-top:1em}"
                  "</style>")


def _settings_text(summary: pd.DataFrame, plan: dict[str, Any]) -> str:
    timing, nsys = plan.get("timing") or {}, plan.get("nsys") or {}
    counts = summary["status"].value_counts().to_dict()
    runs = f"{len(summary)} runs (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"
    text = (f"{runs}. Each run's step time is the median of {timing.get('repeats', '?')} "
            "untraced timing processes with a 95% bootstrap CI (flagged unstable above "
            f"±{float(timing.get('unstable_threshold', 0.03)):.0%}); captured runs were also "
            f"profiled with ``nsys profile --trace={nsys.get('trace', '?')}``, capturing "
            f"{_CAPTURE_TEXT.get(nsys.get('capture'), 'the whole process')}. Sections: 1. "
            "Overview (figures, the findings with the CSV cell each rests on), 2. Figures, "
            "3. the baseline diff (when configured), 4. per-run tables; ``summary.csv`` has "
            "every number with its provenance.")
    return text


_CAPTURE_TEXT = {
    "nvtx": "only the measured steps (NVTX range ``profiled_region``; warm-up runs before it)",
    "cudaProfilerApi": "only the measured steps (cudaProfilerStart/Stop)",
}


def _rst_inline(text: str) -> str:
    """The findings' Markdown (**bold**, `code`) as reStructuredText."""
    code = text.split("`")
    return "".join(f"``{c}``" if i % 2 else c for i, c in enumerate(code))


def _rst_table(table: pd.DataFrame) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("\n", " ").replace("|", "\\|") or "\\"

    lines = [".. list-table::", "   :header-rows: 1", ""]
    for row in [list(table.columns), *table.astype(object).itertuples(index=False)]:
        lines.append("   * - " + cell(row[0]))
        lines += [f"     - {cell(v)}" for v in row[1:]]
    return "\n".join(lines) + "\n"


def write_overview(results: Path, md_path: Path, html_path: Path | None,
                   figures: list[Path], rst_path: Path | None = None) -> None:
    md = markdown(results, figures)
    md_path.write_text(md)
    if html_path is not None:
        html_path.write_text(to_html(md, results))
    if rst_path is not None:
        rst_path.write_text(landing_rst(results))


__all__ = ["write_overview", "markdown", "headline", "landing_rst", "findings_table"]
