"""Two results folders, old vs new: which runs got faster or slower, and the kernels, kernel
categories and NVTX ranges that account for the change.

    python -m analysis diff OLD NEW -o DIR [--threshold PCT] [--fail-on-slower PCT]
                                           [--pair OLD_RUN=NEW_RUN ...] [--max-repeats N]

OLD and NEW are results folders: a fresh ``results/`` (``<run>/timing/r<i>.json``,
``<run>/times.json``, ``<run>/stats/*.csv``) or a published one (``<sub>/runs/<run>/`` holding
``times.json`` and the stats CSVs, several sub-folders). Runs are matched by name; a name found
in several sub-folders of one side is one run whose processes are pooled (docs/diff.md).

Step times come from the untraced timing processes; a side without them falls back to its
traced ``times.json`` (``*_timing_source: traced``, indicative only). The ratio ``old / new``
and its CI are :func:`analysis.metrics.timing.speedup`'s; the verdict is ``slower`` /
``faster`` only when the two sides' CIs separate AND the change exceeds the run's noise floor,
or every process of one side is slower than every one of the other by more than the threshold
and either side's own spread (:mod:`analysis.outputs.diff_noise`); else ``within noise`` when
the run could have shown a change of the threshold's size, ``inconclusive`` (with the timing
processes that would judge it) when it could not.

Exit status: 0; 1 only with ``--fail-on-slower PCT`` and a run ``slower`` by more than PCT
percent; 2 on unusable input (not a results folder, no summary.csv, no run in common), with a
one-line ``error:`` on stderr.

Writes to DIR: ``runs.csv``, ``provenance.csv``, ``categories.csv``, ``kernels.csv``,
``ranges.csv``, ``modules.csv``, ``summary.md`` (a pull-request comment), ``ratios.png``, and
``rerun.yaml`` when runs are inconclusive: the config fragment that reruns them on each side
with the timing processes that would judge them (``diff_rerun``; at most ``--max-repeats``).

This module is the command and what it writes; its parts, one job each: reading a side
(``diff_load``), matching runs, verdicts and explanations (``diff_verdicts``, the rule in
``diff_noise``), the Markdown (``diff_markdown``) and the figure (``diff_plot``).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

import pandas as pd
import yaml

from analysis.outputs.diff_load import UnusableInput
from analysis.outputs.diff_markdown import DEFAULT_TOP, headline, markdown
from analysis.outputs.diff_rerun import COMMAND, DEFAULT_MAX_REPEATS, FILE, write_rerun
from analysis.outputs.diff_verdicts import (
    DEFAULT_THRESHOLD_PCT,
    compare,
    explanation_csv,
    slower_runs,
    top_range,
)

__all__ = ["DEFAULT_THRESHOLD_PCT", "DEFAULT_TOP", "UnusableInput", "add_arguments", "compare",
           "main", "run", "top_range", "write_diff"]


def write_diff(
    old: Path, new: Path, outdir: Path, fail_on_slower: float | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT, top: int = DEFAULT_TOP,
    pairs: dict[str, str] | None = None, max_repeats: int = DEFAULT_MAX_REPEATS,
) -> int:
    """Write the CSVs, summary.md and ratios.png; 1 when ``fail_on_slower`` (percent) is set
    and a run is ``slower`` by more than that, else 0. Raises :class:`UnusableInput` (exit
    status 2 on the command line) before writing anything when the input cannot be compared."""
    # matplotlib only when drawing: every results command builds this command's parser
    from analysis.outputs.diff_plot import plot_ratios

    diff = compare(Path(old), Path(new), threshold_pct, pairs)
    outdir.mkdir(parents=True, exist_ok=True)
    rerun = write_rerun(diff.runs, outdir, diff.threshold, max_repeats)
    diff.runs.to_csv(outdir / "runs.csv", index=False)
    diff.provenance.to_csv(outdir / "provenance.csv", index=False)
    for part, key in (("categories", "category"), ("kernels", "kernel"), ("ranges", "range"),
                      ("modules", "module")):
        explanation_csv(diff, part, key).to_csv(outdir / f"{part}.csv", index=False)
    (outdir / "summary.md").write_text(markdown(diff, top, rerun))
    plot_ratios(diff.runs, outdir / "ratios.png")
    if fail_on_slower is None:
        return 0
    return 1 if not slower_runs(diff.runs, fail_on_slower).empty else 0


# --- command line -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", type=Path, help="baseline results folder")
    parser.add_argument("new", type=Path, help="results folder to compare with it")
    parser.add_argument("-o", "--outdir", type=Path, required=True)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD_PCT,
                        metavar="PCT", help="smallest change reported as faster/slower, "
                        "however quiet the run (percent, default "
                        f"{DEFAULT_THRESHOLD_PCT:g}); noisier runs need more (docs/diff.md)")
    parser.add_argument("--fail-on-slower", type=float, default=None, metavar="PCT",
                        help="exit 1 when a run is slower (beyond noise) by more than PCT "
                        "percent")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP,
                        help="rows per table in summary.md")
    parser.add_argument("--pair", action="append", default=[], metavar="OLD=NEW",
                        help="also compare run OLD of the old folder with run NEW of the new "
                        "one (repeatable), e.g. a run renamed between the two")
    parser.add_argument("--max-repeats", type=int, default=DEFAULT_MAX_REPEATS, metavar="N",
                        help="most timing processes rerun.yaml asks for, for the runs that "
                        f"are inconclusive (default {DEFAULT_MAX_REPEATS})")


def _pair(text: str) -> tuple[str, str]:
    old, sep, new = text.partition("=")
    if not sep or not old or not new:
        raise ValueError(f"--pair {text!r}: expected OLD_RUN=NEW_RUN")
    return old, new


def run(args: argparse.Namespace) -> int:
    """0; 1 only when --fail-on-slower trips; 2 on unusable input (a one-line ``error:`` on
    stderr) and on any other error (its traceback, then that line): a crash never reads as
    a slowdown."""
    try:
        pairs = dict(_pair(p) for p in args.pair)
        code = write_diff(args.old, args.new, args.outdir, args.fail_on_slower,
                          args.threshold, args.top, pairs, args.max_repeats)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # a bug or an unreadable file: exit 2, never the gate's 1
        traceback.print_exc()
        print(f"error: analysis diff failed ({type(err).__name__}: {err}); no verdict",
              file=sys.stderr)
        return 2
    runs = pd.read_csv(args.outdir / "runs.csv")
    print(f"wrote {args.outdir}: {headline(runs)}")
    rerun = args.outdir / FILE
    if rerun.is_file():  # the advice, one step to follow
        keys = yaml.safe_load(rerun.read_text())
        print(f"{len(keys['select'])} run(s) to rerun with {keys['timing']['repeats']} timing "
              f"processes a side: {COMMAND.format(config='CONFIG', fragment=rerun)} on each "
              "side (CONFIG: the side's config), then diff again")
    for presence, title in (("old_only", "only in old"), ("new_only", "only in new")):
        names = list(runs.loc[runs["presence"] == presence, "run"])
        if names:
            print(f"{title} ({len(names)}): {', '.join(names)}")
    if code:
        print(f"slower by more than {args.fail_on_slower:g}%: "
              + ", ".join(slower_runs(runs, args.fail_on_slower)["run"]), file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
