#!/usr/bin/env bash
# Call H (issue 20): (1) where nsys' start and stop of collection sit inside a capture
# (region_ms) under nsys' capture-range settings, every capture through the guard (which now
# caches the host's bytecode); (2) the default config from a cold start (no results, no compile
# cache), part 1 of the wall-time measurement (issue 18 acceptance 4).
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
source gpu-kit/setup.sh >/dev/null 2>&1
[ -d /tmp/sm/snakemake ] || python3 -m pip install -q --no-index --find-links gpu-kit/wheelhouse --target /tmp/sm 'snakemake[reports]==9.27.1' 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/sm:$PYTHONPATH PATH=/tmp/sm/bin:$PATH PYTHONUNBUFFERED=1
echo "setup took $(( $(date +%s) - t0 )) s"
mkdir -p $OUT/probe
ENVS="OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_WARM_POOL=0 PYTORCH_NVML_BASED_CUDA_CHECK=1"
W="python3 -m workloads gpt --attention naive --batch 4 --context 512 --device auto --dtype bf16 --mode train --optimizer adamw_foreach --seed 0 --size small --steps 6 --vocab 10000 --warmup 3"
NS="nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node --stats=false --export=sqlite --force-overwrite=true"
NV="--capture-range=nvtx --nvtx-capture=profiled_region"
probe() {
  local name=$1; shift
  local s=$(date +%s.%N)
  env $ENVS python3 -m pipeline.guard --out $OUT/probe/$name.json -- env NSYS_NVTX_PROFILER_REGISTER_ONLY=0 "$@" > $OUT/probe/$name.log 2>&1
  python3 - $OUT/probe/$name.json $s <<'PY'
import json, sys, time
r = json.load(open(sys.argv[1])); g = r.get("guard_unix") or {}; t = (r.get("process") or {}).get("timeline_unix") or {}
rel = {k: round(v - g.get("started", 0), 2) for k, v in t.items() if v}
print(f"{sys.argv[1].split('/')[-1]:<14} {r.get('status')} wall {time.time() - float(sys.argv[2]):5.2f} s region_ms {r.get('region_ms')} "
      f"work {round((sum(r.get('warmup_times_ms') or [])+sum(r.get('step_times_ms') or []))/1e3, 2)} timeline {rel} end {round(g.get('ended', 0) - g.get('started', 0), 2)} "
      f"median {r.get('median_ms') and round(r['median_ms'], 1)} pycache {(r.get('process') or {}).get('pycache_prefix')}")
PY
}
probe first   $NS $NV --capture-range-end=stop -o /tmp/h-first $W --out $OUT/probe/first.json
grep guard: $OUT/probe/first.log | head -3
probe untraced $W --out $OUT/probe/untraced.json
probe stop    $NS $NV --capture-range-end=stop -o /tmp/h-stop $W --out $OUT/probe/stop.json
probe noflush $NS $NV --capture-range-end=stop --flush-on-cudaprofilerstop=false -o /tmp/h-noflush $W --out $OUT/probe/noflush.json
probe cudaapi $NS --capture-range=cudaProfilerApi --capture-range-end=stop -o /tmp/h-cudaapi $W --out $OUT/probe/cudaapi.json
probe none    $NS $NV --capture-range-end=none -o /tmp/h-none $W --out $OUT/probe/none.json
probe stop2   $NS $NV --capture-range-end=stop -o /tmp/h-stop2 $W --out $OUT/probe/stop2.json
ls -la /tmp/h-*.sqlite | awk '{print $5, $9}'
for f in stop none; do python3 -c "
import sqlite3, sys; c = sqlite3.connect('/tmp/h-$f.sqlite')
print('$f', 'kernels', c.execute('select count(*) from CUPTI_ACTIVITY_KIND_KERNEL').fetchone(), 'api', c.execute('select count(*) from CUPTI_ACTIVITY_KIND_RUNTIME').fetchone())"; done
echo "probe took $(( $(date +%s) - t0 )) s"
rm -rf resume  # a cold start: no results, no compile cache
bash scripts/gpu-host-run.sh config.yaml $(( 575 - ($(date +%s) - t0) ))
echo "call took $(( $(date +%s) - t0 )) s"
