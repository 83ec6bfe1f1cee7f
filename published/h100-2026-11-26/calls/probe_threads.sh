#!/usr/bin/env bash
# Does a compiled attention cell's cold compile pay for starting Inductor's compile workers?
# Cold (empty cache) then warm, with the default compile threads and with one (in process).
cd "$(dirname "$0")/.."
W=/tmp/probe-threads; rm -rf $W; mkdir -p $W
cells=("--impl sdpa --sdpa_backend cudnn --head_dim 128 --seq 1024 --mode forward_backward"
       "--impl naive --head_dim 128 --seq 1024 --mode forward_backward")
for c in 0 1; do
  for threads in default 1; do
    for temp in cold warm; do
      env=(TORCHINDUCTOR_CACHE_DIR=$W/cache-$c-$threads TORCH_WARM_POOL=0 PYTORCH_NVML_BASED_CUDA_CHECK=1)
      [ $threads = 1 ] && env+=(TORCHINDUCTOR_COMPILE_THREADS=1)
      t=$(date +%s.%N)
      env "${env[@]}" python3 -m workloads attention_core ${cells[$c]} --batch 8 --heads 1 --causal true \
        --dtype bf16 --compile default --warmup 3 --steps 6 --out $W/r-$c-$threads-$temp.json >/dev/null 2>&1
      wall=$(python3 -c "import time; print(round(time.time() - $t, 2))")
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('cell', $c, 'threads', '$threads', '$temp', 'compile_s', round(d.get('compile_s') or -1, 2), 'median_ms', d.get('median_ms'), 'wall', $wall)" $W/r-$c-$threads-$temp.json
    done
  done
done
