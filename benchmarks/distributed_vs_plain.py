"""A finished results folder's GPT train runs beside a plain torchrun script of the same step,
on the same machine: the pipeline's untraced step over the plain script's, per run.

    # after `snakemake --cores 4 --configfile config/distributed.yaml` on this machine
    python benchmarks/distributed_vs_plain.py --results results-distributed --rounds 3 \\
        --no-sync --csv plain.csv --json plain.json
    # the plain script's own launch-to-launch spread: 6 launches of one run
    python benchmarks/distributed_vs_plain.py --results results-distributed \\
        --runs gpt_2.7B_ddp2 --rounds 6
    # what it would run; the table again from plain numbers measured before
    python benchmarks/distributed_vs_plain.py --results published/h200x4/distributed --dry-run
    python benchmarks/distributed_vs_plain.py --results published/h200x4/distributed \\
        --plain-json plain.json

Every GPT train run of the folder's plan.json (the distributed runs and their one-GPU
baselines) gets benchmarks/plain_distributed.py with the same model size, batch per rank,
context, vocabulary, dtype, attention backend, parallel mode, GPUs, DDP bucket size and FSDP
resharding, under torchrun (one process for a one-GPU run), with the plain script's own
warm-up and steps (``--warmup``, ``--steps``). Rounds interleave the runs (each run once, then
again), so a drift of the machine reaches every run alike. Nothing of the pipeline is timed
again: its untraced step, CI, per-process medians and traced step are read from the folder
(summary.csv, <run>/timing/r*.json). A compiled run or one with another optimizer has no
plain counterpart and is left out, with the reason.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PLAIN = REPO / "benchmarks" / "plain_distributed.py"
sys.path.insert(0, str(REPO))

from analysis.metrics.host import HOST_BOUND_SHARE, host_bound_share  # noqa: E402
from analysis.outputs.runs import read_timing  # noqa: E402
from pipeline.launch import NCCL_ENV  # noqa: E402

# The pipeline's acceptance for its untraced step against the plain script's.
WITHIN = 0.05


def workload_options(params: dict[str, Any]) -> dict[str, Any]:
    """Every option of the workload a run's parameters (plan.json) start, defaults included:
    its command line as the pipeline writes it, read by the workload's own parser."""
    from pipeline.config import workload_args
    from workloads.__main__ import build_parser

    return vars(build_parser().parse_args(shlex.split(workload_args(params))))


@dataclass
class PipelineRun:
    """One run of a results folder: its workload options and untraced numbers."""

    name: str
    options: dict[str, Any]
    step_ms: float | None = None
    ci_ms: tuple[float, float] | None = None
    process_ms: list[float] = field(default_factory=list)
    traced_ms: float | None = None
    params_count: int | None = None
    host_bound_share: float | None = None  # analysis/metrics/host.py, from its timing records

    def get(self, key: str) -> Any:
        return self.options.get(key)

    @property
    def gpus(self) -> int:
        return int(self.get("gpus"))


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text not in (None, "") else None
    except ValueError:
        return None
    return value if value == value else None  # NaN: no number


def read_results(folder: Path) -> list[PipelineRun]:
    """The GPT train runs of a results folder, in plan order, with their untraced numbers."""
    plan = json.loads((folder / "plan.json").read_text())
    rows = {}
    if (folder / "summary.csv").exists():
        with open(folder / "summary.csv", newline="") as f:
            rows = {row["run"]: row for row in csv.DictReader(f)}
    runs = []
    for name, entry in plan["runs"].items():
        params = entry["params"]
        if params.get("workload") != "gpt" or params.get("mode") != "train":
            continue
        row = rows.get(name, {})
        timing = read_timing(folder / name).ok_records  # its processes that measured, in order
        low, high = _number(row.get("step_ci_low_ms")), _number(row.get("step_ci_high_ms"))
        count = _number(row.get("params_count"))
        ok = row.get("status") == "ok"
        runs.append(PipelineRun(
            name, workload_options(params), step_ms=_number(row.get("step_ms")) if ok else None,
            ci_ms=(low, high) if low is not None and high is not None else None,
            process_ms=[float(r["median_ms"]) for r in timing],
            host_bound_share=host_bound_share(timing),
            traced_ms=_number(row.get("step_ms_traced")),
            params_count=int(count) if count is not None else None))
    return runs


