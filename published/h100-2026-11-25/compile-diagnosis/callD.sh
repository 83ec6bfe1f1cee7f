#!/usr/bin/env bash
# Call D (issue 20): where a warm-cache compiled timing process spends its compile, on the H100.
# Each case: a cold process (fills a fresh Inductor cache), then two warm ones (the second under
# cProfile). Cases: a compiled attention cell (naive, bf16, fwd+bwd), the cuDNN SDPA cell,
# GPT small's compile rung (train, bf16, cuDNN, fused AdamW), GPT small's whole-step graph rung,
# CS336 2.7B forward at the best settings.
set -u
cd "$(dirname "$0")/.."
source gpu-kit/setup.sh >/dev/null 2>&1
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
eval "$(python3 -c 'import os,sys; sys.path.insert(0,"."); from pipeline.bytecode import keep_bytecode; e=dict(os.environ); keep_bytecode(e); print("export PYTHONPYCACHEPREFIX="+e.get("PYTHONPYCACHEPREFIX","")); print("unset PYTHONDONTWRITEBYTECODE")')"
export OMP_NUM_THREADS=1 TORCH_WARM_POOL=0 PYTORCH_NVML_BASED_CUDA_CHECK=1
mkdir -p $OUT/d
t0=$(date +%s)
run_case() {
  name=$1; shift
  d=$(mktemp -d /tmp/diagw-XXXX)
  for k in cold warm prof; do
    p=""; [ $k = prof ] && p=$OUT/d/$name.pstats
    TORCHINDUCTOR_CACHE_DIR=$d PROFILE=$p timeout 240 python3 gpu-out/diag_warm.py "$@" --out $OUT/d/$name-$k.json > $OUT/d/$name-$k.log 2>&1
    echo "$name $k rc=$? t=$(( $(date +%s) - t0 )) s: $(grep '^==' $OUT/d/$name-$k.log) compile_s=$(python3 -c "import json;d=json.load(open('$OUT/d/$name-$k.json'));print(d.get('compile_s'), d.get('cuda_graph_capture_s'), d.get('median_ms'))" 2>&1 | tail -1)"
  done
  grep -A26 "^==" $OUT/d/$name-warm.log | sed -n 4,30p
}
run_case attn_naive attention_core --impl naive --batch 8 --heads 1 --seq 4096 --head-dim 64 --causal true --dtype bf16 --mode forward_backward --compile default --warmup 3 --steps 6
run_case attn_cudnn attention_core --impl sdpa --sdpa-backend cudnn --batch 8 --heads 1 --seq 1024 --head-dim 128 --causal true --dtype bf16 --mode forward --compile default --warmup 3 --steps 6
run_case small_compile gpt --size small --mode train --dtype bf16 --attention sdpa --sdpa-backend cudnn --optimizer adamw_fused --compile default --compile-blocks once --warmup 3 --steps 6
run_case small_stepgraph gpt --size small --mode train --dtype bf16 --attention sdpa --sdpa-backend cudnn --optimizer adamw_master --compile default --cuda-graph step --compile-blocks once --warmup 3 --steps 6
run_case big_fwd_best gpt --size 2.7B --mode forward --dtype bf16 --attention sdpa --sdpa-backend cudnn --compile default --cuda-graph step --compile-blocks once --warmup 3 --steps 6
cd $OUT && tar czf d.tgz d && rm -rf d
