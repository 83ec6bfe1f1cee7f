"""The module table of a pipeline run beside torch.profiler's per-module figure for the same
model and step, computed without profbench's module ranges or analysis.

    python benchmarks/module_table_vs_profiler.py RESULTS [RUN ...] [--steps 5] [--out F.json]

For each eager ``workload: model`` run of RESULTS (its factory, kwargs, batch, dtype, mode and
optimizer from ``plan.json``), this builds the model again from its factory, trains it in a
plain loop (autocast, AdamW) and profiles ``--steps`` steps with torch.profiler, each module's
call wrapped in a ``record_function`` by forward hooks: ``fwd:<path>`` for a forward,
``rec:<path>`` for a forward that runs while autograd executes a graph (activation
checkpointing's recomputation). A module's figure is the GPU time (CPU time on a CPU
run) of everything launched inside its calls, per step, and its calls per step.

It prints, per module holding at least 1% of the step: forward ms from the capture's module
table and from the profiler, their ratio, the recompute column beside the profiler's
recomputation, and calls per step on both sides; then the largest forward deviation over
those modules and whether the table passed its self-check. A compiled run has no per-module
record_function to compare with: its table's self-check is printed alone.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from workloads.models.model import load_factory  # noqa: E402  (the factory's loader only)

SHOWN_SHARE = 0.01  # of the step: smaller modules are listed in the JSON only


def profiler_figures(params: dict[str, Any], steps: int, device: torch.device
                     ) -> dict[str, dict[str, float]]:
    """path -> {"fwd_ms", "rec_ms", "calls", "rec_calls"} per step, from torch.profiler."""
    made = load_factory(params["factory"])(**(params.get("kwargs") or {}))
    model, make_batch, loss_fn = (made.model, made.make_batch, made.loss) if hasattr(
        made, "model") else made
    torch.manual_seed(params.get("seed", 0))
    model = model.to(device)
    inputs, targets = make_batch(params.get("batch", 1), device)
    if params.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = bool(params.get("cudnn_benchmark"))
    fused = params.get("optimizer") == "adamw_fused" and device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused or None)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params.get("dtype"))
    handles = []
    for path, module in model.named_modules():
        if path:
            handles += _wrap(path, module)

    def step() -> None:
        with torch.autocast(device.type, dtype) if dtype else nullcontext():
            out = model(**inputs) if isinstance(inputs, dict) else (
                model(*inputs) if isinstance(inputs, tuple) else model(inputs))
            loss = loss_fn(out, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                           if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    for handle in handles:
        handle.remove()
    out: dict[str, dict[str, float]] = {}
    for event in prof.events():
        kind, _, path = event.name.partition(":")
        # the host-side annotation only: CUDA runs also show each as a GPU-side span
        if kind not in ("fwd", "rec") or not path or event.device_type != DeviceType.CPU:
            continue
        us = event.device_time_total if device.type == "cuda" else event.cpu_time_total
        row = out.setdefault(path, {"fwd_ms": 0.0, "rec_ms": 0.0, "calls": 0, "rec_calls": 0})
        row[f"{kind}_ms"] += us / 1e3 / steps
        row["calls" if kind == "fwd" else "rec_calls"] += 1
    for row in out.values():
        row["calls"] /= steps
        row["rec_calls"] /= steps
    return out


def _wrap(path: str, module: torch.nn.Module) -> list[Any]:
    """Forward hooks that open a record_function per call (always_call: a checkpoint that
    stops its recomputation early raises inside forward)."""
    stack: list[Any] = []

    def before(_m: Any, _args: Any) -> None:
        recomputing = torch._C._current_graph_task_id() != -1
        context = record_function(f"{'rec' if recomputing else 'fwd'}:{path}")
        context.__enter__()
        stack.append(context)

    def after(_m: Any, _args: Any, _out: Any) -> None:
        stack.pop().__exit__(None, None, None)

    return [module.register_forward_pre_hook(before),
            module.register_forward_hook(after, always_call=True)]


def compare(results: Path, run: str, params: dict[str, Any], steps: int,
            device: torch.device) -> dict[str, Any]:
    clock = "GPU" if device.type == "cuda" else "CPU"
    table = {r["Module"]: r for r in csv.DictReader(
        open(results / run / "stats" / "module_table.csv"))}
    metrics = json.loads((results / run / "stats" / "metrics.json").read_text())
    out: dict[str, Any] = {"run": run, "suspect": metrics.get("module_attribution_suspect"),
                           "coverage": metrics.get("module_coverage"), "modules": []}
    if params.get("compile", "off") not in ("off", None):
        return out
    reference = profiler_figures(params, steps, device)
    step_ms = sum(float(table[p][f"Forward {clock} ms/step"] or 0) + float(
        table[p][f"Backward {clock} ms/step"] or 0) for p in table if "." not in p)
    for path, ref in reference.items():
        row = table.get(path)
        if row is None:
            continue
        fwd = float(row[f"Forward {clock} ms/step"] or 0)
        rec = float(row.get(f"Recompute {clock} ms/step") or 0)
        out["modules"].append({
            "module": path, "table_fwd_ms": fwd, "profiler_fwd_ms": ref["fwd_ms"],
            "table_rec_ms": rec, "profiler_rec_ms": ref["rec_ms"],
            "table_calls": float(row["Calls/step"] or 0), "profiler_calls": ref["calls"],
            "shown": step_ms > 0 and ref["fwd_ms"] >= SHOWN_SHARE * step_ms})
    return out


def report(result: dict[str, Any]) -> None:
    print(f"\n== {result['run']}: self-check "
          f"{'FAILED: ' + result['suspect'] if result['suspect'] else 'passed'}; "
          f"module coverage {result['coverage']}")
    shown = [m for m in result["modules"] if m["shown"]]
    if not shown:
        return
    print(f"{'module':40} {'fwd table':>10} {'profiler':>10} {'ratio':>7} {'recompute':>10} "
          f"{'profiler':>10} {'calls':>6} {'prof':>6}")
    for m in shown:
        ratio = m["table_fwd_ms"] / m["profiler_fwd_ms"] if m["profiler_fwd_ms"] else float("nan")
        print(f"{m['module'][:40]:40} {m['table_fwd_ms']:10.4g} {m['profiler_fwd_ms']:10.4g} "
              f"{ratio:7.3f} {m['table_rec_ms']:10.4g} {m['profiler_rec_ms']:10.4g} "
              f"{m['table_calls']:6g} {m['profiler_calls']:6g}")
    worst = max(shown, key=lambda m: abs(m["table_fwd_ms"] / m["profiler_fwd_ms"] - 1))
    print(f"largest forward deviation: {worst['module']} "
          f"{worst['table_fwd_ms'] / worst['profiler_fwd_ms'] - 1:+.1%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("runs", nargs="*", help="default: every workload: model run")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    plan = json.loads((args.results / "plan.json").read_text())["runs"]
    runs = args.runs or [r for r, info in plan.items()
                         if info["params"].get("workload") == "model"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = []
    for run in runs:
        result = compare(args.results, run, plan[run]["params"], args.steps, device)
        report(result)
        results.append(result)
    if args.out:
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name()
                                        if device.type == "cuda" else "cpu",
                                        "torch": torch.__version__, "runs": results},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
