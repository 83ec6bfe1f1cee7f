#!/usr/bin/env bash
# Call S1 (issue 20): the standard config as ONE Snakemake invocation. The run is started in a
# session of its own (setsid), so it outlives this call; call S2, made while the machine is
# still warm, waits for it to end and brings its results back. Before the run, the host's
# Python packages get their bytecode compiled once (as `pip install` does; the lent host's
# install keeps none): outside the timed invocation, and said so in provenance.
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
BG=/root/profbench-bg; rm -rf $BG; mkdir -p $BG
source gpu-kit/setup.sh >/dev/null 2>&1
[ -d /tmp/sm/snakemake ] || python3 -m pip install -q --no-index --find-links gpu-kit/wheelhouse \
  --target /tmp/sm 'snakemake[reports]==9.27.1' 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/sm:$PYTHONPATH
eval "$(python3 -c 'import os, shlex, sys; sys.path.insert(0, "."); from pipeline.bytecode import keep_bytecode
e = dict(os.environ); note = keep_bytecode(e)
if note: print("export PYTHONPYCACHEPREFIX=" + shlex.quote(e["PYTHONPYCACHEPREFIX"]) + "; unset PYTHONDONTWRITEBYTECODE; echo " + shlex.quote("bytecode: " + note))')"
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
tc=$(date +%s.%N)
timeout 240 python3 -m compileall -q -j 16 "$site" /tmp/sm /tmp/gpu-kit-site "$PWD/pipeline" "$PWD/workloads" "$PWD/analysis" >/dev/null 2>&1
echo "bytecode compiled in $(python3 -c "import time; print(round(time.time() - $tc, 1))") s into ${PYTHONPYCACHEPREFIX:-the install} (site $site)"
echo "setup took $(( $(date +%s) - t0 )) s"
( OUT=$BG setsid nohup bash scripts/gpu-host-run.sh config/standard.yaml 1500 \
    > $BG/host-run.log 2>&1 < /dev/null & )
echo "pipeline started at $(date +%T) in its own session"
while [ $(( $(date +%s) - t0 )) -lt ${1:-560} ]; do
  grep -q "wall time:" $BG/snakemake.log 2>/dev/null && break
  sleep 10
done
echo "after $(( $(date +%s) - t0 )) s: $(grep -c 'Finished jobid' $BG/snakemake.log 2>/dev/null) jobs finished"
grep -E "of [0-9]+ steps" $BG/snakemake.log | tail -1
cp $BG/snakemake.log $OUT/snakemake-s1.log 2>/dev/null
tail -3 $BG/host-run.log
