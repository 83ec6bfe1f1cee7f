#!/usr/bin/env bash
# Session 7, call N1: compile_blocks once vs each on the H100 (gradients, cold/warm compile,
# step times) and compiled captures of GPT small with the block compiled once (fixtures).
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
source gpu-kit/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used,temperature.gpu,clocks.sm --format=csv,noheader
python3 -c "import torch; print(torch.__version__)"
eval "$(python3 -c 'import os,sys; sys.path.insert(0,"."); from pipeline.bytecode import keep_bytecode; e=dict(os.environ); keep_bytecode(e); print("export PYTHONPYCACHEPREFIX="+e.get("PYTHONPYCACHEPREFIX","")); print("unset PYTHONDONTWRITEBYTECODE")')"
echo "prefix $PYTHONPYCACHEPREFIX"
# 1. gradients (3-layer small and 2.7B, bf16) + the 2.7B cold/warm compile and step time
TORCHINDUCTOR_CACHE_DIR=/tmp/ind-grads timeout 300 python3 benchmarks/compile_blocks.py \
  --grads small,2.7B --cases 2.7B_step_graph --repeats 2 --workdir /tmp \
  --out $OUT/compile_blocks_2.7B.json > $OUT/compile_blocks_2.7B.md 2> $OUT/compile_blocks_2.7B.log
echo "part 1 rc=$? at $(( $(date +%s) - t0 )) s"; cat $OUT/compile_blocks_2.7B.md
# 2. fixtures: the ladder's compile and cuda_graphs rungs of GPT small, block compiled once
for mode in default reduce-overhead; do
  stem=compiled_small_once_$mode
  mkdir -p $OUT/${stem}_torch_trace
  s=$(date +%s)
  env NSYS_NVTX_PROFILER_REGISTER_ONLY=0 TORCH_TRACE=$OUT/${stem}_torch_trace TORCHINDUCTOR_CACHE_DIR=/tmp/ind-fix \
    TORCH_WARM_POOL=0 timeout 120 nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node \
    --capture-range=nvtx --nvtx-capture=profiled_region --capture-range-end=stop --stats=false \
    --export=sqlite --force-overwrite=true -o $OUT/$stem \
    python3 -m workloads gpt --attention sdpa --batch 4 --compile $mode --compile_blocks once \
    --context 512 --device auto --dtype bf16 --mode train --optimizer adamw_fused \
    --sdpa_backend cudnn --seed 0 --size small --steps 3 --vocab 10000 --warmup 3 \
    --out $OUT/$stem.json > $OUT/$stem.log 2>&1
  echo "$stem rc=$? $(( $(date +%s) - s )) s"; tail -2 $OUT/$stem.log
  rm -f $OUT/$stem.nsys-rep
done
echo "part 2 at $(( $(date +%s) - t0 )) s"
# 3. GPT small: the cuda_graphs and step_graph rungs
left=$(( 575 - ($(date +%s) - t0) ))
TORCHINDUCTOR_CACHE_DIR=/tmp/ind-small timeout $left python3 benchmarks/compile_blocks.py \
  --cases small_step_graph,small_cuda_graphs --repeats 2 --workdir /tmp \
  --out $OUT/compile_blocks_small.json > $OUT/compile_blocks_small.md 2> $OUT/compile_blocks_small.log
echo "part 3 rc=$? at $(( $(date +%s) - t0 )) s"; cat $OUT/compile_blocks_small.md
du -sh $OUT/*
