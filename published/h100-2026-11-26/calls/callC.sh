#!/usr/bin/env bash
# Call C (issue 20): once vs regional side by side at the best sweep's settings (whole step in
# one CUDA graph) where launch costs weigh most (small) and for 2.7B forward.
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
source gpu-kit/setup.sh >/dev/null 2>&1
export PYTHONUNBUFFERED=1
eval "$(python3 -c 'import os, shlex, sys; sys.path.insert(0, "."); from pipeline.bytecode import keep_bytecode
e = dict(os.environ); note = keep_bytecode(e)
if note: print("export PYTHONPYCACHEPREFIX=" + shlex.quote(e["PYTHONPYCACHEPREFIX"]) + "; unset PYTHONDONTWRITEBYTECODE; echo " + shlex.quote("bytecode: " + note))')"
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
timeout 120 python3 -m compileall -q -j 16 "$site/torch" "$site/triton" "$PWD/workloads" >/dev/null 2>&1
echo "setup took $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.used,temperature.gpu,clocks.sm --format=csv,noheader
timeout ${1:-300} python3 benchmarks/compile_blocks.py --settings once,regional \
  --cases ${2:-small_fwd_best,small_fwd_bwd_best,2.7B_fwd_best} --repeats 2 --steps 20 \
  --out $OUT/compile_blocks_best.json 2>&1 | tee $OUT/compile_blocks_best.log | grep -v '^  '
echo "call took $(( $(date +%s) - t0 )) s"
