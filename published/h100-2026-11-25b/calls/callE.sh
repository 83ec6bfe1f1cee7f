#!/usr/bin/env bash
# Call E (issue 20): where a capture's fixed ~10 s goes under nsys, per nsys option, on the H100.
# One workload (GPT small, bf16, train, eager, 3 warm-up + 6 steps), the pipeline's own nsys
# flags as the base, then one change at a time; each variant twice, interleaved with the base.
set -u
cd "$(dirname "$0")/.."
source gpu-kit/setup.sh >/dev/null 2>&1
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
eval "$(python3 -c 'import os,sys; sys.path.insert(0,"."); from pipeline.bytecode import keep_bytecode; e=dict(os.environ); keep_bytecode(e); print("export PYTHONPYCACHEPREFIX="+e.get("PYTHONPYCACHEPREFIX","")); print("unset PYTHONDONTWRITEBYTECODE")')"
export OMP_NUM_THREADS=1 TORCH_WARM_POOL=0 PYTORCH_NVML_BASED_CUDA_CHECK=1 NSYS_NVTX_PROFILER_REGISTER_ONLY=0
mkdir -p $OUT/e /tmp/e
nsys --version > $OUT/e/nsys-version.txt 2>&1
nsys profile --help > $OUT/e/nsys-profile-help.txt 2>&1
W="python3 -m workloads gpt --size small --mode train --dtype bf16 --warmup 3 --steps 6"
python3 -c "import torch" ; $W --out /tmp/e/warm.json > /dev/null 2>&1  # bytecode + first CUDA init
RANGE="--capture-range=nvtx --nvtx-capture=profiled_region --capture-range-end=stop"
BASE="--trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node $RANGE --stats=false --export=sqlite --force-overwrite=true"
declare -A V
V[base]="$BASE"
V[noevent]="$BASE --cuda-event-trace=false"
V[graphtrace]="--trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=graph $RANGE --stats=false --export=sqlite --force-overwrite=true"
V[cudaonly]="--trace=cuda --sample=none --cpuctxsw=none --cuda-graph-trace=node --capture-range=cudaProfilerApi --capture-range-end=stop --stats=false --export=sqlite --force-overwrite=true"
V[nvtxonly]="--trace=nvtx --sample=none --cpuctxsw=none $RANGE --stats=false --export=sqlite --force-overwrite=true"
V[norange]="--trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node --stats=false --export=sqlite --force-overwrite=true"
V[primary]="$BASE --wait=primary"
V[noexport]="--trace=cuda,nvtx --sample=none --cpuctxsw=none --cuda-graph-trace=node $RANGE --stats=false --export=none --force-overwrite=true"
V[flush]="$BASE --cuda-flush-interval=100"
V[nobt]="$BASE --cudabacktrace=none --backtrace=none"
t0=$(date +%s)
one() {  # variant, k
  local v=$1 k=$2 s e
  s=$(date +%s.%N)
  timeout 120 nsys profile ${V[$v]} -o /tmp/e/$v-$k $W --out $OUT/e/$v-$k.json > $OUT/e/$v-$k.log 2>&1
  local rc=$?
  e=$(date +%s.%N)
  local x=""
  if [ "$v" = noexport ] && [ -f /tmp/e/$v-$k.nsys-rep ]; then
    local xs=$(date +%s.%N); nsys export --type=sqlite --force-overwrite=true -o /tmp/e/$v-$k.sqlite /tmp/e/$v-$k.nsys-rep > /dev/null 2>&1
    x=" export_s=$(python3 -c "print(round($(date +%s.%N)-$xs,2))")"
  fi
  python3 - "$v" "$k" "$rc" "$s" "$e" "$OUT/e/$v-$k.json" "$x" <<'PY'
import json, sys
v, k, rc, s, e, path, x = sys.argv[1:]
s, e = float(s), float(e)
try:
    d = json.load(open(path)); t = d["process"]["timeline_unix"]; r = d.get("region_ms") or {}
    print(f"{v:10s} {k} rc={rc} wall={e-s:6.2f} pre={t['started']-s:5.2f} imports={t['main']-t['started']:5.2f} "
          f"build={t['built']-t['main']:5.2f} run={t['measured']-t['built']:5.2f} region_in={r.get('enter',0)/1e3:5.2f} "
          f"region_out={r.get('exit',0)/1e3:5.2f} post={e-t['written']:5.2f} step_ms={d.get('median_ms',0):.2f}{x}", flush=True)
except Exception as ex:
    print(f"{v:10s} {k} rc={rc} wall={e-s:6.2f} no record: {ex}", flush=True)
PY
}
for k in 1 2; do
  one base ${k}a
  for v in noevent graphtrace cudaonly; do one $v $k; done
  one base ${k}b
  for v in nvtxonly norange primary; do one $v $k; done
  one base ${k}c
  for v in noexport flush nobt; do one $v $k; done
done
echo "untraced:"; s=$(date +%s.%N); $W --out $OUT/e/untraced.json > /dev/null 2>&1; echo "wall=$(python3 -c "print(round($(date +%s.%N)-$s,2))")"
echo "total $(( $(date +%s) - t0 )) s"
ls -la /tmp/e/*.sqlite | head -3
