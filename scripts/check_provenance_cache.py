"""Does an Inductor cache hit still give the analysis its kernel map?  (A check to run on a GPU.)

The pipeline compiles each compiled run in several processes (timing repeats, then the nsys
capture) with provenance tracking on in all of them (workloads/steps.py track_provenance),
so the capture usually loads its code from the Inductor cache the timing processes filled.
The analysis reads the capture's TORCH_TRACE: the generated code with its ``[Provenance
debug handles]`` and the kernel stack traces.  This script checks, on this machine's torch,
that a cache hit logs them as a fresh compile does:

  1. ``miss``: a process compiles the GPT train step into an empty cache, TORCH_TRACE on;
  2. ``hit``: a second process, same cache folder, TORCH_TRACE on;
  3. ``stale`` (``--stale``): a process WITHOUT provenance fills another empty cache, then
     ``stale-hit`` loads from it with provenance on (torch releases whose cache key lacks
     the provenance level serve the entry without it: no handles, no stack traces).

Per process it prints the cache events in the log, the compiled graphs, call sites,
provenance handles and call sites with stack traces, and whether the hit's graphs are the
miss's, call site for call site.  Usage, from the repository root on the GPU machine:

    python3 scripts/check_provenance_cache.py --size small --compile default --stale
    python3 scripts/check_provenance_cache.py --size small --compile reduce-overhead

``--device cpu`` runs the same on a CPU (C++ kernels instead of Triton; a smoke test).
Exit status 0 when the hit's kernel map equals the miss's, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.reading.torchtrace import log_files, read_torch_trace, records  # noqa: E402

CACHE_EVENTS = ("fx_graph_cache_miss", "fx_graph_cache_hit", "fx_graph_cache_bypass",
                "aotautograd_cache_miss", "aotautograd_cache_hit", "aotautograd_cache_bypass")


def child(args: argparse.Namespace) -> None:
    """One process: build the GPT train step and run a few steps (compiles or loads)."""
    import torch

    import workloads.steps as steps
    from workloads.device import configure_precision

    if args.no_provenance:
        steps.track_provenance = lambda: None  # what a process without it would compile
    device = torch.device(args.device)
    dtype = "bf16" if args.device == "cuda" else "fp32"
    configure_precision(dtype)
    cuda = args.device == "cuda"
    work = steps.build_gpt(
        size=args.size, context=args.context, batch=4, vocab=10_000, mode="train",
        dtype=dtype, attention="sdpa", device=device, seed=0,
        speed=steps.Speed(compile=args.compile, sdpa_backend="cudnn" if cuda else "auto",
                          optimizer="adamw_master"),
    )
    for _ in range(3):
        work.step()
    if cuda:
        torch.cuda.synchronize()


def summarize(trace: Path) -> dict[str, object]:
    """What the analysis would get from one TORCH_TRACE folder."""
    events: dict[str, int] = {}
    for path in log_files(trace):
        for meta, _ in records(path):
            art = meta.get("artifact")
            name = art.get("name") if isinstance(art, dict) else None
            if name in CACHE_EVENTS:
                events[name] = events.get(name, 0) + 1
    graphs = read_torch_trace(trace)
    sites = [s for g in graphs for s in g.sites]
    return {
        "cache_events": events,
        "graphs": [f"{g.aot_id} ({g.function}, {len(g.sites)} sites)" for g in graphs],
        "call_sites": len(sites),
        "sites_with_stack_traces": sum(1 for s in sites if s.stack_traces),
        "sites_with_aten_ops": sum(1 for s in sites if s.aten_ops),
        "kernel_map": sorted((g.aot_id, tuple(s.handle for s in g.sites)) for g in graphs),
    }


def run_child(args: argparse.Namespace, cache: Path, trace: Path, provenance: bool) -> None:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TORCH_TRACE": str(trace)}
    env.pop("INDUCTOR_PROVENANCE", None)
    cmd = [sys.executable, __file__, "--child", "--size", args.size, "--compile", args.compile,
           "--device", args.device, "--context", str(args.context)]
    if not provenance:
        cmd.append("--no-provenance")
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="small")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--compile", default="default",
                   choices=("default", "reduce-overhead", "max-autotune-no-cudagraphs"))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--stale", action="store_true",
                   help="also: a cache filled without provenance, then loaded with it")
    p.add_argument("--keep", type=Path, default=None, help="keep the caches and traces here")
    p.add_argument("--out", type=Path, default=None, help="write the summary as JSON")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-provenance", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    import torch

    work = args.keep or Path(tempfile.mkdtemp(prefix="provenance-cache-"))
    work.mkdir(parents=True, exist_ok=True)
    plan = [("miss", "cache", True), ("hit", "cache", True)]
    if args.stale:
        plan += [("stale", "stale-cache", False), ("stale-hit", "stale-cache", True)]
    result: dict[str, object] = {"torch": torch.__version__, "size": args.size,
                                 "compile": args.compile, "device": args.device}
    for label, cache, provenance in plan:
        trace = work / f"trace-{label}"
        run_child(args, work / cache, trace, provenance)
        result[label] = summarize(trace)
    same = result["hit"]["kernel_map"] == result["miss"]["kernel_map"]
    traced = result["hit"]["sites_with_stack_traces"] == result["miss"]["call_sites"] > 0
    result["hit_has_the_kernel_map"] = bool(same and traced)
    for label, *_ in plan:
        info = dict(result[label])
        info.pop("kernel_map")
        print(f"{label:9s} {json.dumps(info)}")
    print(f"torch {torch.__version__}: cache hit gives the same kernel map with stack traces: "
          f"{'YES' if result['hit_has_the_kernel_map'] else 'NO'}")
    if args.stale:
        stale = result["stale-hit"]
        print(f"stale entry (made without provenance) loaded with provenance on: "
              f"{stale['call_sites']} call sites, {stale['sites_with_stack_traces']} with "
              "stack traces")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"caches and traces in {work}")
    return 0 if result["hit_has_the_kernel_map"] else 1


if __name__ == "__main__":
    sys.exit(main())
