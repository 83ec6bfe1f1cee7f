#!/usr/bin/env bash
# FP8 on one Hopper GPU, in one call: torchao's plain recipe (benchmarks/fp8_plain.py) on the
# CS336 GPT 2.7B, then config/fp8.yaml through the pipeline (scripts/run-on-host.sh), the
# 2.7B runs first (the batch-4 ladder, the sweep's batches 16 and 32), then the whole-step
# graph pairs, the sweep's batch 8 and the GPT small, GPT-2 and Llama ladders while time is
# left. Everything lands in ARCHIVE_DIR (default $OUT): fp8_plain.json, the pipeline's
# results.tgz and fp8_vs_plain.json (benchmarks/fp8_vs_plain.py); a second call with
# RESUME_DIR=<that folder> runs only what is missing.
#
#   ARCHIVE_DIR=$OUT bash scripts/fp8-on-gpu.sh [TIME_LIMIT_S]     # default 480
#
# torchao: the installed one, else the wheel FP8_WHEEL (default: .whl/torchao-0.18.0-*.whl or
# gpu-kit/wheelhouse/torchao-0.18.0-*.whl), installed offline into /tmp/profbench-fp8.
set -u
cd "$(dirname "$0")/.."
limit=${1:-480}
start=$(date +%s)
out=${ARCHIVE_DIR:-${OUT:-results/fp8-archive}}
mkdir -p "$out"
[ -f gpu-kit/setup.sh ] && source gpu-kit/setup.sh >/dev/null 2>&1
if ! python3 -c 'import torchao' 2>/dev/null; then
  wheel=${FP8_WHEEL:-$(ls .whl/torchao-0.18.0-*.whl gpu-kit/wheelhouse/torchao-0.18.0-*.whl \
    2>/dev/null | head -1)}
  if [ -z "$wheel" ]; then
    echo "no torchao here and no torchao 0.18.0 wheel (FP8_WHEEL): FP8 runs would be unsupported"
    exit 1
  fi
  python3 -m pip install -q --no-deps --no-index --target /tmp/profbench-fp8 "$wheel" \
    2>&1 | grep -v WARN | tail -2
  export PYTHONPATH=/tmp/profbench-fp8${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c 'import torch, torchao; print("torch", torch.__version__, "torchao", torchao.__version__)' \
  2>&1 | grep -v "Failed to load\|register_constant"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
resume=${RESUME_DIR:-$out}  # an earlier call's ARCHIVE_DIR: only what is missing runs
# The plain recipe: bf16, tensorwise, rowwise on one seed, each block compiled on its own as
# the pipeline's runs (compile_blocks: regional); once per results.
if [ -f "$resume/fp8_plain.json" ]; then
  [ "$resume/fp8_plain.json" -ef "$out/fp8_plain.json" ] || cp "$resume/fp8_plain.json" "$out/"
else
  python3 benchmarks/fp8_plain.py --size 2.7B --batch 4 --context 512 --compile regional \
    --warmup 5 --steps 20 --out "$out/fp8_plain.json" 2>&1 \
    | grep -v "Failed to load\|register_constant\|_pytree"
  echo "plain script: $(( $(date +%s) - start )) s"
fi
# The pipeline in two selections of config/fp8.yaml; both write results/fp8.
part() {  # part NAME PATTERN...: the config with `select` set, for run-on-host.sh
  python3 - "$@" <<'EOF'
import sys, yaml
name, patterns = sys.argv[1], sys.argv[2:]
cfg = yaml.safe_load(open("config/fp8.yaml"))
cfg["select"] = patterns
open(f"/tmp/profbench-fp8-{name}.yaml", "w").write(yaml.safe_dump(cfg, sort_keys=False))
EOF
  echo "/tmp/profbench-fp8-$1.yaml"
}
set -f  # the patterns are for Snakemake, not the shell
for selection in "big gpt_fp8_2.7B_* fp8_sweep_2.7B_b16_* fp8_sweep_2.7B_b32_*" \
  "rest gpt_fp8_graph_* fp8_sweep_2.7B_b8_* gpt_fp8_small_* gpt2_fp8_* llama_fp8_*"; do
  left=$(( limit - ($(date +%s) - start) ))
  if [ "$left" -lt 60 ]; then echo "no time left for: $selection"; break; fi
  # shellcheck disable=SC2086 # the selection's words are its name and patterns
  config=$(part $selection)
  ARCHIVE_DIR=$out RESUME_DIR=$resume bash scripts/run-on-host.sh "$config" "$left"
  resume=$out  # the second selection resumes from the first's archive
done
# Acceptance: each 2.7B rung against the plain recipe (within 5%), FP8 losses against bf16's
python3 benchmarks/fp8_vs_plain.py --results results/fp8 --plain "$out/fp8_plain.json" \
  --out "$out/fp8_vs_plain.json"
echo "total: $(( $(date +%s) - start )) s"
