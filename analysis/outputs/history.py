"""A system's results over commits: `published/<system>/history.csv` and its figure.

A config folder holds one run of the pipeline at one commit; when it is replaced by a newer
one, its numbers stay here, one row per run per commit, with the provenance that says which
code and software made them. The figure follows each ladder's first rung and its fastest
over the commits.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from analysis.outputs.runs import OK, read_json

# What a history row keeps of a summary row: what ran, its untraced time, what made it.
NUMBERS = ("step_ms", "step_ci_low_ms", "step_ci_high_ms", "tflops", "mfu", "tokens_per_s",
           "samples_per_s")
RUN_KEYS = ("workload", "status", "ladder", "ladder_group", "rung_index", "rung",
            "device_name", "torch")
COLUMNS = ("system", "config", "commit", "date", "run", *RUN_KEYS, *NUMBERS, "source")


def _provenance(run_dir: Path) -> dict:
    """The run's provenance from its capture's record, else from a timing record."""
    for path in (run_dir / "times.json", run_dir / "timing" / "r0.json"):
        record = read_json(path)
        if record and record.get("provenance"):
            return record["provenance"]
    return {}


def history_rows(results: Path, system: str, config: str, source: str | None = None
                 ) -> pd.DataFrame:
    """One row per run of a results folder (its summary.csv), with the commit and date that
    made it: the summary's provenance columns, else the run's own records."""
    summary = pd.read_csv(results / "summary.csv")
    rows = []
    for _, row in summary.iterrows():
        commit, date = row.get("provenance_git_commit"), row.get("provenance_date")
        if pd.isna(commit) or pd.isna(date):
            found = _provenance(results / str(row["run"]))
            commit = found.get("git_commit") if pd.isna(commit) else commit
            date = found.get("date") if pd.isna(date) else date
        rows.append({"system": system, "config": config, "commit": commit, "date": date,
                     "run": row["run"], **{k: row.get(k) for k in RUN_KEYS + NUMBERS},
                     "source": source or str(results)})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def merge_history(history: pd.DataFrame | None, new: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """The history with the new rows: one row per (config, run, commit), the latest made."""
    frames = [f for f in ([history] if history is not None else []) + list(new) if len(f)]
    merged = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    # a row whose records carry no provenance cannot be placed among the commits
    merged = merged[merged["commit"].notna() & merged["date"].notna()]
    merged = merged.sort_values(["date", "config", "run"], kind="stable")
    merged = merged.drop_duplicates(["config", "run", "commit"], keep="last")
    return merged.reset_index(drop=True)[list(COLUMNS)]


def update_history(path: Path, folders: Iterable[tuple[Path, str, str]]) -> pd.DataFrame:
    """Add (results folder, system, config) to the history CSV at `path`; return it."""
    old = pd.read_csv(path) if path.exists() else None
    merged = merge_history(old, [history_rows(r, s, c) for r, s, c in folders])
    path.parent.mkdir(parents=True, exist_ok=True)
    merged.to_csv(path, index=False)
    return merged


def _ladder_key(row: pd.Series) -> str:
    """A ladder's name with its group (e.g. gpt_train at size small vs 2.7B)."""
    group = row.get("ladder_group")
    if pd.isna(group) or group in ("", "all"):  # "all": a ladder over one configuration
        return str(row["ladder"])
    return f"{row['ladder']} {group}"


def headline_rungs(history: pd.DataFrame) -> pd.DataFrame:
    """Each ladder's first rung and its fastest at the latest commit, at every commit."""
    ok = history[history["status"].eq(OK) & history["ladder"].notna() & history["step_ms"].notna()]
    ok = ok.assign(ladder_key=ok.apply(_ladder_key, axis=1) if len(ok) else [])
    picked = []
    for _, rows in ok.groupby(["config", "ladder_key"]):
        latest = rows[rows["commit"].eq(rows.loc[rows["date"].idxmax(), "commit"])]
        first = latest.loc[latest["rung_index"].idxmin(), "rung"]
        best = latest.loc[latest["step_ms"].idxmin(), "rung"]
        picked.append(rows[rows["rung"].isin({first, best})])
    return pd.concat(picked) if picked else ok.iloc[0:0]


