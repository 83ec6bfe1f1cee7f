"""Command line: ``python -m analysis {stats,extras,all,compare,aggregate,plots} ...``.

Per run (one export): ``stats`` (the seven nsys reports), ``extras`` (what nsys lacks)
and ``all`` (both, reading the export once: what the pipeline runs).  Across runs:
``compare`` (A vs B), ``aggregate`` (summary.csv) and ``plots`` (the report's figures).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analysis.metrics.extras import write_extras
from analysis.outputs.compare import compare, format_table
from analysis.reading import Export, ExportError
from analysis.reports import REPORTS
from analysis.reports.nsys_stats import Context, prepare_reading, run_reports


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m analysis", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("stats", "the 7 nsys stats reports as CSV"),
        ("extras", "categories, tensor cores, occupancy, utilization CSVs + metrics.json"),
        ("all", "stats and extras in one pass"),
    ):
        sp = sub.add_parser(name, help=helptext)
        sp.set_defaults(handler=run_one_export)
        sp.add_argument("export", type=Path, help="nsys SQLite export")
        sp.add_argument("-o", "--output", type=Path, required=True, help="output folder")
        if name == "stats":
            sp.add_argument(
                "--report",
                action="append",
                choices=REPORTS,
                metavar="REPORT",
                help=f"only this report (repeatable); default: all seven ({', '.join(REPORTS)})",
            )
        sp.add_argument("--timings", action="store_true", help="print per-step seconds")
        sp.add_argument(
            "--nsys-version",
            choices=("2025", "2024"),
            default="2025",
            help="reproduce nsys 2025.3.1 (default, the reference) or 2024.2.3 output: "
            "they differ in NVTX range names and in round() of Avg/Med/StdDev",
        )
    cp = sub.add_parser("compare", help="A vs B per category and NVTX range")
    cp.set_defaults(handler=run_compare)
    cp.add_argument("a", type=Path, help="A: .sqlite export or run folder with profile.sqlite")
    cp.add_argument("b", type=Path, help="B: .sqlite export or run folder with profile.sqlite")
    cp.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    ap = sub.add_parser("aggregate", help="summary.csv: one row per run")
    ap.set_defaults(handler=run_aggregate)
    ap.add_argument("--results", type=Path, required=True, help="results folder")
    ap.add_argument("--runs", nargs="+", required=True, help="run names (folders in it)")
    ap.add_argument("-o", "--output", type=Path, required=True, help="summary CSV to write")
    pp = sub.add_parser("plots", help="the report's PNG figures")
    pp.set_defaults(handler=run_plots)
    pp.add_argument("--summary", type=Path, required=True, help="summary.csv (aggregate)")
    pp.add_argument("--results", type=Path, required=True, help="results folder")
    pp.add_argument("-o", "--outdir", type=Path, required=True, help="folder for the PNGs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def run_one_export(args: argparse.Namespace) -> int:
    """``stats``, ``extras`` or ``all`` on one export."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    args.output.mkdir(parents=True, exist_ok=True)
    with Export(args.export, nsys_version=args.nsys_version) as ex:
        ctx = Context(ex)
        if args.command in ("stats", "all"):
            names = tuple(getattr(args, "report", None) or REPORTS)
            prepare_reading(ex, names, with_extras=args.command == "all")
            for name in names:
                t = time.perf_counter()
                run_reports(ctx, (name,))[name].write(args.output / f"{name}.csv")
                timings[name] = time.perf_counter() - t
        if args.command in ("extras", "all"):
            t = time.perf_counter()
            write_extras(ex, args.output, ctx)
            timings["extras"] = time.perf_counter() - t
    if args.timings:
        for name, secs in timings.items():
            print(f"{name:24s} {secs:8.3f} s")
        print(f"{'total':24s} {time.perf_counter() - t0:8.3f} s")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    print(format_table(compare(args.a, args.b, args.output)))
    return 0


def run_aggregate(args: argparse.Namespace) -> int:
    from analysis.outputs.aggregate import write_summary  # pandas: only these two need it

    table = write_summary(args.results, args.runs, args.output)
    print(f"wrote {args.output}: {len(table)} runs x {len(table.columns)} columns")
    return 0


def run_plots(args: argparse.Namespace) -> int:
    from analysis.outputs.plots import write_plots  # pandas + matplotlib: ~1 s of imports

    paths = write_plots(args.summary, args.results, args.outdir)
    print(f"wrote {len(paths)} plots to {args.outdir}")
    return 0