def why_not_comparable(run: PipelineRun) -> str | None:
    """Why the plain script has no counterpart of this run, or None."""
    checks = {"compile": "off", "cuda_graph": "off", "optimizer": "adamw_fused",
              "attention": "sdpa", "comm": "on", "straggle_ms": 0.0}
    for key, value in checks.items():
        if run.get(key) not in (None, value):
            return f"{key} {run.get(key)} (the plain script runs {key} {value})"
    if run.get("dtype") not in ("bf16", "fp32"):
        return f"dtype {run.get('dtype')} (the plain script runs bf16 or fp32)"
    return None


def parse_size_map(text: str | None) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in (text or "").split(",") if item.strip()]
    return {k.strip(): v.strip() for k, v in pairs}


def plain_options(options: dict[str, Any], *, warmup: int, steps: int, device: str = "auto",
                  size: str | None = None, no_sync: bool = False) -> list[str]:
    """The plain script's options for the same step as a run of these workload options
    (:func:`workload_options`): size (or `size`), batch, context, vocabulary, dtype,
    attention backend, parallel mode, bucket size, resharding."""
    run = PipelineRun("", options)
    flags = ["--size", size or str(run.get("size")), "--parallel", str(run.get("parallel")),
             "--batch", str(run.get("batch")), "--context", str(run.get("context")),
             "--vocab", str(run.get("vocab")), "--dtype", str(run.get("dtype")),
             "--warmup", str(warmup), "--steps", str(steps), "--device", device]
    if device != "cpu" and run.get("sdpa_backend") != "auto":
        flags += ["--sdpa", str(run.get("sdpa_backend"))]
    if run.get("parallel") == "ddp":
        flags += ["--bucket-cap-mb", str(run.get("bucket_cap_mb"))]
    if run.get("parallel") == "fsdp":
        flags += ["--reshard-after-forward", str(run.get("reshard_after_forward")).lower()]
    if no_sync and run.get("parallel") != "none":
        flags.append("--no-sync")
    return flags


def plain_flags(run: PipelineRun, args: argparse.Namespace) -> list[str]:
    size = args.size_map.get(str(run.get("size")))
    return plain_options(run.options, warmup=args.warmup, steps=args.steps, device=args.device,
                         size=size, no_sync=args.no_sync) + shlex.split(args.plain_args or "")


def torchrun(gpus: int, parallel: str, script: list[str]) -> list[str]:
    """torchrun on one node with a rendezvous of its own; one plain process without a
    parallel mode."""
    if parallel == "none":
        return [sys.executable, *script]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(gpus), *script]


def plain_command(run: PipelineRun, args: argparse.Namespace, out: Path) -> list[str]:
    """torchrun of the plain script on the run's GPUs (one process for one GPU)."""
    script = [str(PLAIN), *plain_flags(run, args), "--out", str(out)]
    return torchrun(run.gpus, str(run.get("parallel")), script)


