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

KEY_FIGURES = ["ladder_waterfall", "attention_sweep", "phase_gpu_time", "kernel_categories"]
TOP_FINDINGS = 6


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
    att = att.assign(
        variant=[f"{i}:{b}" if i == "sdpa" else str(i)
                 for i, b in zip(att.get("impl"), att.get("sdpa_backend"), strict=False)],
        shape=[" ".join(p for p in (f"b{_int(b)} h{_int(h)} s{_int(s)} d{_int(d)}",
                                    _text(m), _text(dt)) if p)
               for b, h, s, d, m, dt in zip(att["batch"], att["heads"], att["seq"],
                                            att["head_dim"], att["mode"], att["dtype"],
                                            strict=False)],
    )
    return att.pivot_table(index="shape", columns="variant", values="tflops", aggfunc="max")


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


def markdown(results: Path, figures: list[Path]) -> str:
    summary = pd.read_csv(results / "summary.csv")
    plan = read_json(results / "plan.json") or {}
    findings = _findings(results)
    parts = ["# profbench results", "", provenance_line(summary, plan), ""]
    head = headline(results)
    if not head.empty:
        parts += ["## Best configuration per model (untraced step time, 95% CI)", "",
                  md_table(head), ""]
    att = attention_best(summary)
    if not att.empty:
        parts += ["## Attention TFLOP/s by implementation and backend", "",
                  md_table(att.map(_tflops).reset_index()), ""]
    if len(findings):
        parts += ["## Top findings", ""]
        parts += [f"{i}. {s}" for i, s in enumerate(findings[:TOP_FINDINGS], 1)] + [""]
    parts += ops_section(results, summary)
    flags = flagged(summary)
    if len(flags):
        parts += ["## Flagged runs", "", md_table(flags.fillna("")), ""]
    parts += baseline_section(results)
    for fig in figures:
        parts += [f"![{fig.stem}]({fig.relative_to(results).as_posix()})", ""]
    counts = summary["status"].value_counts().to_dict()
    parts += [f"{len(summary)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items()), ""]
    return "\n".join(parts)


TOP_OPS = 5
OPS_COLUMNS = {"Op": "op", "GPU ms/step": "GPU ms/step", "GPU Share of Step": "GPU share",
               "Calls/Step": "calls/step", "Kernels/Call": "kernels/call",
               "CPU Self ms/step": "CPU self ms/step"}


def ops_section(results: Path, summary: pd.DataFrame) -> list[str]:
    """Per run with an op capture: its top ops by GPU time (CPU time where there is none) and
    what the op ranges cost (docs/analysis.md, "Operator table")."""
    if "ops_status" not in summary.columns:
        return []
    parts: list[str] = []
    for _, row in summary[summary["ops_status"] == OK].iterrows():
        path = results / str(row["run"]) / "stats" / "ops.csv"
        table = pd.read_csv(path) if path.is_file() else pd.DataFrame()
        if table.empty:
            continue
        by = "GPU Self (ns)" if table["GPU Self (ns)"].sum() > 0 else "CPU Self (ns)"
        top = table.sort_values(by, ascending=False).head(TOP_OPS)[list(OPS_COLUMNS)]
        top = top.rename(columns=OPS_COLUMNS)
        top["GPU share"] = [f"{v:.0%}" if _num(v) is not None else "—" for v in top["GPU share"]]
        overhead = _num(row.get("ops_overhead"))
        cost = f"{overhead:+.0%}" if overhead is not None else "not measured"
        parts += [f"## Top ops: {row['run']}", "",
                  f"From its op capture (`{row['run']}/stats/ops.csv`); the op ranges changed "
                  f"the traced step by {cost} against the lean capture.", "",
                  md_table(top.round(3).fillna("—")), ""]
    return parts


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


def write_overview(results: Path, md_path: Path, html_path: Path | None,
                   figures: list[Path]) -> None:
    md = markdown(results, figures)
    md_path.write_text(md)
    if html_path is not None:
        html_path.write_text(to_html(md, results))


__all__ = ["write_overview", "markdown", "headline", "findings_table"]
