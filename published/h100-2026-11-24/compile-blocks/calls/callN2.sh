#!/usr/bin/env bash
# Session 7, call N2: compile_blocks once vs each on the H100 (GPT small cuda_graphs rung, 2.7B
# compile rung; cold and warm compile, step time) and compiled captures of GPT small with the
# block compiled once (fixtures, one archive).
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
source gpu-kit/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used,temperature.gpu,clocks.sm --format=csv,noheader
python3 -c "import torch; print(torch.__version__)"
eval "$(python3 -c 'import os,sys; sys.path.insert(0,"."); from pipeline.bytecode import keep_bytecode; e=dict(os.environ); keep_bytecode(e); print("export PYTHONPYCACHEPREFIX="+e.get("PYTHONPYCACHEPREFIX","")); print("unset PYTHONDONTWRITEBYTECODE")')"
mkdir -p $OUT/fix
for mode in default reduce-overhead; do
  stem=compiled_small_once_$mode
  s=$(date +%s)
  env NSYS_NVTX_PROFILER_REGISTER_ONLY=0 TORCH_TRACE=/tmp/trace_$mode TORCHINDUCTOR_CACHE_DIR=/tmp/ind-fix \
    TORCH_WARM_POOL=0 timeout 120 nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node \
    --capture-range=nvtx --nvtx-capture=profiled_region --capture-range-end=stop --stats=false \
    --export=sqlite --force-overwrite=true -o $OUT/fix/$stem \
    python3 -m workloads gpt --attention sdpa --batch 4 --compile $mode --compile_blocks once \
    --context 512 --device auto --dtype bf16 --mode train --optimizer adamw_fused \
    --sdpa_backend cudnn --seed 0 --size small --steps 3 --vocab 10000 --warmup 3 \
    --out $OUT/fix/$stem.json > $OUT/fix/$stem.log 2>&1
  echo "$stem rc=$? $(( $(date +%s) - s )) s"; grep "ms/step" $OUT/fix/$stem.log
  rm -f $OUT/fix/$stem.nsys-rep
  python3 gpu-out/trim_torch_trace.py /tmp/trace_$mode $OUT/fix/${stem}_torch_trace
done
tar czf $OUT/fixtures.tgz -C $OUT fix && rm -rf $OUT/fix
echo "fixtures at $(( $(date +%s) - t0 )) s"
left=$(( 580 - ($(date +%s) - t0) ))
TORCHINDUCTOR_CACHE_DIR=/tmp/ind-bench timeout $left python3 benchmarks/compile_blocks.py \
  --cases 2.7B_compile,small_cuda_graphs --repeats 2 --workdir /tmp \
  --out $OUT/compile_blocks.json > $OUT/compile_blocks.md 2> $OUT/compile_blocks.log
echo "benchmark rc=$? at $(( $(date +%s) - t0 )) s"; cat $OUT/compile_blocks.md; grep -v Warn $OUT/compile_blocks.log | grep "^  " | tail -12
ls -la $OUT
