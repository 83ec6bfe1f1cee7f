"""The optimization ladder on a GPU: one untraced ``python -m workloads`` process per rung.

GPT train steps (fp32 eager -> tf32 -> bf16 autocast -> fused AdamW -> cuDNN SDPA ->
torch.compile -> CUDA graphs -> flat master-weight AdamW), then the attention_core kernels at
d=128, seq 4096, bf16 forward. Each rung is just run keys on top of the previous rung, so any
combination can be run by hand. Prints a table (median CUDA-event ms, x vs previous, TFLOP/s).

    python benchmarks/gpu_ladder.py --sizes small,2.7B --out-dir ladder/
    python benchmarks/gpu_ladder.py --only attention
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# (label, keys added on top of the previous rung)
GPT_RUNGS: list[tuple[str, dict[str, str]]] = [
    ("fp32 eager", {"dtype": "fp32"}),
    ("tf32", {"dtype": "tf32"}),
    ("bf16 autocast", {"dtype": "bf16"}),
    ("+ fused AdamW", {"optimizer": "adamw_fused"}),
    ("+ cuDNN SDPA", {"sdpa_backend": "cudnn"}),
    ("+ compile default", {"compile": "default"}),
    ("+ reduce-overhead", {"compile": "reduce-overhead"}),
    ("+ master-weight AdamW", {"optimizer": "adamw_master"}),
]
GPT_BASE = {"mode": "train", "batch": "4", "context": "512", "vocab": "10000"}
# Each backend on its own (not cumulative); `naive` is the op-by-op reference.
ATTENTION_CASES: list[tuple[str, dict[str, str]]] = [
    ("naive (matmul+softmax)", {"impl": "naive"}),
    ("sdpa math", {"sdpa_backend": "math"}),
    ("sdpa efficient", {"sdpa_backend": "efficient"}),
    ("sdpa flash", {"sdpa_backend": "flash"}),
    ("sdpa cudnn", {"sdpa_backend": "cudnn"}),
    ("sdpa auto", {"sdpa_backend": "auto"}),
]
ATTENTION_BASE = {
    "impl": "sdpa", "batch": "8", "heads": "16", "seq": "4096", "head_dim": "128",
    "dtype": "bf16", "mode": "forward", "causal": "false",
}


def run_workload(workload: str, keys: dict[str, str], out: Path, timeout: int) -> dict[str, Any]:
    """One untraced run in its own process; its JSON (or a synthesized error record)."""
    cmd = [sys.executable, "-m", "workloads", workload, "--out", str(out)]
    for key, value in keys.items():
        cmd += [f"--{key}", value]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "message": f"over {timeout} s", "cmd": cmd}
    result = json.loads(out.read_text()) if out.is_file() else {"status": "error"}
    result.setdefault("message", "\n".join(tail))
    result["cmd"] = cmd
    result["process_s"] = time.perf_counter() - start
    if result.get("status") != "ok":
        print(f"  {out.stem}: {result.get('status')}: {result.get('message', '')[:300]}")
    return result


def ladder(
    workload: str, rungs: list[tuple[str, dict[str, str]]], base: dict[str, str], *,
    cumulative: bool, out_dir: Path, prefix: str, timeout: int,
) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    rows, keys = [], dict(base)
    for index, (label, added) in enumerate(rungs):
        keys = {**keys, **added} if cumulative else {**base, **added}
        out = out_dir / f"{prefix}_{index}.json"
        result = run_workload(workload, keys, out, timeout)
        rows.append((label, dict(keys), result))
        print(format_row(label, result, rows[-2][2] if len(rows) > 1 else None), flush=True)
    return rows


def format_row(label: str, result: dict[str, Any], previous: dict[str, Any] | None) -> str:
    if result.get("status") != "ok":
        return f"| {label:<24} | {result.get('status'):>9} |       |        |         |"
    ms = result["median_ms"]
    speedup = ""
    if previous and previous.get("status") == "ok":
        speedup = f"{previous['median_ms'] / ms:5.2f}x"
    compile_s = result.get("compile_s")
    flags = ",".join(result.get("gpu_state", {}).get("flags", []) or [])
    return (
        f"| {label:<24} | {ms:9.2f} | {speedup:>5} | {result['tflops']:6.1f} | "
        f"{'' if compile_s is None else f'{compile_s:6.1f}':>7} | {flags}"
    )


HEADER = (
    "| rung                     | median ms |  x    | TFLOP/s | compile_s | gpu flags\n"
    "| ---                      | ---       | ---   | ---     | ---       | ---"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,2.7B")
    parser.add_argument("--only", choices=("gpt", "attention", "all"), default="all")
    parser.add_argument("--out-dir", type=Path, default=Path("gpu-out/ladder"))
    parser.add_argument("--steps", default="20")
    parser.add_argument("--warmup", default="5")
    parser.add_argument("--timeout", type=int, default=400, help="seconds per process")
    parser.add_argument("--from-rung", type=int, default=0, help="skip the first rungs")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    timing = {"steps": args.steps, "warmup": args.warmup, "device": "cuda"}
    tables: dict[str, list] = {}
    if args.only in ("gpt", "all"):
        for size in args.sizes.split(","):
            print(f"\nGPT {size} train, batch 4, context 512, vocab 10k\n{HEADER}", flush=True)
            base = {**GPT_BASE, **timing, "size": size}
            rungs = GPT_RUNGS
            if args.from_rung:  # start from the keys the skipped rungs had accumulated
                for _, added in GPT_RUNGS[: args.from_rung]:
                    base.update(added)
                rungs = GPT_RUNGS[args.from_rung :]
            tables[f"gpt_{size}"] = ladder(
                "gpt", rungs, base, cumulative=True, out_dir=args.out_dir,
                prefix=f"gpt_{size}", timeout=args.timeout,
            )
    if args.only in ("attention", "all"):
        print(f"\nattention_core b8 h16 s4096 d128 bf16 forward\n{HEADER}", flush=True)
        tables["attention_core"] = ladder(
            "attention_core", ATTENTION_CASES, {**ATTENTION_BASE, **timing},
            cumulative=False, out_dir=args.out_dir, prefix="attention_core",
            timeout=args.timeout,
        )
    summary = {
        name: [{"rung": label, "keys": keys, "status": r.get("status"),
                "median_ms": r.get("median_ms"), "tflops": r.get("tflops"),
                "compile_s": r.get("compile_s"), "message": r.get("message")}
               for label, keys, r in rows]
        for name, rows in tables.items()
    }
    (args.out_dir / "ladder.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
