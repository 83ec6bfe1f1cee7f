#!/usr/bin/env bash
# Call R: adamw_master's segment update compiled without pointwise autotuning (B, the change)
# against with it (A, as before), 2.7B bf16 compile_blocks once, cold caches, side by side.
set -u
cd "$(dirname "$0")/.."
source gpu-kit/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1
eval "$(python3 -c 'import os,sys; sys.path.insert(0,"."); from pipeline.bytecode import keep_bytecode; e=dict(os.environ); keep_bytecode(e); print("export PYTHONPYCACHEPREFIX="+e.get("PYTHONPYCACHEPREFIX","")); print("unset PYTHONDONTWRITEBYTECODE")')"
W="python3 -m workloads gpt --size 2.7B --mode train --dtype bf16 --attention sdpa --sdpa_backend cudnn --context 512 --batch 4 --vocab 10000 --optimizer adamw_master --compile default --compile_blocks once --warmup 3 --steps 10 --device auto --seed 0"
t0=$(date +%s)
one() {  # name cache
  TORCHINDUCTOR_CACHE_DIR=$2 timeout 230 $W --out $OUT/$1.json > $OUT/$1.log 2>&1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], r['status'], 'compile_s', round(r.get('compile_s') or 0,1), 'median_ms', round(r['median_ms'],2), 'min', round(r['min_ms'],2), 'max', round(r['max_ms'],2))" $OUT/$1.json 2>&1 | tail -1
  echo "  at $(( $(date +%s) - t0 )) s"
}
one B-cold /tmp/ind-B; one B-warm /tmp/ind-B
cp gpu-out/optim_autotune.py workloads/optim.py
one A-cold /tmp/ind-A; one A-warm /tmp/ind-A