def plot_history(history: pd.DataFrame, path: Path, configs: Iterable[str] | None = None
                 ) -> Path:
    """Step time of the headline rungs over the commits, a panel per ladder (linear ms), for
    the given configs (default: all)."""
    from analysis.outputs import style

    if configs is not None:
        history = history[history["config"].isin(list(configs))]
    rungs = headline_rungs(history)
    if rungs.empty:
        return plot_repeated_runs(history, path)
    ladders = sorted(set(zip(rungs["config"], rungs["ladder_key"], strict=True)))
    # a column per headline rung, each on its own linear axis: the first rung is often 10-20x
    # the best, which would flatten the best's line on a shared one
    fig, axes = style.figure(nrows=len(ladders), ncols=2, height=2.2 * len(ladders))
    for row_axes, (config, ladder) in zip(axes, ladders, strict=True):
        rows = rungs[rungs["config"].eq(config) & rungs["ladder_key"].eq(ladder)]
        commits = rows.groupby("commit", as_index=False)["date"].min().sort_values("date")
        x = {c: i for i, c in enumerate(commits["commit"])}
        labels = [f"{c[:7]}\n{d[5:10]}" for c, d in zip(commits["commit"], commits["date"],
                                                        strict=True)]
        order = rows.sort_values("rung_index")["rung"].unique()
        for ax, rung, color in zip(row_axes, order, ("#8C8C8C", style.MEASURED_COLOR),
                                   strict=False):
            line = rows[rows["rung"].eq(rung)].sort_values("date")
            ax.errorbar([x[c] for c in line["commit"]], line["step_ms"],
                        yerr=[line["step_ms"] - line["step_ci_low_ms"],
                              line["step_ci_high_ms"] - line["step_ms"]],
                        marker="o", capsize=3, color=color)
            ax.set_xticks(range(len(x)), labels, fontsize=7)
            ax.set_xlim(-0.5, len(x) - 0.5)
            ax.set_ylim(0, 1.15 * float(line["step_ci_high_ms"].fillna(line["step_ms"]).max()))
            ax.set_ylabel("step ms", fontsize=8)
            ax.set_title(f"{config} · {ladder} · {rung}", loc="left", fontsize=9)
        for ax in row_axes[len(order):]:
            ax.set_axis_off()
    return style.save(fig, path, "Headline rungs' untraced step time (median, 95% CI) over "
                      "the commits that published them")


def repeated_runs(history: pd.DataFrame) -> pd.DataFrame:
    """The finished runs published at more than one commit (a config without ladders)."""
    ok = history[history["status"].eq(OK) & history["step_ms"].notna()]
    commits = ok.groupby(["config", "run"])["commit"].transform("nunique")
    return ok[commits > 1]


def plot_repeated_runs(history: pd.DataFrame, path: Path) -> Path:
    """Step time over the commits of every run published more than once, a panel per config
    (log ms: runs of different sizes share it)."""
    from analysis.outputs import style

    title = "Runs over commits"
    rows = repeated_runs(history)
    if rows.empty:
        return style.empty_figure(path, title, "no run published at more than one commit")
    configs = sorted(rows["config"].unique())
    fig, axes = style.figure(nrows=len(configs), height=3.2 * len(configs))
    for ax, config in zip(axes[:, 0], configs, strict=True):
        mine = rows[rows["config"].eq(config)]
        commits = mine.groupby("commit", as_index=False)["date"].min().sort_values("date")
        x = {c: i for i, c in enumerate(commits["commit"])}
        colors = style.palette_colors(sorted(mine["run"].unique()))
        for run, line in mine.groupby("run"):
            line = line.sort_values("date")
            ax.errorbar([x[c] for c in line["commit"]], line["step_ms"],
                        yerr=[line["step_ms"] - line["step_ci_low_ms"],
                              line["step_ci_high_ms"] - line["step_ms"]],
                        marker="o", capsize=3, color=colors[run], label=run)
        ax.set_xticks(range(len(x)), [f"{c[:7]}\n{d[5:10]}" for c, d in
                                      zip(commits["commit"], commits["date"], strict=True)],
                      fontsize=7)
        ax.set_xlim(-0.5, len(x) - 0.5)
        ax.set_yscale("log")
        style.log_axis(ax.yaxis)
        ax.set_ylabel("step ms (log)", fontsize=8)
        ax.set_title(f"{config}: untraced step (median, 95% CI) of each run published "
                     "more than once", loc="left", fontsize=9)
        style.legend_beside(ax)
    return style.save(fig, path, "Untraced step time over the commits that published them")

