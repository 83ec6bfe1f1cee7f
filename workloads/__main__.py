"""Command line: ``python -m workloads {attention,attention_core,gpt,sleep,model,calibrate} ...``.

Each workload run writes a timings JSON (``--out``, also on failure, with a ``status``) and
prints one summary line. Exit codes: 0 ok, 1 error, 2 usage, 3 oom, 4 unsupported.

Examples::

    python -m workloads attention --impl sdpa --batch 32 --seq 100 --embed 256 --out a.json
    python -m workloads gpt --size small --mode train --dtype bf16 --compile reduce-overhead
    python -m workloads attention_core --seq 4096 --head-dim 128 --dtype bf16 --sdpa-backend cudnn
    python -m workloads model --factory my_model.py:make --kwargs '{"width": 64}' --mode train
    python -m workloads calibrate --out peaks.json --dtypes bf16,fp32

Each workload is a module of workloads/models/ (the registry: workloads/models/__init__.py):
its own flags come from its ``Options`` dataclass, the shared ones (dtype, compile, warm-up,
steps, ...) are added here.
"""

import argparse
import contextlib
import json
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from workloads import (
    calibrate,
    devicelock,
    flops,
    maxbatch,
    memory_capture,
    models,
    parallel,
    process_state,
)
from workloads.attention import SDPA_BACKENDS
from workloads.contract import EXIT_CODES, NEW_DEFAULTS
from workloads.cpuprobe import probe_ms
from workloads.device import DTYPES, configure_precision, device_name, resolve_device
from workloads.gpustate import GpuStateRecorder
from workloads.graphs import CUDA_GRAPH_MODES, capture_step, check_capturable
from workloads.jsonfile import write_whole
from workloads.nvtx_ranges import rng
from workloads.op_ranges import OP_RANGES
from workloads.proctree import stop_compile_workers
from workloads.provenance import provenance
from workloads.runner import Measurement, run_steps
from workloads.status import classify
from workloads.steps import COMPILE_MODES, Speed, Workload


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workloads", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="workload", required=True)

    registered = []
    for name, module in models.registry().items():
        sub_parser = sub.add_parser(name, help=(module.__doc__ or "").strip().split("\n")[0])
        models.add_options(sub_parser, module.Options, _flag, _boolean)
        registered.append(sub_parser)

    for p in registered:
        _flag(p, "dtype", choices=DTYPES, default="fp32")
        _flag(p, "compile", choices=COMPILE_MODES, default="off")
        _flag(p, "cuda_graph", choices=CUDA_GRAPH_MODES, default="off",
              help="step: capture the whole step into one CUDA graph and replay it")
        _flag(p, "sdpa_backend", choices=SDPA_BACKENDS, default="auto",
              help="kernel family of F.scaled_dot_product_attention (impl/attention sdpa)")
        _flag(p, "warmup", type=_non_negative, default=3, help="unmeasured steps")
        _flag(p, "steps", type=_positive, default=5, help="measured steps")
        _flag(p, "device", choices=("auto", "cpu", "cuda"), default="auto")
        _flag(p, "seed", type=int, default=0)
        _flag(p, "memory_limit_mb", type=_positive, default=None,
              help="CPU only: RLIMIT_AS of this process (ignored on CUDA)")
        _flag(p, "peak_tflops", type=float, default=None,
              help="peak TFLOP/s for MFU (default: datasheet value for known GPUs, else no MFU)")
        _flag(p, "out", type=Path, default=None, help="write the result JSON here")
        _flag(p, "op_ranges", choices=OP_RANGES, default="off",
              help="PyTorch's op ranges (NVTX) around the measured steps: the op capture")
        _flag(p, "batch_from", type=Path, default=None,
              help="a `batch: max` run: the batch its search found (the search's result "
                   "JSON, workloads/maxbatch.py), in place of --batch")
        _flag(p, "memory_out", type=Path, default=None,
              help="the memory capture: after the measured steps, where the memory goes in "
                   "three more steps, written here (workloads/memory_capture.py)")

    cal = sub.add_parser("calibrate", help="measured matmul TFLOP/s and copy GB/s of the device")
    _flag(cal, "out", type=Path, required=True)
    _flag(cal, "dtypes", type=_dtype_list, default=["bf16", "fp16", "tf32", "fp32"],
          help="comma-separated")
    _flag(cal, "device", choices=("auto", "cpu", "cuda"), default="auto")
    cal.add_argument("--refresh", action="store_true", help="ignore the cached calibration")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return run_from_command_line(argv)
    finally:  # the result is written: nothing may keep the process from exiting now
        if "torch._inductor" in sys.modules and (stopped := stop_compile_workers()):
            print(f"stopped Inductor's compile workers: {stopped}", file=sys.stderr)


