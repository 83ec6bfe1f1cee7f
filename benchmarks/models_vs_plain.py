"""config/models.yaml's best rungs beside a plain best-practice script of the same models, in one
run on one machine: the ratio profbench's step / the plain script's step, per model.

    python benchmarks/models_vs_plain.py                 # ResNet-50 and GPT-2, 3 rounds
    python benchmarks/models_vs_plain.py --rounds 5 --out models_vs_plain.json

Each round times every model once each way, alternating, each its own process: profbench's
best rung untraced, exactly as the pipeline's timing job runs it (``python -m workloads model``
with the rung's flags, from the resolved config), and benchmarks/plain_models.py (bf16
autocast, channels-last, fused AdamW, torch.compile, cuDNN autotuning; no profbench code).
Each process's median step is one sample; the printed ratio is the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.config import load, workload_args  # noqa: E402

# model -> (the ladder whose last rung is profbench's best, the plain script's flags)
MODELS = {
    "resnet50": ("resnet50_train", ["--model", "resnet", "--depth", "50", "--batch", "64"]),
    "gpt2": ("gpt2_train", ["--model", "gpt2", "--batch", "8", "--context", "1024"]),
}


def best_rung(config: Path, ladder: str) -> tuple[str, dict]:
    plan = load(config)
    rungs = [(name, info) for name, info in plan.ladders.items() if info["ladder"] == ladder]
    name = max(rungs, key=lambda item: item[1]["rung_index"])[0]
    return name, plan.runs[name]


def median_ms(cmd: list[str], out: Path) -> float:
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"failed: {shlex.join(cmd)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return float(json.loads(out.read_text())["median_ms"])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "config" / "models.yaml")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=None,
                   help="measured steps of both (default: the rung's; the plain script's 20)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            ladder, plain_flags = MODELS[model]
            run, params = best_rung(args.config, ladder)
            steps = args.steps or params.get("steps", 10)
            ours = [sys.executable, "-m", "workloads", *shlex.split(workload_args(params))]
            ours += ["--steps", str(steps)]
            plain = [sys.executable, str(REPO / "benchmarks" / "plain_models.py"), *plain_flags,
                     "--steps", str(steps)]
            samples: dict[str, list[float]] = {"profbench": [], "plain": []}
            for i in range(args.rounds):
                out = Path(tmp) / f"{model}-{i}"
                samples["plain"].append(median_ms([*plain, "--out", f"{out}-plain.json"],
                                                  Path(f"{out}-plain.json")))
                samples["profbench"].append(median_ms([*ours, "--out", f"{out}-ours.json"],
                                                      Path(f"{out}-ours.json")))
            ratio = statistics.median(o / q for o, q in zip(samples["profbench"],
                                                            samples["plain"], strict=True))
            result[model] = {"run": run, "profbench_cmd": shlex.join(ours),
                             "plain_cmd": shlex.join(plain), **samples, "ratio": ratio}
            print(f"{model}: profbench {run} {statistics.median(samples['profbench']):.2f} ms "
                  f"{samples['profbench']}, plain {statistics.median(samples['plain']):.2f} ms "
                  f"{samples['plain']}: ratio {ratio:.3f}", flush=True)
            if args.out:  # after each model: a run cut short keeps what it measured
                args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
