"""Command line: ``python -m analysis COMMAND ...``.

Per run (one export): ``stats`` (the seven nsys reports), ``extras`` (what nsys lacks)
and ``all`` (both, reading the export once: what the pipeline runs); ``ops`` (the operator
table of an op capture); ``memory`` (the memory view of a memory capture); ``ranks`` (one
distributed run's per-rank exports together);
``trace`` (a Perfetto trace and a timeline figure of the measured steps).
Across runs:
``compare`` (A vs B captures), ``aggregate`` (summary.csv), ``speedup`` (untraced A vs B
with CI), ``ladders``, ``findings``, ``plots`` (the report's figures), ``overview``
(SUMMARY.md, the report's front page), ``distributed`` (scaling and communication across
distributed runs) and ``diff`` (two results folders).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from analysis.metrics.extras import RunInputs, write_extras
from analysis.outputs import memory
from analysis.outputs.compare import compare, format_table
from analysis.reading import Export, ExportError
from analysis.reports import REPORTS
from analysis.reports.nsys_stats import Context, prepare_reading, run_reports

# Commands whose options live in modules that import pandas (~0.3 s): their parsers are
# built only when one of them is asked for, so a per-export command starts without pandas.
PANDAS_COMMANDS = ("aggregate", "diff")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI; ``command`` (the first argument) decides whether the pandas-backed commands
    get their full options (None: all of them, as for ``--help``)."""
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
        if name != "stats":
            sp.add_argument(
                "--record", type=Path, default=None,
                help="the run's result record (times.json): model size, and graph_phases of "
                "a whole-step CUDA graph (docs/analysis.md)",
            )
            sp.add_argument(
                "--torch-trace", type=Path, default=None, metavar="DIR",
                help="TORCH_TRACE folder of the capture: maps compiled kernels to their ATen "
                "ops and model code (writes kernel_map.csv)",
            )
        sp.add_argument("--timings", action="store_true", help="print per-step seconds")
        sp.add_argument(
            "--nsys-version",
            choices=("2025", "2024"),
            default="2025",
            help="reproduce nsys 2025.3.1 (default, the reference) or 2024.2.3 output: "
            "they differ in NVTX range names and in round() of Avg/Med/StdDev",
        )
    op = sub.add_parser("ops", help="operator table of an op capture: ops.csv, "
                        "ops_by_shape.csv, ops_metrics.json")
    op.set_defaults(handler=run_ops)
    op.add_argument("export", type=Path, help="nsys SQLite export of the op capture")
    op.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    op.add_argument("--times", type=Path, default=None,
                    help="the op capture's result record (status, traced step times)")
    op.add_argument("--lean-times", type=Path, default=None,
                    help="the lean capture's result record: the op ranges' overhead")
    cp = sub.add_parser("compare", help="A vs B per category and NVTX range")
    cp.set_defaults(handler=run_compare)
    cp.add_argument("a", type=Path, help="A: .sqlite export, run folder or its stats folder")
    cp.add_argument("b", type=Path, help="B: .sqlite export, run folder or its stats folder")
    cp.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    memory.add_command(sub)
    rk = sub.add_parser("ranks", help="one distributed run across its ranks' exports")
    rk.set_defaults(handler=run_ranks)
    rk.add_argument("exports", type=Path, nargs="+", help="each rank's export, in rank order")
    rk.add_argument("--times", type=Path, required=True, help="the run's times.json (status)")
    rk.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    add_trace_command(sub)
    add_results_commands(sub, full=command is None or command in PANDAS_COMMANDS
                         or command.startswith("-"))
    return p


def add_trace_command(sub: argparse._SubParsersAction) -> None:
    """``trace``: a Perfetto trace and a timeline figure of a run's measured steps."""
    tr = sub.add_parser("trace", help="Perfetto trace of the measured steps (open it in "
                        "ui.perfetto.dev) and the timeline figure of one step")
    tr.set_defaults(handler=run_trace)
    tr.add_argument("exports", type=Path, nargs="*",
                    help="nsys SQLite export; a distributed run: each rank's, in rank order "
                    "(none: the captures are gone; a trace in the output folder is kept)")
    tr.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    tr.add_argument("--steps", default="median",
                    help="measured steps in the trace (0-based): median (default: the median "
                    "step and the next), all, N or A-B")
    tr.add_argument("--record", type=Path, default=None,
                    help="the run's result record (times.json): status, graph_phases, layers")
    tr.add_argument("--torch-trace", type=Path, default=None, metavar="DIR",
                    help="TORCH_TRACE folder of the capture: compiled kernels' layers, modules")
    tr.add_argument("--name", default=None,
                    help="the figure's title (default: the export's folder name)")