def launch_plain(cmd: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    """One launch of the plain script: its JSON, or the failure."""
    # NVLink multicast off, as the pipeline's launcher; one CPU thread, as torchrun gives
    # each of several ranks (a one-process run too, so every run's host side is alike)
    env = {**NCCL_ENV, "OMP_NUM_THREADS": "1", **os.environ}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun passes SIGTERM on to its ranks
        proc.communicate()
        return {"status": "timeout", "message": f"no result within {timeout_s:.0f} s"}
    if proc.returncode != 0 or not out.exists():
        return {"status": "error", "message": f"exit {proc.returncode}: {output[-2000:]}"}
    result = json.loads(out.read_text())
    result.update(status="ok", launch_s=round(time.monotonic() - start, 1))
    return result


def spread(values: list[float]) -> float | None:
    """(max - min) / median: how far apart launches (or processes) land."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else None


def comparison_row(run: PipelineRun, plain: list[dict[str, Any]]) -> dict[str, Any]:
    """One line of the table: the plain script's launches beside the pipeline's numbers."""
    ok = [p for p in plain if p.get("status", "ok") == "ok"]
    ms = [float(p["step_ms"]) for p in ok]
    sync = [float(p["sync_cost_ms"]) for p in ok if "sync_cost_ms" in p]
    plain_ms = statistics.median(ms) if ms else None
    ratio = run.step_ms / plain_ms if plain_ms and run.step_ms else None
    return {
        "run": run.name, "gpus": run.gpus, "parallel": run.get("parallel"),
        "plain_ms": plain_ms, "plain_launch_ms": ms, "plain_spread": spread(ms),
        "plain_failures": [p.get("message") for p in plain if p.get("status", "ok") != "ok"],
        "plain_sync_cost_ms": statistics.median(sync) if sync else None,
        "pipeline_ms": run.step_ms,
        "pipeline_ci_low_ms": run.ci_ms[0] if run.ci_ms else None,
        "pipeline_ci_high_ms": run.ci_ms[1] if run.ci_ms else None,
        "pipeline_process_ms": run.process_ms, "pipeline_spread": spread(run.process_ms),
        "pipeline_traced_ms": run.traced_ms,
        "pipeline_host_bound_share": run.host_bound_share,
        "ratio": ratio, "within_5pct": abs(ratio - 1) <= WITHIN if ratio else None,
        "params_plain": ok[0].get("params") if ok else None,
        "params_pipeline": run.params_count,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'run':<26} {'gpus':>4}  {'plain ms':>9} {'(spread)':>8}  {'pipeline ms':>11} "
            f"{'[95% CI]':<17} {'processes':<18} {'ratio':>6}  {'sync ms':>7}  {'host':>4}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ci = (f"[{_ms(r['pipeline_ci_low_ms'])}, {_ms(r['pipeline_ci_high_ms'])}]"
              if r["pipeline_ci_low_ms"] is not None else "")
        procs = " / ".join(_ms(v) for v in r["pipeline_process_ms"])
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}" + (
            "" if r["within_5pct"] else " !")
        lines.append(
            f"{r['run']:<26} {r['gpus']:>4}  {_ms(r['plain_ms']):>9} "
            f"{'(' + _pct(r['plain_spread']) + ')':>8}  {_ms(r['pipeline_ms']):>11} {ci:<17} "
            f"{procs:<18} {ratio:>6}  {_ms(r['plain_sync_cost_ms']):>7}  "
            f"{_share(r['pipeline_host_bound_share']):>4}")
    lines.append(f"ratio: pipeline / plain ('!' beyond {WITHIN:.0%}); spread: (max - min) / "
                 "median over launches; sync ms: step - the step without gradient sync")
    lines.append(f"host: the pipeline's host_bound_share (at least {HOST_BOUND_SHARE}: the step "
                 "lasts as long as its host takes to issue it, in the plain script too, and "
                 "both follow the host CPU's speed: docs/timing.md)")
    lines.append(parameter_check(rows))
    return "\n".join(lines)


def parameter_check(rows: list[dict[str, Any]]) -> str:
    """Whether the plain model has the pipeline model's parameters, run by run."""
    pairs = [(r["run"], r["params_plain"], r["params_pipeline"]) for r in rows
             if r["params_plain"] is not None and r["params_pipeline"] is not None]
    differ = [f"{run} plain {a:,} vs pipeline {b:,}" for run, a, b in pairs if a != b]
    if differ:
        return "parameters differ (a mapped size?): " + "; ".join(differ)
    return f"parameters: the plain model's equal the pipeline's ({len(pairs)} runs compared)"


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v
                             for k, v in row.items()})


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=REPO / "results-distributed",
                   help="a results folder the pipeline finished (plan.json, summary.csv)")
    p.add_argument("--runs", help="comma-separated run names (default: every GPT train run)")
    p.add_argument("--rounds", type=int, default=3, help="launches of the plain script per run")
    p.add_argument("--warmup", type=int, default=5, help="the plain script's warm-up steps")
    p.add_argument("--steps", type=int, default=20, help="the plain script's measured steps")
    p.add_argument("--no-sync", action="store_true",
                   help="also the step without gradient sync (untraced cost of communication)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--size-map", type=parse_size_map, default={},
                   help="plain sizes for the pipeline's, e.g. small=tiny,2.7B=tiny (CPU checks)")
    p.add_argument("--plain-args", help="more options for the plain script, appended")
    p.add_argument("--timeout-s", type=float, default=600, help="per launch")
    p.add_argument("--dry-run", action="store_true", help="list the commands, run nothing")
    p.add_argument("--plain-json", type=Path,
                   help="this script's --json of an earlier run: its plain launches instead of "
                        "new ones")
    p.add_argument("--json", type=Path, help="write the table and every launch's result")
    p.add_argument("--csv", type=Path, help="write the table")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args


