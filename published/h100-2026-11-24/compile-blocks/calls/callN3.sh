#!/usr/bin/env bash
# Session 7, call N3: why compile_blocks once fails inside cuda_graph step (full traceback).
set -u
cd "$(dirname "$0")/.."
source gpu-kit/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1 TORCHDYNAMO_VERBOSE=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
eval "$(python3 -c 'import os,sys; sys.path.insert(0,"."); from pipeline.bytecode import keep_bytecode; e=dict(os.environ); keep_bytecode(e); print("export PYTHONPYCACHEPREFIX="+e.get("PYTHONPYCACHEPREFIX","")); print("unset PYTHONDONTWRITEBYTECODE")')"
sed -i 's/        raise Unsupported("compile_blocks once cannot run/        if False: raise Unsupported("compile_blocks once cannot run/' workloads/steps.py
grep -n "if False: raise" workloads/steps.py
timeout 200 python3 -m workloads gpt --size small --mode train --dtype bf16 --attention sdpa --sdpa_backend cudnn \
  --context 512 --batch 4 --optimizer adamw_master --compile default --cuda_graph step --compile_blocks once \
  --warmup 3 --steps 5 --out $OUT/step_once.json > $OUT/step_once.log 2>&1
echo "rc=$?"
grep -n "Error\|error\|Unsupported\|raise\|File \"/opt\|File \"/root" $OUT/step_once.log | tail -60
python3 -c "import json; r=json.load(open('$OUT/step_once.json')); print(r['status']); print(r['message'][-3000:])"