def run_trace(args: argparse.Namespace) -> int:
    from analysis.outputs.trace import run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
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
            write_extras(ex, args.output, ctx, RunInputs.load(args.record, args.torch_trace))
            timings["extras"] = time.perf_counter() - t
    if args.timings:
        for name, secs in timings.items():
            print(f"{name:24s} {secs:8.3f} s")
        print(f"{'total':24s} {time.perf_counter() - t0:8.3f} s")
    return 0


def run_ops(args: argparse.Namespace) -> int:
    """``ops``: the operator table and its metrics (a failed op capture: empty tables)."""
    from analysis.metrics import ops

    record = _record(args.times)
    lean = _record(args.lean_times)
    status = str(record.get("status", "ok")) if args.times else "ok"
    args.output.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, object] = {
        "op_ranges": (record.get("params") or {}).get("op_ranges"),
        "ops_status": status,
        "ops_message": record.get("message") or None,
    }
    if status == "ok":
        with Export(args.export) as ex:
            metrics.update(ops.write_op_tables(ex, args.output))
        metrics.update(ops.op_capture_overhead(_step_ms(record), _step_ms(lean)))
    else:  # nothing to read: the tables stay empty, the status says why
        ops.write_csv([], ops.COLUMNS, args.output / "ops.csv")
        ops.write_csv([], ops.SHAPE_COLUMNS, args.output / "ops_by_shape.csv")
    (args.output / "ops_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"{args.export}: op capture {status}, overhead {metrics.get('ops_overhead')}")
    return 0


def _record(path: Path | None) -> dict:
    try:
        return json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        return {"status": "error", "message": f"no readable result record {path}"}


def _step_ms(record: dict) -> list[float]:
    if record.get("status", "ok") != "ok":
        return []
    return list(record.get("step_ms") or record.get("step_times_ms") or [])


def run_compare(args: argparse.Namespace) -> int:
    print(format_table(compare(args.a, args.b, args.output)))
    return 0


def run_ranks(args: argparse.Namespace) -> int:
    from analysis.outputs.ranks import write_rank_analysis

    metrics = write_rank_analysis(args.exports, args.times, args.output)
    print(f"{len(args.exports)} ranks: {metrics.get('status')}, exposed communication "
          f"{metrics.get('exposed_comm_ms')} ms/step, overlap {metrics.get('overlap')}, "
          f"latest rank {metrics.get('straggler_rank')} by {metrics.get('straggler_ms')} ms")
    return 0


def add_results_commands(sub: argparse._SubParsersAction, full: bool = True) -> None:
    """Commands over a results folder (the pipeline's outputs across runs); without ``full``,
    aggregate and diff are listed but not given their options."""
    ag = sub.add_parser("aggregate", help="summary.csv: one row per run")
    if full:
        from analysis.outputs import aggregate

        aggregate.add_arguments(ag)
        ag.set_defaults(handler=aggregate.run)
    sp = sub.add_parser("speedup", help="untraced speed-up of run B over run A, with its CI")
    sp.set_defaults(handler=run_speedup)
    sp.add_argument("a", type=Path, help="baseline run folder (with timing/r*.json)")
    sp.add_argument("b", type=Path, help="candidate run folder")
    sp.add_argument("-o", "--output", type=Path, required=True, help="CSV to write")
    ld = _over_results(sub, "ladders", "one table per optimization ladder", run_ladders,
                       "output folder")
    ld.add_argument("--plan", type=Path, default=None, help="plan.json (default: in results)")
    _over_results(sub, "findings", "rules over the statistics, with measured gains",
                  run_findings, "CSV to write")
    pl = sub.add_parser("plots", help="the report's figures (PNG)")
    pl.set_defaults(handler=run_plots)
    pl.add_argument("--summary", type=Path, required=True, help="summary.csv (aggregate)")
    pl.add_argument("--results", type=Path, required=True, help="results folder")
    pl.add_argument("-o", "--output", type=Path, required=True, help="folder for the PNGs")
    pl.add_argument("--jobs", type=int, default=1,
                    help="figures drawn at once, each by a process of its own (default 1)")
    ov = sub.add_parser("overview", help="SUMMARY.md (+ overview.html): the answer first")
    ov.set_defaults(handler=run_overview)
    ov.add_argument("--results", type=Path, required=True, help="results folder")
    ov.add_argument("-o", "--output", type=Path, required=True, help="Markdown to write")
    ov.add_argument("--html", type=Path, default=None, help="also a self-contained HTML page")
    ov.add_argument("--rst", type=Path, default=None,
                    help="also the Snakemake report's landing text (reStructuredText)")
    ds = _over_results(sub, "distributed", "distributed.csv: scaling, exposed communication, "
                       "stragglers, bandwidth; and its figures", run_distributed, "CSV to write")
    ds.add_argument("--plots", type=Path, default=None, help="folder for its figures")
    hs = sub.add_parser("history", help="a system's history.csv: results folders' runs by "
                        "commit, and the headline rungs over commits (PNG)")
    hs.set_defaults(handler=run_history)
    hs.add_argument("results", type=Path, nargs="+", help="results folders to add")
    hs.add_argument("--system", required=True, help="the system's name, e.g. h100")
    hs.add_argument("--config", required=True, help="the config the folders ran, e.g. standard")
    hs.add_argument("-o", "--output", type=Path, required=True, help="history CSV to update")
    hs.add_argument("--plot", type=Path, default=None, help="also draw the headline rungs")
    hs.add_argument("--plot-configs", nargs="+", default=None,
                    help="the configs the figure shows (default: all in the history)")
    df = sub.add_parser("diff", help="two results folders, run by run, with the ranges why")
    if full:
        from analysis.outputs import diff

        diff.add_arguments(df)
        df.set_defaults(handler=diff.run)


def _over_results(sub: argparse._SubParsersAction, name: str, helptext: str, handler,
                  output_help: str) -> argparse.ArgumentParser:
    """A command reading a results folder (and its summary.csv) and writing ``-o``."""
    parser = sub.add_parser(name, help=helptext)
    parser.set_defaults(handler=handler)
    parser.add_argument("--results", type=Path, required=True, help="results folder")
    parser.add_argument("--summary", type=Path, default=None,
                        help="summary.csv (default: in results)")
    parser.add_argument("-o", "--output", type=Path, required=True, help=output_help)
    return parser


def _summary(args: argparse.Namespace):  # -> pd.DataFrame; pandas is imported lazily
    import pandas as pd

    return pd.read_csv(args.summary or args.results / "summary.csv")


def run_speedup(args: argparse.Namespace) -> int:
    from analysis.outputs.speedup import write_speedup

    row = write_speedup(args.a, args.b, args.output)
    print(f"{row['candidate']} vs {row['baseline']}: {row['verdict'] or row['status']}")
    return 0


def run_ladders(args: argparse.Namespace) -> int:
    from analysis.outputs.ladders import write_ladders
    from analysis.outputs.runs import read_json, read_plan

    plan = read_json(args.plan) if args.plan else read_plan(args.results)
    for path in write_ladders(args.results, plan, _summary(args), args.output):
        print(f"wrote {path}")
    return 0


def run_findings(args: argparse.Namespace) -> int:
    from analysis.outputs.findings import find_all, findings_table

    found = find_all(args.results, _summary(args))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    findings_table(found).to_csv(args.output, index=False)
    print(f"wrote {args.output}: {len(found)} findings")
    return 0


def run_distributed(args: argparse.Namespace) -> int:
    from analysis.outputs.distributed import write_distributed

    table = write_distributed(args.results, _summary(args), args.output, args.plots)
    print(f"wrote {args.output}: {len(table)} runs")
    return 0


def run_plots(args: argparse.Namespace) -> int:
    from analysis.outputs.figures import write_figures  # pandas + matplotlib: ~1 s of imports

    paths = write_figures(args.summary, args.results, args.output, args.jobs)
    print(f"wrote {len(paths)} figures to {args.output}")
    return 0


def run_history(args: argparse.Namespace) -> int:
    from analysis.outputs.history import plot_history, update_history

    history = update_history(args.output, [(r, args.system, args.config) for r in args.results])
    print(f"wrote {args.output}: {len(history)} rows")
    if args.plot:
        plot_history(history, args.plot, args.plot_configs)
    return 0


def run_overview(args: argparse.Namespace) -> int:
    from analysis.outputs.overview import key_figures, write_overview

    write_overview(args.results, args.output, args.html, key_figures(args.results), args.rst)
    return 0
