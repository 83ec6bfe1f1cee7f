"""Command line: ``python -m analysis {stats,extras,all,compare} ...``."""

from __future__ import annotations

import sys
import time

from analysis.errors import ExportError

TYPE_CHECKING = False  # argparse/pathlib/typing are imported only where needed (start-up)
if TYPE_CHECKING:
    import argparse


RESULTS_COMMANDS = ("aggregate", "speedup", "ladders", "findings", "overview", "plots")


def _parser() -> argparse.ArgumentParser:
    import argparse
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m analysis", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("stats", "the 7 nsys stats reports as CSV"),
        ("extras", "categories, tensor cores, occupancy, utilization CSVs + metrics.json"),
        ("all", "stats and extras in one pass"),
    ):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("export", type=Path, help="nsys SQLite export")
        sp.add_argument("-o", "--output", type=Path, required=True, help="output folder")
        if name == "stats":
            sp.add_argument(
                "--report",
                action="append",
                default=None,
                help="only this report (repeatable); default: all seven",
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
    cp.add_argument("a", type=Path, help="A: .sqlite export or run folder with profile.sqlite")
    cp.add_argument("b", type=Path, help="B: .sqlite export or run folder with profile.sqlite")
    cp.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    _results_commands(sub)
    return p


def _results_commands(sub: argparse._SubParsersAction) -> None:
    """Commands over a results folder (the pipeline's outputs across runs)."""
    from pathlib import Path

    from analysis.outputs import aggregate

    ag = sub.add_parser("aggregate", help="summary.csv: one row per run")
    aggregate.add_arguments(ag)
    sp = sub.add_parser("speedup", help="untraced speed-up of run B over run A, with its CI")
    sp.add_argument("a", type=Path, help="baseline run folder (with timing/r*.json)")
    sp.add_argument("b", type=Path, help="candidate run folder")
    sp.add_argument("-o", "--output", type=Path, required=True, help="CSV to write")
    ld = sub.add_parser("ladders", help="one table per optimization ladder")
    ld.add_argument("--results", type=Path, required=True)
    ld.add_argument("--plan", type=Path, default=None)
    ld.add_argument("--summary", type=Path, default=None)
    ld.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    fd = sub.add_parser("findings", help="rules over the statistics, with measured gains")
    fd.add_argument("--results", type=Path, required=True)
    fd.add_argument("--summary", type=Path, default=None)
    fd.add_argument("-o", "--output", type=Path, required=True, help="CSV to write")
    ov = sub.add_parser("overview", help="SUMMARY.md (+ overview.html): the answer first")
    ov.add_argument("--results", type=Path, required=True)
    ov.add_argument("-o", "--output", type=Path, required=True, help="Markdown to write")
    ov.add_argument("--html", type=Path, default=None, help="also a self-contained HTML page")
    pl = sub.add_parser("plots", help="the report's figures")
    pl.add_argument("--summary", type=Path, required=True)
    pl.add_argument("--results", type=Path, required=True)
    pl.add_argument("-o", "--output", type=Path, required=True, help="output folder")


def _run_results_command(args: argparse.Namespace) -> int:
    import pandas as pd

    from analysis.outputs.runs import read_json, read_plan

    if args.command == "aggregate":
        from analysis.outputs import aggregate

        return aggregate.run(args)
    if args.command == "speedup":
        from analysis.outputs.speedup import write_speedup

        row = write_speedup(args.a, args.b, args.output)
        print(f"{row['candidate']} vs {row['baseline']}: {row['verdict'] or row['status']}")
        return 0
    summary_path = getattr(args, "summary", None) or args.results / "summary.csv"
    if args.command == "ladders":
        from analysis.outputs.ladders import write_ladders

        plan = read_json(args.plan) if args.plan else read_plan(args.results)
        for path in write_ladders(args.results, plan, pd.read_csv(summary_path), args.output):
            print(f"wrote {path}")
        return 0
    if args.command == "findings":
        from analysis.outputs.findings import find_all, findings_table

        found = find_all(args.results, pd.read_csv(summary_path))
        args.output.parent.mkdir(parents=True, exist_ok=True)
        findings_table(found).to_csv(args.output, index=False)
        print(f"wrote {args.output}: {len(found)} findings")
        return 0
    if args.command == "overview":
        from analysis.outputs.overview import KEY_FIGURES, write_overview

        figures = [args.results / "plots" / f"{n}.png" for n in KEY_FIGURES]
        write_overview(args.results, args.output, args.html, [f for f in figures if f.is_file()])
        return 0
    from analysis.outputs import plots

    plots.main(["--summary", str(args.summary), "--results", str(args.results),
                "-o", str(args.output)])
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    fast = _lite_args(argv)
    try:
        if fast is not None:
            return _run_lite(*fast)
        return _run(_parser().parse_args(argv))
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _lite_args(argv: list[str]) -> tuple[str, str, list[str], str, bool] | None:
    """``stats EXPORT -o DIR --report R ...`` with only numpy-free reports, parsed without
    argparse (its import alone costs a fifth of such a run); None for anything else
    (other commands, other reports, help, errors), which goes through argparse.
    """
    if len(argv) < 2 or argv[0] != "stats":
        return None
    export = output = None
    reports: list[str] = []
    version, timings = "2025", False
    it = iter(argv[1:])
    for arg in it:
        opt, eq, val = arg.partition("=")
        if opt in ("-o", "--output", "--report", "--nsys-version"):
            if not eq:
                val = next(it, None)  # type: ignore[assignment]
                if val is None:
                    return None
            if opt == "--report":
                reports.append(val)
            elif opt == "--nsys-version":
                version = val
            else:
                output = val
        elif arg == "--timings":
            timings = True
        elif arg.startswith("-") or export is not None:
            return None
        else:
            export = arg
    from analysis.lite import LITE_REPORTS

    if (
        export is None
        or output is None
        or not reports
        or not set(reports) <= LITE_REPORTS
        or version not in ("2025", "2024")
    ):
        return None
    return export, output, reports, version, timings


def _run(args: argparse.Namespace) -> int:
    import os

    from analysis.lite import LITE_REPORTS

    # numpy's OpenBLAS would start a thread pool at import (~60 ms on 2 cores); nothing
    # here uses BLAS
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(var, "1")

    if args.command == "stats" and args.report and set(args.report) <= LITE_REPORTS:
        return _run_lite(
            str(args.export), str(args.output), args.report, args.nsys_version, args.timings
        )
    if args.command in RESULTS_COMMANDS:
        return _run_results_command(args)
    from analysis.export import Export

    if args.command == "compare":
        from analysis.outputs.compare import compare, format_table

        result = compare(args.a, args.b, args.output)
        print(format_table(result))
        return 0
    args.output.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with Export(args.export, nsys_version=args.nsys_version) as ex:
        timings: dict[str, float] = {}
        if args.command in ("stats", "all"):
            from analysis.nsys_stats import NEEDS_RUNTIME, REPORTS, Context, run_reports

            names = tuple(args.report) if getattr(args, "report", None) else REPORTS
            unknown = [n for n in names if n not in REPORTS]
            if unknown:
                print(f"error: unknown report(s): {', '.join(unknown)}", file=sys.stderr)
                return 2
            ctx = Context(ex)
            ex.prefer_full = len(names) > 1 or args.command == "all"
            # the API table goes to a second process whenever this one has other tables to
            # read meanwhile (projection reports also need kernels and NVTX)
            wanted = set(names)
            if (
                wanted & {"nvtx_kern_sum", "nvtx_gpu_proj_sum"}
                or (ex.prefer_full and wanted & NEEDS_RUNTIME)
                or args.command == "all"
            ):
                ex.prefetch_runtime()
            for name in names:
                t = time.perf_counter()
                table = run_reports(ctx, (name,))[name]
                table.write(args.output / f"{name}.csv")
                timings[name] = time.perf_counter() - t
        if args.command in ("extras", "all"):
            from analysis.metrics.gpu import write_extras

            t = time.perf_counter()
            write_extras(ex, args.output, ctx if args.command == "all" else None)
            timings["extras"] = time.perf_counter() - t
    if args.timings:
        for name, secs in timings.items():
            print(f"{name:24s} {secs:8.3f} s")
        print(f"{'total':24s} {time.perf_counter() - t0:8.3f} s")
    return 0


def _run_lite(export: str, output: str, reports: list[str], version: str, timings: bool) -> int:
    """Small reports only: no numpy import (they finish before numpy would load)."""
    import os

    from analysis.lite import run_lite

    t0 = time.perf_counter()
    os.makedirs(output, exist_ok=True)
    for name, table in run_lite(export, reports, version).items():
        table.write(os.path.join(output, f"{name}.csv"))
    if timings:
        print(f"{'total':24s} {time.perf_counter() - t0:8.3f} s")
    return 0
