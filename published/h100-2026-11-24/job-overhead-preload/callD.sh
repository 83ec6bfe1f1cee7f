#!/usr/bin/env bash
# Call D (issue 20): fork servers that preload Inductor (ef33402) vs one process per job, back
# to back on this machine: the FlashAttention point's 5 attention_core runs and GPT small's
# compile rung, 5 timing processes per run (CI widths), Inductor cache from resume/.
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
source gpu-kit/setup.sh >/dev/null 2>&1
[ -d /tmp/sm/snakemake ] || python3 -m pip install -q --no-index --find-links gpu-kit/wheelhouse --target /tmp/sm 'snakemake[reports]==9.27.1' 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/sm:$PYTHONPATH PATH=/tmp/sm/bin:$PATH PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/profbench-inductor
tar xzf resume/inductor.tgz -C /tmp && echo "compile cache: $(du -sh $TORCHINDUCTOR_CACHE_DIR | cut -f1)"
nvidia-smi --query-gpu=name,driver_version,memory.used,temperature.gpu,clocks.sm --format=csv,noheader
sel='select=[attn_*,gpt_train_small_5_compile]'
for side in fork:200 process:280; do
  name=${side%%:*}; limit=${side##*:}
  echo "== $name (limit $limit s) at $(( $(date +%s) - t0 )) s"
  timeout $limit python3 benchmarks/job_overhead.py --configfile config.yaml --launchers $name \
    --repeats 5 --config "$sel" --out $OUT/d-$name.json 2>&1 | tail -12
done
for name in fork process; do  # also what a side cut at its limit finished
  python3 benchmarks/job_overhead.py --read results/job_overhead/$name --out $OUT/d-read-$name.json 2>&1 | tail -14
done
[ -f $OUT/d-process.json ] && [ -f $OUT/d-fork.json ] && \
  python3 benchmarks/job_overhead.py --merge $OUT/d-process.json $OUT/d-fork.json --out $OUT/d.json 2>&1 | tail -40
for f in $(find results/job_overhead/fork -name 'forkserver*' | head -4); do echo "-- $f"; grep -h "preload" $f | head -3 | cut -c1-1500; done
tar czf $OUT/d-results.tgz --exclude='*.sqlite' --exclude='*.nsys-rep' --exclude='torch_trace' results/job_overhead
echo "call took $(( $(date +%s) - t0 )) s"
