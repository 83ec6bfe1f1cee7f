"""The overview's answer tables: the optimization ladder (every rung of every model side by
side), the best configuration per model, CS336's forward / forward+backward / train table,
and the runs that failed or carry a flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from analysis.outputs.overview_experiments import MODE_LABEL, ms, number, step_cell
from analysis.outputs.overview_page import EMPTY, Block, Details, Grid, Para
from analysis.outputs.runs import OK, empty_cell

# --- the ladders -------------------------------------------------------------------------------


def read_ladders(results: Path, summary: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """Ladder name -> its rungs (ladders/<name>.csv, in rung order), in the order the
    summary lists their runs (the config's)."""
    ladders = {p.stem: pd.read_csv(p) for p in sorted((results / "ladders").glob("*.csv"))}
    if summary is None:
        return ladders
    position = {str(run): i for i, run in enumerate(summary["run"])}
    return dict(sorted(ladders.items(), key=lambda item: min(
        (position.get(str(r), len(position)) for r in item[1]["run"]), default=len(position))))


def short_names(names: list[str]) -> dict[str, str]:
    """The part of each name the others do not share: gpt_train_small, gpt_train_2.7B ->
    small, 2.7B (a single name stays whole)."""
    if len(names) < 2:
        return {n: n for n in names}
    split = [n.split("_") for n in names]
    head = 0
    while all(len(s) > head + 1 and s[head] == split[0][head] for s in split):
        head += 1
    tail = 0
    while all(len(s) > head + tail + 1 and s[-1 - tail] == split[0][-1 - tail] for s in split):
        tail += 1
    return {n: "_".join(s[head:len(s) - tail]) for n, s in zip(names, split, strict=True)}


def _merged_rungs(ladders: dict[str, pd.DataFrame]) -> list[str]:
    """Every ladder's rungs in one order: a rung one ladder lacks goes after its predecessor."""
    order: list[str] = []
    for table in ladders.values():
        previous = None
        for rung in table["rung"].astype(str):
            if rung not in order:
                order.insert(order.index(previous) + 1 if previous in order else len(order), rung)
            previous = rung
    return order


def _best(table: pd.DataFrame) -> pd.Series | None:
    ok = table[(table["status"] == OK) & table["step_ms"].notna()]
    return None if ok.empty else ok.loc[ok["step_ms"].idxmin()]


def ladder_table(ladders: dict[str, pd.DataFrame]) -> Grid:
    """Rows: the rungs, each adding one change; per model: the untraced step time with its
    95% CI and the speed-up over its first rung (the fastest rung in bold)."""
    short = short_names(list(ladders))
    header = ["rung"]
    for name in ladders:
        header += [f"{short[name]} ms/step [95% CI]", f"{short[name]} ×",
                   f"{short[name]} peak GiB"]
    rows = []
    for rung in _merged_rungs(ladders):
        row = [rung]
        for table in ladders.values():
            row += _rung_cells(table, rung)
        rows.append(row)
    caption = ("Untraced step time, median of the timing processes with its 95% CI; × is the "
               "speed-up over the model's first rung; **bold**: its fastest rung; peak GiB: "
               "the memory the step held (docs/analysis.md, \"Where the memory goes\").")
    return Grid(header, rows, caption).without_empty_columns()


def _rung_cells(table: pd.DataFrame, rung: str) -> list[str]:
    hit = table[table["rung"].astype(str) == rung]
    if hit.empty:
        return [EMPTY, "", EMPTY]
    row, best, first = hit.iloc[0], _best(table), table.iloc[0]
    if row["status"] != OK:
        return [str(row["status"]), "", EMPTY]
    cell = step_cell(row)
    if best is not None and best["run"] == row["run"]:
        cell = f"**{cell}**"
    speedup = number(first["step_ms"]) / row["step_ms"] if number(first["step_ms"]) else None
    return [cell, EMPTY if speedup is None else f"{speedup:.1f}×", gib(row)]


def gib(row: pd.Series) -> str:
    """The peak memory cell (peak_memory_gib of the ladder table)."""
    value = number(row.get("peak_memory_gib"))
    return EMPTY if value is None else f"{value:.2f}"


def best_configurations(ladders: dict[str, pd.DataFrame], plan: dict[str, Any]) -> Grid:
    """Per model (ladder): its fastest rung, step time, speed-up, MFU, and what it sets that
    the first rung does not."""
    rows = []
    for name, table in ladders.items():
        best = _best(table)
        if best is None:
            continue
        first = table.iloc[0]
        speedup = first["step_ms"] / best["step_ms"] if number(first["step_ms"]) else None
        rows.append([name, str(best["rung"]), step_cell(best),
                     EMPTY if speedup is None else f"{speedup:.1f}×",
                     f"{best['mfu']:.0%}" if number(best.get("mfu")) is not None else EMPTY,
                     gib(best),
                     settings(plan, str(first["run"]), str(best["run"]))])
    header = ["model", "best rung", "ms/step [95% CI]", "× vs first rung", "MFU", "peak GiB",
              "settings that differ from the first rung"]
    return Grid(header, rows).without_empty_columns()


def settings(plan: dict[str, Any], base: str, run: str) -> str:
    """``dtype bf16 · compile default``: the parameters of ``run`` that differ from
    ``base``'s (a parameter back at its default: ``key default``)."""
    runs = plan.get("runs") or {}
    a = (runs.get(base) or {}).get("params") or {}
    b = (runs.get(run) or {}).get("params") or {}
    if base == run or not b:
        return EMPTY if base == run else ""
    keys = list(dict.fromkeys([*b, *a]))
    return " · ".join(f"{k} {b[k]}" if k in b else f"{k} default"
                      for k in keys if a.get(k) != b.get(k))


# --- CS336's table: each mode at the first and the last rung's configuration -----------------

# The keys that say how a GPT step is computed (mode, optimizer, step counts aside): runs with
# the same values are the same configuration in another mode.
CONFIGURATION_KEYS = {"size": None, "context": None, "batch": None, "dtype": None,
                      "attention": None, "sdpa_backend": "auto", "compile": "off",
                      "cuda_graph": "off"}
MODES = ("forward", "forward_backward", "train")
PHASES = {"forward_pass": "fwd", "loss_computation": "loss", "backward_pass": "bwd",
          "optimizer_step": "opt"}
# The phases each mode runs: a forward-only run has no backward or optimizer to show.
MODE_PHASES = {"forward": ("forward_pass",),
               "forward_backward": ("forward_pass", "loss_computation", "backward_pass"),
               "train": tuple(PHASES)}
PHASE_COLUMN = "ms per phase (capture)"


def _configuration(row: pd.Series) -> tuple:
    def value(key: str, default: Any) -> Any:
        v = row.get(key)
        if empty_cell(v):
            return default
        return str(int(float(v))) if key in ("context", "batch") else str(v)

    return tuple(value(k, d) for k, d in CONFIGURATION_KEYS.items())


def modes_table(summary: pd.DataFrame, results: Path | None = None) -> pd.DataFrame:
    """CS336's table: per GPT ladder, its first rung's configuration (fp32 eager) and its
    last (every optimization), in each mode: the untraced step time with its CI and, where
    the run was captured, its time per phase. The train row is the ladder's rung; the
    forward and forward+backward rows are the runs of the same configuration in that mode."""
    gpt = summary[summary["workload"] == "gpt"]
    if "rung_index" not in gpt.columns or gpt["rung_index"].dropna().empty:
        return pd.DataFrame()
    configurations = [_configuration(r) for _, r in gpt.iterrows()]
    rows = []
    for (_, group), rungs in gpt.dropna(subset=["rung_index"]).groupby(
            ["ladder", "ladder_group"], sort=False):
        rungs = rungs.sort_values("rung_index")
        for rung in (rungs.iloc[0], rungs.iloc[-1]):
            config = _configuration(rung)
            same = gpt[[c == config for c in configurations]]
            for mode in MODES:
                run = rung if mode == "train" else _first(same[same["mode"] == mode])
                if run is None:
                    continue
                rows.append({"model": f"GPT {group}", "configuration": str(rung["rung"]),
                             "mode": MODE_LABEL.get(mode, mode), "run": run["run"],
                             "ms/step [95% CI]": step_cell(run),
                             PHASE_COLUMN: phase_cell(run, results)})
    return pd.DataFrame(rows)


def _first(table: pd.DataFrame) -> pd.Series | None:
    return None if table.empty else table.iloc[0]


def phase_cell(run: pd.Series, results: Path | None = None) -> str:
    """``fwd 17.29 · loss 0.08 · bwd 32.41 · opt 3.83``: the capture's GPU ms per step in each
    phase the run's mode has; on a CPU run (no GPU time), ``CPU`` and the phase ranges' own
    time from its phase table."""
    if run.get("status") != OK:
        return ""
    phases = MODE_PHASES.get(str(run.get("mode")), tuple(PHASES))
    if number(run.get("phase_gpu_ms_step")):
        values = {p: number(run.get(f"phase_gpu_ms_{p}")) for p in phases}
        prefix = ""
    else:
        values = _cpu_phases(results, str(run["run"]), phases) if results else {}
        prefix = "CPU "
    shown = [f"{PHASES[p]} {ms(v)}" for p, v in values.items() if v is not None]
    return prefix + " · ".join(shown) if shown else EMPTY


def _cpu_phases(results: Path, run: str, phases: tuple[str, ...]) -> dict[str, float | None]:
    path = results / run / "stats" / "phase_gpu_time.csv"
    if not path.is_file() or path.stat().st_size == 0:
        return {}
    table = pd.read_csv(path)
    if "CPU ms/step" not in table.columns:
        return {}
    cpu = dict(zip(table["Range"], table["CPU ms/step"], strict=True))
    return {p: number(cpu.get(p)) for p in phases}


def modes_grid(modes: pd.DataFrame) -> Grid:
    shown = modes.drop(columns=["run"])
    return Grid(list(shown.columns), shown.astype(str).values.tolist(),
                "Untraced step time with its 95% CI; per phase: the capture's GPU ms per step "
                "in each phase the mode runs (CPU: the phase ranges' own time on a run "
                "without GPU work).")


# --- failed and flagged runs ------------------------------------------------------------------

MESSAGE_CHARS = 160  # of a failed run's message on the front page (summary.csv has it all)
FLAG_MEANING = {
    "unstable": "95% CI wider than the unstable threshold",
    "high_overhead": "tracing slowed the step by over 25%",
    "capture_recompiled": "torch.compile made more graphs in the capture than when timed: "
                          "the capture's kernels are not the timed ones",
    "power_capped": "the GPU held its clocks to its power limit",
    "throttled": "thermal or hardware clock slowdown",
    "shared_gpu": "another process used the GPU",
    "host_bound": "the GPU waited on the host: the step's time is the CPU's",
    "cpu_speed_varied": "the host CPU's speed moved by over 10% during the run",
    "module_attribution_suspect": "the module table fails its own checks (summary.csv "
                                  "module_attribution_suspect names the worst): not drawn",
}


def failed_table(summary: pd.DataFrame) -> Grid:
    failed = summary[summary["status"] != OK]
    rows = [[str(r["run"]), str(r["status"]), _message(r.get("message"))]
            for _, r in failed.iterrows()]
    return Grid(["run", "status", "message"], rows)


def _message(message: Any) -> str:
    if empty_cell(message):
        return ""
    text = " ".join(str(message).split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def flagged(summary: pd.DataFrame) -> list[Block]:
    """The failed runs with their message, then one line per flag on runs that finished
    (collapsed: which runs)."""
    blocks: list[Block] = []
    failed = failed_table(summary)
    if failed.rows:
        blocks.append(failed)
    counts: dict[str, list[str]] = {}
    finished = summary[summary["status"] == OK]
    flags = finished["flags"] if "flags" in finished.columns else pd.Series("", finished.index)
    for run, cell in zip(finished["run"], flags, strict=True):
        for flag in [] if empty_cell(cell) else str(cell).split(";"):
            counts.setdefault(flag, []).append(str(run))
    if counts:
        line = "; ".join(f"{flag} {len(runs)} ({FLAG_MEANING.get(flag, flag)})"
                         for flag, runs in counts.items())
        rows = [[flag, ", ".join(runs)] for flag, runs in counts.items()]
        blocks.append(Details(f"Flags on finished runs: {line}",
                              [Grid(["flag", "runs"], rows)]))
    return blocks or [Para("No run failed or was flagged.")]
