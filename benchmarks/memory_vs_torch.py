"""The memory capture (workloads/memory_capture.py) beside what PyTorch reports on its own,
in the same process, for a few workloads.

    python benchmarks/memory_vs_torch.py [--cases gpt_small_eager,resnet50,...] [--out F.json]

Each case runs in its own process (a fresh CUDA allocator): profbench builds the workload as a
pipeline run would (``python -m workloads`` options), runs its warm-up, takes the memory
capture of one step, then checks it against figures made without it:

* **peak**: the capture's peak allocated bytes (its replay of the allocator's history) vs
  ``torch.cuda.max_memory_allocated`` of a plain step after it (reset before the step);
* **categories**: the bytes by category at the peak, summed, vs that peak;
* **parameters, gradients, optimizer state**: vs analytic bytes (parameter count x dtype
  bytes; AdamW's two states per parameter; master weights and flat buffers where the
  optimizer has them);
* **activations**: the capture's activations when backward starts vs the bytes saved for
  backward counted on a plain step by a ``torch.autograd.graph.saved_tensors_hooks`` of this
  script (unique storages, parameters left out);
* **operator table**: per ATen op, the capture's self size increase and calls vs
  ``torch.profiler.profile(profile_memory=True)``'s ``key_averages()`` on a plain step.

On a CPU only the activations, the analytic bytes and the operator table are compared (the
curve, the peak and the categories need CUDA's allocator history): the cases ``gpt_tiny_cpu``
and ``gpt_tiny_cpu_master``.
Sized for 2-3 minutes on one H200 with the default cases (compilation included).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GPT_SMALL = "gpt --size small --mode train --context 512 --batch 4"
CASES = {
    "gpt_small_eager": f"{GPT_SMALL} --dtype fp32",
    "gpt_small_best": f"{GPT_SMALL} --dtype bf16 --optimizer adamw_master --attention sdpa "
    "--sdpa_backend cudnn --compile default --cuda_graph step",
    "resnet50": "model --factory workloads.models.resnet:make --kwargs "
    "'{\"depth\":50,\"image_size\":224}' --batch 64 --mode train",
    "gpt2_hf": "model --factory workloads.models.hf_causal_lm:make --kwargs '{\"arch\":\"gpt2\"}' "
    "--batch 8 --mode train",
    "gpt_2.7B_eager": "gpt --size 2.7B --mode train --context 512 --batch 4 --dtype fp32",
    "gpt_2.7B_best": "gpt --size 2.7B --mode train --context 512 --batch 4 --dtype bf16 "
    "--optimizer adamw_master --attention sdpa --sdpa_backend cudnn --compile default "
    "--cuda_graph step",
    "gpt_tiny_cpu": "gpt --size tiny --mode train --context 32 --batch 2 --device cpu",
    "gpt_tiny_cpu_master": "gpt --size tiny --mode train --context 32 --batch 2 --device cpu "
    "--dtype bf16 --optimizer adamw_master",
}
DEFAULT_CASES = ("gpt_small_eager", "gpt_small_best", "resnet50", "gpt2_hf")
WARMUP = 3


def run_case(name: str) -> dict[str, Any]:
    """One case, in this process: the capture and the independent figures."""
    import shlex

    import torch

    from workloads import memory_capture
    from workloads.__main__ import build_parser, build_workload
    from workloads.device import configure_precision, resolve_device, synchronize

    args = build_parser().parse_args(shlex.split(CASES[name]))
    device = resolve_device(args.device)
    configure_precision(args.dtype)
    workload = build_workload(args, device)
    step = workload.step
    for _ in range(WARMUP):
        step()
    synchronize(device)
    # as in the pipeline, a whole-step graph run is captured on the step the graph records,
    # before the graph exists; the graph's pool is measured after (below)
    start = time.perf_counter()
    record = memory_capture.capture(step, device, compiled=args.compile != "off")
    out: dict[str, Any] = {
        "case": name,
        "capture_s": time.perf_counter() - start,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    owners = memory_capture.find_owners(step)
    out["analytic"] = analytic(owners)
    out["capture_analytic"] = record["analytic"]
    out["saved_independent"] = saved_independent(step, owners)
    out["capture_saved"] = record["saved_bytes"]
    out["ops_profiler"] = profiler_ops(step, device)
    out["ops_capture"] = {r["op"]: r for r in record["ops"]}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        step()
        synchronize(device)
        out["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
        out["peak"] = record["peak_allocated_bytes"]
        out["at_peak"] = record["at_peak"]
        out["at_backward_start"] = record.get("at_backward_start")
        # of those activations, the saved tensors (the rest: kept alive by other references)
        kept = record.get("at_backward_start_activations_kept") or 0
        activations = (out["at_backward_start"] or {}).get("activations", 0)
        out["saved_at_backward_start"] = activations - kept
        out["kept_at_backward_start"] = kept
        if args.cuda_graph == "step":
            out.update(graph_figures(step, device))
    return out


def graph_figures(step: Any, device: Any) -> dict[str, Any]:
    """The whole-step graph's pool and what its replays hold (the timing record's peak:
    max_memory_allocated over the replays plus the pool's free bytes)."""
    import torch

    from workloads.__main__ import whole_step_graph
    from workloads.runner import peak_memory

    replay, _ = whole_step_graph(step, device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(3):
        replay()
    torch.cuda.synchronize(device)
    return {"graph": peak_memory(device)}


def analytic(owners: dict[str, list[Any]]) -> dict[str, int]:
    """Parameter count x dtype bytes; gradients the same; optimizer state: AdamW's two
    states per parameter (and its step counts on the device); ``adamw_master``: fp32 master
    weights and two fp32 states per parameter, its step count and flat gradient buffers (its
    fp32 parameters live inside the master weights: counted as parameters, not twice)."""
    import torch

    params = list({id(p): p for m in owners["modules"] for p in m.parameters()}.values())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    opt = 0
    for o in owners["optimizers"]:
        if isinstance(o, torch.optim.Optimizer):
            for group in o.param_groups:
                for p in group["params"]:
                    opt += 2 * p.numel() * p.element_size()  # exp_avg, exp_avg_sq
                    step = o.state.get(p, {}).get("step")
                    if isinstance(step, torch.Tensor) and step.device.type != "cpu":
                        opt += step.numel() * step.element_size()
        else:
            n, n_full = o.master.numel(), o.master.numel() - o.n_low
            opt += 3 * n * 4 + 4 - n_full * 4  # master, exp_avg, exp_avg_sq, step count
            opt += o.grad_full.numel() * 4
            if o.grad_low is not None:
                opt += o.grad_low.numel() * o.grad_low.element_size()
    return {"parameters": param_bytes, "gradients": param_bytes, "optimizer_state": opt}


def saved_independent(step: Any, owners: dict[str, list[Any]]) -> int:
    """Bytes saved for backward in one plain step: unique storages, parameters left out."""
    import torch

    params = {p.untyped_storage().data_ptr() for m in owners["modules"] for p in m.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(seen.values())


def profiler_ops(step: Any, device: Any) -> dict[str, dict[str, int]]:
    """torch.profiler's per-op self memory and calls (key_averages) of one plain step."""
    from torch.profiler import ProfilerActivity, profile

    from workloads.device import synchronize

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, profile_memory=True) as prof:
        step()
        synchronize(device)
    field = "self_device_memory_usage" if device.type == "cuda" else "self_cpu_memory_usage"
    return {
        e.key: {"calls": e.count, "self_size_increase_bytes": int(getattr(e, field))}
        for e in prof.key_averages()
        if e.key.startswith("aten::")
    }


def pct(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "–"
    return f"{(a / b - 1) * 100:+.2f}%"


def gib(n: float | None) -> str:
    return "–" if n is None else f"{n / 2**30:.3f}"


def report(r: dict[str, Any]) -> list[str]:
    """The side-by-side lines of one case."""
    lines = [f"== {r['case']} on {r['device']} (capture {r['capture_s']:.1f} s)"]
    if "peak" in r:
        plain = r["max_memory_allocated"]
        lines.append(
            f"peak allocated GiB: capture {gib(r['peak'])} vs max_memory_allocated "
            f"{gib(plain)} ({pct(r['peak'], plain)})"
        )
        total = sum(r["at_peak"].values())
        lines.append(
            f"categories at the peak, summed: {gib(total)} vs peak {gib(r['peak'])} "
            f"({pct(total, r['peak'])}); "
            + ", ".join(f"{k} {gib(v)}" for k, v in r["at_peak"].items())
        )
        if r.get("graph"):
            g = r["graph"]
            lines.append(
                f"whole-step graph: its pool reserves {gib(g['cuda_graph_pool_bytes'])}"
                f" GiB; replays: max_memory_allocated {gib(g['peak_allocated_bytes'])},"
                f" held (with the pool's free bytes) {gib(g['peak_memory_bytes'])} vs "
                f"the captured step's peak {gib(r['peak'])}"
            )
    for key in ("parameters", "gradients", "optimizer_state"):
        got = r["capture_analytic"][key]
        at_peak = (r.get("at_peak") or {}).get(key)
        lines.append(
            f"{key}: analytic {gib(r['analytic'][key])} GiB; capture's tensors "
            f"{gib(got)} ({pct(got, r['analytic'][key])}); at the peak {gib(at_peak)}"
            f" ({pct(at_peak, r['analytic'][key])})"
        )
    ours = sum(r["capture_analytic"][k] for k in ("parameters", "gradients", "optimizer_state"))
    theirs = sum(r["analytic"][k] for k in ("parameters", "gradients", "optimizer_state"))
    lines.append(
        f"parameters + gradients + optimizer state: analytic {gib(theirs)} GiB; "
        f"capture's tensors {gib(ours)} ({pct(ours, theirs)})"
    )
    fwd = r.get("saved_at_backward_start")
    lines.append(
        f"saved activations alive when backward starts {gib(fwd)} GiB vs saved for "
        f"backward (own hooks) {gib(r['saved_independent'])} "
        f"({pct(fwd, r['saved_independent'])}); kept alive otherwise "
        f"{gib(r.get('kept_at_backward_start'))} GiB"
    )
    lines.append(
        f"saved for backward in the capture's step {gib(r['capture_saved'])} GiB vs "
        f"own hooks {gib(r['saved_independent'])} "
        f"({pct(r['capture_saved'], r['saved_independent'])})"
    )
    lines += op_lines(r["ops_capture"], r["ops_profiler"])
    return lines


def op_lines(ours: dict[str, dict[str, Any]], theirs: dict[str, dict[str, int]]) -> list[str]:
    """Per op (the ten with most bytes allocated): self size increase and calls, both sides;
    then how many ops agree exactly."""
    top = sorted(ours.values(), key=lambda r: -r["self_allocation_bytes"])[:10]
    lines = ["op | capture self increase | profiler self | capture calls | profiler calls"]
    for row in top:
        other = theirs.get(row["op"], {})
        lines.append(
            f"{row['op']} | {row['self_size_increase_bytes']} | "
            f"{other.get('self_size_increase_bytes', '–')} | {row['calls']} | "
            f"{other.get('calls', '–')}"
        )
    same = sum(
        1
        for op, row in ours.items()
        if op in theirs
        and theirs[op]["self_size_increase_bytes"] == row["self_size_increase_bytes"]
    )
    calls = sum(
        1 for op, row in ours.items() if op in theirs and theirs[op]["calls"] == row["calls"]
    )
    lines.append(
        f"ops whose self size increase matches exactly: {same} of {len(ours)}; "
        f"whose calls match: {calls}"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--cases", default=",".join(DEFAULT_CASES), help=f"comma-separated, of {', '.join(CASES)}"
    )
    p.add_argument("--out", type=Path, default=None, help="all figures as JSON")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a case, in this process
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_case(args.one)))
        return 0
    results, failed = [], 0
    for name in args.cases.split(","):
        done = subprocess.run(
            [sys.executable, __file__, "--one", name], capture_output=True, text=True, cwd=REPO
        )
        if done.returncode != 0:
            failed += 1
            print(f"== {name}: failed\n{done.stderr[-3000:]}")
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        print("\n".join(report(result)), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