def run_from_command_line(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.workload == "calibrate":
        return run_calibrate(args)
    if args.compile == "reduce-overhead" and args.cuda_graph == "off" and args.warmup < 3:
        parser.error("--compile reduce-overhead needs --warmup >= 3 (CUDA-graph recording)")
    try:
        device = resolve_device(args.device)
    except ValueError as err:
        parser.error(str(err))
    distributed = parallel.is_distributed(args)
    if not distributed and getattr(args, "gpus", 1) > 1:
        parser.error("--gpus > 1 needs --parallel ddp or fsdp (launched by torchrun)")
    if distributed:
        device = parallel.rank_device(device)
        args.out = parallel.rank_out(args.out)
    # A timeout's SIGTERM becomes an exception, so the JSON (status error) is still written.
    signal.signal(signal.SIGTERM, _terminated)
    searched = batch_from_search(args)
    record = Record(args, device, memory_limited=False)
    if searched is not None:
        record.result["max_batch"] = searched
        if searched["batch"] is None:  # no batch to run: the search's outcome is the run's
            return record.finish_without_batch(searched)
    # The limit after the record's own bookkeeping (provenance reads package metadata): only
    # the workload runs under it, so an `oom` record keeps its params and provenance.
    record.result["memory_limit_applied"] = apply_memory_limit(args.memory_limit_mb, device)
    run = None
    try:
        if distributed:
            run = parallel.start(args, device)
            record.result["distributed"] = run.describe()
        # a capture started beside the one on the GPU: the GPU once that one has exited
        lock_wait = devicelock.hold_device(device, record.result["process"])
        if lock_wait is not None:
            record.result["process"]["device_wait_s"] = lock_wait
        configure_precision(args.dtype)
        if args.cuda_graph == "step":
            check_capturable(device, args.dtype, args.mode)
        workload = build_workload(args, device, wrap=run.wrap if run else None)
        record.result["process"].update(process_state.after_build())
        process_state.mark(record.result["process"], "built")
    except ValueError as err:  # invalid combination of options: a usage error
        record.fail("error", str(err))
        record.write()
        parser.error(str(err))
    except BaseException as err:  # noqa: BLE001 - every failure becomes a status
        return record.finish_failed(err)
    try:
        gpu = GpuStateRecorder(device)
        step, graph = workload.step, {}
        memory = None
        if args.memory_out is not None and args.cuda_graph == "step":
            # the step the graph records, before the graph holds its pool (a replay
            # allocates nothing the allocator could show)
            memory = memory_before_graph(args, workload, device)
        if args.cuda_graph == "step":
            step, graph = whole_step_graph(step, device)

        probes: dict[str, float] = {}

        def before_measure() -> None:
            gpu.snapshot("before")
            probes["before"] = probe_ms()
            if run:
                run.log.measuring = True  # count the measured steps' collectives

        def after_measure() -> None:
            gpu.snapshot("after")
            probes["after"] = probe_ms()

        with run.measuring() if run else contextlib.nullcontext():
            measurement = run_steps(
                step, warmup=args.warmup, steps=args.steps, device=device,
                before_measure=before_measure, after_measure=after_measure,
                op_ranges=args.op_ranges, before_step=run.before_step if run else None,
            )
        process_state.mark(record.result["process"], "measured")
        record.succeed(workload, measurement, gpu.result(), graph)
        record.result["cpu_probe_ms"] = probes
        if run:
            run.complete(record.result, workload.tokens_per_step)
        if args.memory_out is not None:
            record.result["memory_capture"] = write_memory_capture(
                args.memory_out, workload, device, graph, args.compile != "off", memory)
    except BaseException as err:  # noqa: BLE001
        return record.finish_failed(err)
    record.write()
    if run:  # after the record: leaving the group cannot lose it
        run.close()
    print(summary_line(record.result))
    return 0


def batch_from_search(args: argparse.Namespace) -> dict[str, Any] | None:
    """A `batch: max` run: the batch its search found becomes the run's (None without one:
    no batch was found), and what the search found, for the record; None for any other run."""
    if getattr(args, "batch_from", None) is None:
        return None
    searched = maxbatch.found(args.batch_from)
    args.batch = searched["batch"]
    return searched


def record_params(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The record's ``params``: every option of the command line but the workload's name
    (a single-process run leaves out the distributed ones), with the device it resolved to."""
    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if parallel.is_distributed(args) or k not in parallel.ARGS}
    params.pop("workload")
    for key in ("memory_out", "batch_from"):  # only the memory capture's, a batch: max run's
        if params.get(key) is None:
            params.pop(key, None)
    params["device"] = device.type
    return params


def hashed_params(params: dict[str, Any]) -> dict[str, Any]:
    """What the config hash covers: where the record lands is no config; op ranges and step
    graphs off is every run before they existed (their config hash stays the same), and so
    is compiling each block; an uncompiled run's compile_blocks changes nothing. A `batch:
    max` run's hash is that of the batch it ran (its search's file is where, not what)."""
    return {k: v for k, v in params.items()
            if k not in ("out", "memory_out", "batch_from")
            and (k, json.dumps(v)) not in NEW_DEFAULTS
            and not (k == "compile_blocks" and params["compile"] == "off")}


class Record:
    """The result JSON of one run, written whatever the outcome."""

    def __init__(self, args: argparse.Namespace, device: torch.device, memory_limited: bool):
        self.args, self.device = args, device
        process = process_state.at_start()  # first: nothing below may touch it (docs/timing.md)
        process_state.mark(process, "main")
        params = record_params(args, device)
        self.result: dict[str, Any] = {
            "workload": args.workload,
            "status": "error",
            "message": "",
            "params": params,
            "device_name": _safe_device_name(device),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "memory_limit_applied": memory_limited,
            **dict.fromkeys(RESULT_TIMING_KEYS),
            "step_times_ms": [],
            "step_ms": [],
            "losses": [],
            "gpu_state": {"available": False, "reason": "run did not reach the measured steps"},
            "provenance": provenance(params=hashed_params(params)),
            "process": process,
        }

    def fail(self, status: str, message: str) -> None:
        self.result.update(status=status, message=message)

    def finish_failed(self, err: BaseException) -> int:
        if isinstance(err, KeyboardInterrupt | SystemExit):
            raise err
        status, message = classify(err)
        if status == "error":
            traceback.print_exc()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.fail(status, message)
        self.write()
        print(f"{self.args.workload}: {status}: {message.splitlines()[0] if message else ''}")
        return EXIT_CODES[status]

    def finish_without_batch(self, searched: dict[str, Any]) -> int:
        """A `batch: max` run whose search found no batch: its status (oom: batch 1 did not
        fit; else the search's failure) and message, as a result record."""
        status = searched["status"] if searched["status"] in EXIT_CODES else "error"
        self.fail(status, f"batch: max found no batch that fits: {searched['message']}")
        self.write()
        print(f"{self.args.workload}: {status}: {self.result['message']}")
        return EXIT_CODES[status]

    def succeed(self, workload: Workload, m: Measurement, gpu_state: dict[str, Any],
                graph: dict[str, Any] | None = None) -> None:
        stats = m.summary()
        graph = graph or {}
        # With a whole-step graph, compilation happened in the eager steps before the capture.
        compile_s = graph.get("cuda_graph_capture_s") if graph else m.compile_seconds()
        mean_s, median_s = stats["mean_ms"] / 1e3, stats["median_ms"] / 1e3
        name = self.result["device_name"]
        peak = self.args.peak_tflops
        if peak is None and self.device.type == "cuda":
            peak = flops.peak_tflops(name, self.args.dtype)
        self.result.update(
            status="ok",
            timer=m.timer,
            step_ms=m.step_ms,
            step_times_ms=m.step_times_ms,
            cuda_event_times_ms=m.cuda_event_times_ms or None,
            sync_wait_ms=m.sync_wait_ms or None,
            warmup_times_ms=m.warmup_times_ms,
            region_ms=m.region_ms or None,
            compile_s=None if self.args.compile == "off" else compile_s,
            **stats,
            tokens_per_s=workload.tokens_per_step / mean_s,
            params_count=workload.params_count,
            peak_memory_bytes=m.peak_memory_bytes,
            peak_allocated_bytes=m.peak_allocated_bytes,
            peak_reserved_bytes=m.peak_reserved_bytes,
            cuda_graph_pool_bytes=m.cuda_graph_pool_bytes,
            losses=m.losses,
            model_flops_per_step=workload.flops_per_step,
            flops_per_step=workload.flops_per_step,
            tflops=workload.flops_per_step / median_s / 1e12,
            peak_tflops=peak,
            mfu=flops.mfu(workload.flops_per_step, mean_s, peak),
            optimizer_bytes_per_step=workload.optimizer_bytes_per_step,
            peak_memory_gbps=flops.peak_memory_gbps(name or "") if self.device.type == "cuda"
            else None,
            gpu_state=gpu_state,
            **graph,
        )
        if workload.structure is not None:
            self.result["structure"] = {"layers": workload.structure.layers,
                                        "sublayers": workload.structure.sublayers,
                                        "found": workload.structure.found}
        if workload.module_paths is not None:
            self.result["module_paths"] = workload.module_paths
        if workload.module_depth is not None:
            self.result["module_depth"] = workload.module_depth
        if workload.float8 is not None:
            self.result["float8"] = workload.float8
        self.result["dynamo_graphs"] = dynamo_graphs()

    def write(self) -> None:
        process_state.mark(self.result["process"], "written")
        if self.args.out is not None:  # whole or not at all: the guard watches for it
            write_whole(self.args.out, self.result)


def dynamo_graphs() -> int | None:
    """The graphs torch.compile made in this process (its recompiles included), or None where
    nothing imported Dynamo: a capture that compiled more than the timed processes did ran
    another program (aggregate's ``capture_recompiled``)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return None
    return int(dynamo.counters["stats"]["unique_graphs"])


# Scalars of a successful run; null in a failed run's JSON.
RESULT_TIMING_KEYS = (
    "timer", "cuda_event_times_ms", "warmup_times_ms", "region_ms", "compile_s", "mean_ms",
    "median_ms", "std_ms", "min_ms", "max_ms", "tokens_per_s", "params_count", "peak_memory_bytes",
    "model_flops_per_step", "flops_per_step", "tflops", "peak_tflops", "mfu",
    "optimizer_bytes_per_step", "peak_memory_gbps", "sync_wait_ms", "cpu_probe_ms",
    "peak_allocated_bytes", "peak_reserved_bytes", "cuda_graph_pool_bytes",
)


def build_workload(args: argparse.Namespace, device: torch.device,
                   wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> Workload:
    module = models.registry()[args.workload]
    settings = models.RunSettings(dtype=args.dtype, device=device, seed=args.seed,
                                  speed=_speed(args), wrap=wrap)
    return module.build(models.options_of(args.workload, vars(args)), settings)


def _speed(args: argparse.Namespace) -> Speed:
    return Speed(
        compile=args.compile,
        sdpa_backend=args.sdpa_backend,
        optimizer=getattr(args, "optimizer", "adamw_foreach"),
        cuda_graph=args.cuda_graph,
        compile_blocks=getattr(args, "compile_blocks", "each"),
        float8=getattr(args, "float8", "none"),
    )


def memory_before_graph(args: argparse.Namespace, workload: Workload,
                        device: torch.device) -> dict[str, Any]:
    """A whole-step graph run's memory capture: its warm-up, then the capture of the step
    the graph will record (the graph's pool is not there yet to add to it)."""
    for _ in range(args.warmup):
        workload.step()
    return capture_memory(workload, device, args.compile != "off")


def capture_memory(workload: Workload, device: torch.device, compiled: bool,
                   graph: dict[str, Any] | None = None) -> dict[str, Any]:
    """The memory capture of the run's eager (or compiled) step; a failure is its result."""
    start = time.perf_counter()
    try:
        result = {"status": "ok", **memory_capture.capture(workload.step, device, graph,
                                                           compiled=compiled)}
    except Exception as err:  # noqa: BLE001 - the run's timing stands; the memory view says why
        traceback.print_exc()
        result = {"status": "error", "message": f"{type(err).__name__}: {err}"}
    result["capture_s"] = round(time.perf_counter() - start, 3)
    return result


def write_memory_capture(path: Path, workload: Workload, device: torch.device,
                         graph: dict[str, Any], compiled: bool,
                         before_graph: dict[str, Any] | None = None) -> dict[str, Any]:
    """The memory capture written to ``path`` (taken now, or before the whole-step graph
    was captured: then with what the graph's pool reserves now); what it cost and whether
    it worked, for the run's record."""
    if before_graph is None:
        result = capture_memory(workload, device, compiled, graph)
    else:
        result = before_graph
        if device.type == "cuda" and result["status"] == "ok":
            result["cuda_graph_pool_bytes"] = memory_capture.graph_pool_bytes(device)
            result["notes"].append(memory_capture.GRAPH_NOTE)
    write_whole(path, result)
    return {"status": result["status"], "capture_s": result["capture_s"]}


def whole_step_graph(step: Any, device: torch.device) -> tuple[Any, dict[str, Any]]:
    """The step captured into one CUDA graph (workloads/graphs.py), timed: its eager warm-up
    and the capture run before the measured steps, inside a `warmup` range."""
    start = time.perf_counter()
    with rng("warmup"):
        replay, record = capture_step(step, device)
    record["cuda_graph_capture_s"] = time.perf_counter() - start
    return replay, record


def apply_memory_limit(limit_mb: int | None, device: torch.device) -> bool:
    """Cap this process's address space (CPU runs only: the CUDA driver maps far more virtual
    memory than it uses and breaks under RLIMIT_AS). True when the limit was set."""
    if limit_mb is None or device.type != "cpu":
        return False
    # The cap is for the run's allocations, not for what the process imports at first use
    # (numpy's random module: the run record draws from it): a shared object mapped under the
    # cap can fail to map, an ImportError where the run would have been an OOM.
    with contextlib.suppress(ImportError):
        import numpy.random  # noqa: F401
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = limit_mb << 20
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return True


def run_calibrate(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    result = calibrate.calibrate(device, args.dtypes, refresh=args.refresh)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    peaks = ", ".join(f"{d} {t:.1f}" for d, t in result["matmul_tflops"].items())
    cached = " (cached)" if result["cached"] else ""
    print(f"{result['device_name']}: matmul TFLOP/s {peaks}; "
          f"copy {result['copy_gbps']:.0f} GB/s{cached}")
    return 0


def summary_line(result: dict[str, Any]) -> str:
    p = result["params"]
    module = models.registry()[result["workload"]]
    variant = (module.summary(models.options_of(result["workload"], p))
               if hasattr(module, "summary") else result["workload"])
    if p["compile"] != "off":
        variant += f" compile={p['compile']}"
    if p.get("compile_blocks", "each") != "each" and p["compile"] != "off":
        variant += f" compile_blocks={p['compile_blocks']}"
    if p.get("cuda_graph", "off") != "off":
        variant += f" cuda_graph={p['cuda_graph']}"
    line = (
        f"{variant} {p['mode']} {p['dtype']} on {result['device_name']}: "
        f"{result['mean_ms']:.2f} ms/step (median {result['median_ms']:.2f}, "
        f"std {result['std_ms']:.2f}, n={len(result['step_ms'])}, {result['timer']}), "
        f"{result['tokens_per_s']:,.0f} tok/s, {result['tflops']:.1f} TFLOP/s"
    )
    if result["mfu"] is not None:
        line += f", MFU {result['mfu']:.1%}"
    if result["losses"]:
        line += f", loss {result['losses'][0]:.4f} -> {result['losses'][-1]:.4f}"
    return line


class Terminated(Exception):
    """The process got SIGTERM (e.g. from `timeout`)."""


def _terminated(signum: int, _frame: Any) -> None:
    raise Terminated(f"terminated by signal {signal.Signals(signum).name}")


def _flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """``--multi-word`` and the pipeline's ``--multi_word`` spelling of one option."""
    spellings = [f"--{name.replace('_', '-')}"]
    if "_" in name:
        spellings.append(f"--{name}")
    parser.add_argument(*spellings, dest=name, **kwargs)


def _safe_device_name(device: torch.device) -> str | None:
    try:
        return device_name(device)
    except Exception:  # noqa: BLE001 - a broken driver must not stop the JSON from being written
        return None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _dtype_list(text: str) -> list[str]:
    dtypes = [d.strip() for d in text.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {bad}; expected from {DTYPES}")
    return dtypes


if __name__ == "__main__":
    sys.exit(main())
