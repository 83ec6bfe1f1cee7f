#!/usr/bin/env bash
# Call A (issue 20): once vs regional side by side (compile_blocks.py), then the sample of
# full's compiled runs, compiled regionally, from a cold start (no results, no compile cache)
# in one Snakemake invocation started in its own session (call B waits for it).
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
BG=/root/profbench-bg; rm -rf $BG; mkdir -p $BG
source gpu-kit/setup.sh >/dev/null 2>&1
[ -d /tmp/sm/snakemake ] || python3 -m pip install -q --no-index --find-links gpu-kit/wheelhouse \
  --target /tmp/sm 'snakemake[reports]==9.27.1' 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/sm:$PYTHONPATH PYTHONUNBUFFERED=1
eval "$(python3 -c 'import os, shlex, sys; sys.path.insert(0, "."); from pipeline.bytecode import keep_bytecode
e = dict(os.environ); note = keep_bytecode(e)
if note: print("export PYTHONPYCACHEPREFIX=" + shlex.quote(e["PYTHONPYCACHEPREFIX"]) + "; unset PYTHONDONTWRITEBYTECODE; echo " + shlex.quote("bytecode: " + note))')"
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
timeout 240 python3 -m compileall -q -j 16 "$site" /tmp/sm /tmp/gpu-kit-site "$PWD/pipeline" "$PWD/workloads" "$PWD/analysis" >/dev/null 2>&1
echo "setup took $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.used,temperature.gpu,clocks.sm --format=csv,noheader
python3 -c 'import torch; print(torch.__version__)'
tb=$(date +%s)
timeout ${2:-400} python3 benchmarks/compile_blocks.py --settings once,regional \
  --cases ${3:-small_cuda_graphs,2.7B_compile,2.7B_fwd_bwd_best} --repeats 2 --steps 20 \
  --out $OUT/compile_blocks.json 2>&1 | tee $OUT/compile_blocks.log | grep -v '^  '
echo "compile_blocks took $(( $(date +%s) - tb )) s"
bash gpu-out/probe_threads.sh 2>&1 | tee $OUT/probe_threads.log
( OUT=$BG setsid nohup bash scripts/gpu-host-run.sh config/full-compiled-sample.yaml 1100 \
    > $BG/host-run.log 2>&1 < /dev/null & )
echo "pipeline started at $(date +%T) in its own session"
while [ $(( $(date +%s) - t0 )) -lt ${1:-565} ]; do
  grep -q "wall time:" $BG/snakemake.log 2>/dev/null && break
  sleep 10
done
echo "after $(( $(date +%s) - t0 )) s: $(grep -c 'Finished jobid' $BG/snakemake.log 2>/dev/null) jobs finished"
grep -E "of [0-9]+ steps" $BG/snakemake.log | tail -1
cp $BG/snakemake.log $OUT/snakemake-a.log 2>/dev/null
