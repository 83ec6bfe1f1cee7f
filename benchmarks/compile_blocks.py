"""How the GPT compiles its layers (``--compile_blocks``): every layer traced into one flat
graph (``each``), the block a nested compile region reused by every layer (``once``), or each
layer's block compiled on its own with the layer loop eager (``regional``): cold and warm
compile time, and the step time.

For each case and each of ``--settings``, side by side in one run:

* a **cold** process: ``python -m workloads gpt ...`` with an empty Inductor and Triton cache
  of its own (``TORCHINDUCTOR_CACHE_DIR``), as on a fresh machine: its ``compile_s`` is the
  whole compilation;
* ``--repeats - 1`` **warm** processes on the cache the cold one left, as the pipeline's
  later timing repeats and its capture run.

The settings alternate process by process (each cold, once cold, each warm, once warm,
...), so drift in clocks or temperature hits all of them. Step times are each process's own median
(CUDA events on a GPU); the table shows the median over a setting's processes.

    python benchmarks/compile_blocks.py                      # the ladder's compiled rungs
    python benchmarks/compile_blocks.py --cases small_compile --repeats 3
    python benchmarks/compile_blocks.py --settings once,regional --cases 2.7B_fwd_bwd_best
    python benchmarks/compile_blocks.py --device cpu --cases tiny --repeats 2 --grads tiny

``--grads SIZES`` first checks, in a child process of its own (so that it holds no GPU memory
while the timed processes run), that each setting's compiled gradients equal eager ones, and
shows what the nested region's gradients are without its Inductor options.

Prints one row per case and setting: cold and warm compile seconds and the median step ms,
with their ratios to the first setting's; ``--out`` keeps every record.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.bytecode import keep_bytecode  # noqa: E402

SETTINGS = ("each", "once", "regional")
_LADDER = "--mode train --dtype bf16 --attention sdpa --sdpa_backend cudnn --context 512 --batch 4"
# name -> the rung's workload flags (config.yaml's ladders)
CASES = {
    "small_compile": f"--size small {_LADDER} --optimizer adamw_fused --compile default",
    "small_cuda_graphs": f"--size small {_LADDER} --optimizer adamw_fused "
                         "--compile reduce-overhead",
    "2.7B_compile": f"--size 2.7B {_LADDER} --optimizer adamw_fused --compile default",
    "2.7B_master_weights": f"--size 2.7B {_LADDER} --optimizer adamw_master --compile default",
    "2.7B_step_graph": f"--size 2.7B {_LADDER} --optimizer adamw_master --compile default "
                       "--cuda_graph step",
    # config/full.yaml's CS336 sweep at the best rung's settings (one CUDA graph per step)
    **{f"{size}_{tag}_best": f"--size {size} --mode {mode} --dtype bf16 --attention sdpa "
       "--sdpa_backend cudnn --context 512 --batch 4 --compile default --cuda_graph step"
       for size in ("small", "xl", "2.7B")
       for tag, mode in (("fwd", "forward"), ("fwd_bwd", "forward_backward"))},
    # CPU smoke case (tests, a machine without a GPU)
    "tiny": "--size tiny --mode train --context 64 --vocab 512 --compile default",
}
DEFAULT_CASES = ("small_cuda_graphs", "2.7B_compile")


def run_process(case: str, setting: str, cache: Path, args: argparse.Namespace,
                out: Path) -> dict:
    """One ``python -m workloads gpt`` process; its record plus the process's wall time."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1")
    env.pop("TRITON_CACHE_DIR", None)  # Triton's cache then lives in the Inductor one
    keep_bytecode(env)  # hosts whose torch has no bytecode would compile it in every process
    cmd = [sys.executable, "-m", "workloads", "gpt", *CASES[case].split(),
           "--compile_blocks", setting, "--warmup", str(args.warmup), "--steps", str(args.steps),
           "--device", args.device, "--out", str(out)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    record = json.loads(out.read_text()) if out.exists() else {}
    if proc.returncode or record.get("status") != "ok":
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        print(f"  {case} {setting}: exit {proc.returncode}, status {record.get('status')}: "
              + " | ".join(tail), file=sys.stderr)
    return {"case": case, "setting": setting, "wall_s": round(wall, 2),
            "status": record.get("status", "no record"), "compile_s": record.get("compile_s"),
            "median_ms": record.get("median_ms"), "losses": record.get("losses"),
            "peak_memory_bytes": record.get("peak_memory_bytes"),
            "device_name": record.get("device_name"), "torch": record.get("torch")}


def run_case(case: str, args: argparse.Namespace, work: Path) -> list[dict]:
    """Cold then warm processes of every setting, alternating."""
    caches = {s: work / f"inductor-{case}-{s}" for s in args.settings}
    rows = []
    for repeat in range(args.repeats):
        for setting in args.settings:
            row = run_process(case, setting, caches[setting], args,
                              work / f"{case}-{setting}-r{repeat}.json")
            row["cold"] = repeat == 0
            rows.append(row)
            print(f"  {case} {setting} {'cold' if repeat == 0 else 'warm'}: "
                  f"compile {row['compile_s']} s, median {row['median_ms']} ms, "
                  f"wall {row['wall_s']} s", file=sys.stderr)
    return rows


def summarize(case: str, rows: list[dict], settings: tuple[str, ...]) -> list[dict]:
    """Per setting: cold and warm compile seconds and median step ms, with ratios to the first
    setting's."""
    def values(setting: str, key: str, cold: bool | None = None) -> list[float]:
        return [r[key] for r in rows if r["setting"] == setting and r[key] is not None
                and r["status"] == "ok" and (cold is None or r["cold"] is cold)]

    def median(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    def ratio(base: float | None, x: float | None) -> float | None:
        return round(x / base, 3) if base and x is not None else None

    out = []
    for setting in settings:
        losses = [r["losses"] for r in rows if r["setting"] == setting and r["losses"]]
        out.append({
            "case": case, "setting": setting,
            "cold_compile_s": median(values(setting, "compile_s", cold=True)),
            "warm_compile_s": median(values(setting, "compile_s", cold=False)),
            "median_ms": median(values(setting, "median_ms")),
            "processes": len(values(setting, "median_ms")),
            # shown, not compared: training here is not bitwise reproducible between processes
            "last_loss": losses[0][-1] if losses else None})
    for s in out:
        for key in ("cold_compile_s", "warm_compile_s", "median_ms"):
            s[f"{key}_ratio"] = ratio(out[0][key], s[key])
    return out


GRAD_SETTINGS = ("each", "once", "once without NESTED_REGION_OPTIONS", "regional")


def gradient_errors(size: str, device: str, layers: int = 3) -> list[dict]:
    """Each setting's compiled gradients against eager ones, in this process: the worst
    parameter's |compiled - eager| / max|eager|, for a ``layers``-layer model of ``size``
    (bf16 autocast on CUDA, fp32 on a CPU; SDPA's default backend)."""
    import torch
    import torch.nn.functional as F

    from workloads.device import autocast, resolve_device
    from workloads.gpt import GPT, config_for
    from workloads.models.builder import compile_regional
    from workloads.models.parts import compile_once
    from workloads.steps import NESTED_REGION_OPTIONS, compile_callable

    dev = resolve_device(device)
    dtype = "bf16" if dev.type == "cuda" else "fp32"
    rows = []
    for setting in GRAD_SETTINGS:
        torch._dynamo.reset()
        blocks = setting.split()[0]
        torch.manual_seed(0)
        with torch.device(dev):
            model = GPT(config_for(size, n_layers=layers, context_length=256))
        if blocks == "once":
            compile_once(list(model.layers))
        tokens = torch.randint(0, model.cfg.vocab_size, (2, 256),
                               generator=torch.Generator().manual_seed(1)).to(dev)
        options = NESTED_REGION_OPTIONS if setting == "once" else None
        grads = []
        for compiled in (False, True):
            if not compiled:
                fn = model
            elif blocks == "regional":
                compile_regional(list(model.layers), "default")  # in place
            else:
                fn = compile_callable(model, "default", options)
            model.zero_grad(set_to_none=True)
            with autocast(dev, dtype):
                logits = fn(tokens)
            F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()
            grads.append({n: p.grad.float().clone() for n, p in model.named_parameters()})
        eager, compiled = grads
        worst = max(((compiled[n] - g).abs().max().item() / g.abs().max().item(), n)
                    for n, g in eager.items())
        rows.append({"size": size, "layers": layers, "dtype": dtype, "setting": setting,
                     "worst_rel_error": worst[0], "worst_parameter": worst[1],
                     "torch": torch.__version__})
        print(f"  grads {size} x{layers} {setting}: worst {worst[0]:.2e} ({worst[1]})",
              file=sys.stderr)
    return rows


def gradients_in_child(sizes: str, device: str) -> list[dict]:
    """:func:`gradient_errors` in a child process, so that no memory it held on the GPU is
    still held while the timed processes run."""
    proc = subprocess.run([sys.executable, __file__, "--grads", sizes, "--grads-here",
                           "--device", device], cwd=ROOT, capture_output=True, text=True)
    sys.stderr.write(proc.stderr[-4000:] if proc.returncode else "")
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else []


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def print_table(summaries: list[dict]) -> None:
    print("| case | setting | cold compile s | ratio | warm compile s | ratio | median ms "
          "| ratio | processes | last loss |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in summaries:
        print(f"| {s['case']} | {s['setting']} | {fmt(s['cold_compile_s'], 1)} | "
              f"{fmt(s['cold_compile_s_ratio'], 3)} | {fmt(s['warm_compile_s'], 1)} | "
              f"{fmt(s['warm_compile_s_ratio'], 3)} | {fmt(s['median_ms'], 3)} | "
              f"{fmt(s['median_ms_ratio'], 3)} | {s['processes']} | "
              f"{fmt(s['last_loss'], 4)} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default=",".join(DEFAULT_CASES),
                   help=f"comma-separated, from {sorted(CASES)}")
    p.add_argument("--settings", default="each,once",
                   help=f"comma-separated, from {list(SETTINGS)}; ratios are to the first")
    p.add_argument("--repeats", type=int, default=2, help="processes per setting (1 cold)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the caches and records go (default: a temporary folder)")
    p.add_argument("--out", type=Path, default=None, help="every record and the summary, JSON")
    p.add_argument("--grads", default="",
                   help="comma-separated sizes whose compiled gradients are first checked "
                        "against eager ones for every setting (3-layer models)")
    p.add_argument("--grads-here", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    if unknown := [c for c in cases if c not in CASES]:
        p.error(f"unknown case(s) {unknown}; expected some of {sorted(CASES)}")
    args.settings = tuple(x for x in args.settings.split(",") if x)
    if unknown := [x for x in args.settings if x not in SETTINGS]:
        p.error(f"unknown setting(s) {unknown}; expected some of {list(SETTINGS)}")
    if args.repeats < 1:
        p.error("--repeats must be at least 1 (the cold process)")
    if args.grads_here:  # the child of --grads: rows as JSON on stdout
        rows = [row for size in args.grads.split(",") if size
                for row in gradient_errors(size, args.device)]
        print(json.dumps(rows))
        return 0
    grads = gradients_in_child(args.grads, args.device) if args.grads else []
    if grads:
        print("| size | setting | worst relative gradient error | parameter |")
        print("|---|---|---|---|")
        for g in grads:
            print(f"| {g['size']} x{g['layers']} {g['dtype']} | {g['setting']} | "
                  f"{g['worst_rel_error']:.2e} | {g['worst_parameter']} |")
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        rows = [row for case in cases for row in run_case(case, args, Path(tmp))]
    summaries = [s for c in cases
                 for s in summarize(c, [r for r in rows if r["case"] == c], args.settings)]
    print_table(summaries)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summaries, "processes": rows,
                                        "gradients": grads}, indent=2) + "\n")
    failed = [r for r in rows if r["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
