#!/usr/bin/env bash
# Session 7, call N4: compile_blocks once inside the whole-step CUDA graph where no weights
# alias (forward_backward; train with adamw_fused), and adamw_master refused.
set -u
cd "$(dirname "$0")/.."
source gpu-kit/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind
eval "$(python3 -c 'import os,sys; sys.path.insert(0,"."); from pipeline.bytecode import keep_bytecode; e=dict(os.environ); keep_bytecode(e); print("export PYTHONPYCACHEPREFIX="+e.get("PYTHONPYCACHEPREFIX","")); print("unset PYTHONDONTWRITEBYTECODE")')"
common="--size small --dtype bf16 --attention sdpa --sdpa_backend cudnn --context 512 --batch 4 --compile default --cuda_graph step --warmup 3 --steps 20"
for v in "fwdbwd_once:--mode forward_backward --compile_blocks once" "fwdbwd_each:--mode forward_backward --compile_blocks each" \
         "train_fused_once:--mode train --optimizer adamw_fused --compile_blocks once" "train_fused_each:--mode train --optimizer adamw_fused --compile_blocks each" \
         "train_master_once:--mode train --optimizer adamw_master --compile_blocks once"; do
  name=${v%%:*}; flags=${v#*:}
  s=$(date +%s)
  timeout 150 python3 -m workloads gpt $common $flags --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - s )) s: $(grep -h 'ms/step\|error\|unsupported' $OUT/$name.log | tail -1 | cut -c1-300)"
done
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
for n in ("fwdbwd_once", "fwdbwd_each", "train_fused_once", "train_fused_each", "train_master_once"):
    r = json.load(open(f"{out}/{n}.json"))
    print(n, r["status"], r.get("median_ms"), r.get("compile_s"), (r.get("losses") or [None])[-1], r["message"][:160])
PY
