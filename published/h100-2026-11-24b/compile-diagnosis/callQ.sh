#!/usr/bin/env bash
# Call Q: where 2.7B's cold compile goes with the master-weight optimizer, blocks once vs each
# (the pipeline's cold run: master once 158 s, compile rung once 51 s, master each 114 s before).
set -u
cd "$(dirname "$0")/.."
source gpu-kit/setup.sh >/dev/null 2>&1
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
eval "$(python3 -c 'import os,sys; sys.path.insert(0,"."); from pipeline.bytecode import keep_bytecode; e=dict(os.environ); keep_bytecode(e); print("export PYTHONPYCACHEPREFIX="+e.get("PYTHONPYCACHEPREFIX","")); print("unset PYTHONDONTWRITEBYTECODE")')"
t0=$(date +%s)
for c in "2.7B adamw_master once" "2.7B adamw_master each" "2.7B adamw_fused once"; do
  d=$(mktemp -d /tmp/diag-XXXX)
  TORCHINDUCTOR_CACHE_DIR=$d TORCH_LOGS=recompiles,hierarchical_compile timeout 250 python3 gpu-out/diag_master.py $c > $OUT/diag-${c// /_}.log 2>&1
  echo "rc=$? $(( $(date +%s) - t0 )) s"; grep -A30 "^==" $OUT/diag-${c// /_}.log | head -32
  f=$OUT/diag-${c// /_}.log; echo "installed $(grep -c "Installing subgraph" $f) reused $(grep -c "reusing subgraph" $f) recompiles $(grep -ci "recompil" $f)"; grep -i "subgraph_reuse\|Graph comparison\|miss" $f | grep -v "cache hit" | cut -c1-250 | head -5
done