def selected(runs: list[PipelineRun], names: str | None) -> list[PipelineRun]:
    if not names:
        return runs
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {r.name for r in runs})
    if unknown:
        raise SystemExit(f"not GPT train runs of this folder: {', '.join(unknown)}")
    return [r for r in runs if r.name in wanted]


def measure_plain(runs: list[PipelineRun], args: argparse.Namespace, tmp: Path
                  ) -> dict[str, list[dict[str, Any]]]:
    """Every run's plain launches, the runs interleaved round by round."""
    launches: dict[str, list[dict[str, Any]]] = {r.name: [] for r in runs}
    for i in range(args.rounds):
        for run in runs:
            out = tmp / f"{run.name}.{i}.json"
            result = launch_plain(plain_command(run, args, out), out, args.timeout_s)
            launches[run.name].append(result)
            said = (f"{result['step_ms']:.1f} ms ({result['launch_s']} s)"
                    if result["status"] == "ok" else f"{result['status']}: "
                    f"{result['message'][-300:]}")
            print(f"round {i + 1}/{args.rounds} {run.name}: plain {said}", flush=True)
    return launches


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    runs = selected(read_results(args.results), args.runs)
    comparable = []
    for run in runs:
        why = why_not_comparable(run)
        if why:
            print(f"{run.name}: left out: {why}", flush=True)
        else:
            comparable.append(run)
    commands = {r.name: shlex.join(plain_command(r, args, Path(f"{r.name}.json")))
                for r in comparable}
    if args.dry_run:
        for name, cmd in commands.items():
            print(f"{name}: {cmd}", flush=True)
    if args.plain_json:
        earlier = json.loads(args.plain_json.read_text())
        args.warmup, args.steps = earlier["warmup"], earlier["steps"]  # the launches' own
        launches = {r.name: earlier["runs"].get(r.name, {}).get("plain", [])
                    for r in comparable}
    elif args.dry_run:
        return {"commands": commands}
    else:
        with tempfile.TemporaryDirectory() as tmp:
            launches = measure_plain(comparable, args, Path(tmp))
    rows = [comparison_row(r, launches[r.name]) for r in comparable]
    print(format_table(rows), flush=True)
    result = {"results": str(args.results), "warmup": args.warmup, "steps": args.steps,
              "runs": {row["run"]: {**row, "command": commands[row["run"]],
                                    "plain": launches[row["run"]]} for row in rows}}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.csv and rows:
        write_csv(args.csv, rows)
    return result


if __name__ == "__main__":
    main()
