#!/usr/bin/env bash
# Call E (issue 20): fork servers that preload Inductor, on the default config's 2.7B compiled
# runs (compile rung, whole-step graph, CS336 fwd+bwd best), 3 timing processes each, warm
# Inductor cache from resume/: the compiled jobs' fixed overhead for a big model.
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
source gpu-kit/setup.sh >/dev/null 2>&1
[ -d /tmp/sm/snakemake ] || python3 -m pip install -q --no-index --find-links gpu-kit/wheelhouse --target /tmp/sm 'snakemake[reports]==9.27.1' 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/sm:$PYTHONPATH PATH=/tmp/sm/bin:$PATH PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/profbench-inductor
tar xzf resume/inductor.tgz -C /tmp && echo "compile cache: $(du -sh $TORCHINDUCTOR_CACHE_DIR | cut -f1)"
nvidia-smi --query-gpu=name,driver_version,memory.used,temperature.gpu,clocks.sm --format=csv,noheader
timeout 330 python3 benchmarks/job_overhead.py --configfile config.yaml --launchers fork \
  --config 'select=[gpt_train_2.7B_5_compile,gpt_train_2.7B_7_step_graph,cs336_2.7B_forward_backward_best]' \
  --out $OUT/e-fork.json 2>&1 | grep -v "fork server s" | tail -20
python3 benchmarks/job_overhead.py --read results/job_overhead/fork --out $OUT/e-read-fork.json 2>&1 | grep -v "fork server s" | tail -14
python3 -c "
import json, os
for j in json.load(open(os.environ['OUT'] + '/e-read-fork.json'))['sides']['fork']['jobs']:
    print(j['kind'], j['job'], j['wall_s'], j['work_s'], j['overhead_s'], j['compile_s'])
"
tar czf $OUT/e-results.tgz --exclude='*.sqlite' --exclude='*.nsys-rep' --exclude='torch_trace' results/job_overhead
echo "call took $(( $(date +%s) - t0 )) s"
