#!/usr/bin/env bash
# The pipeline on the lent H100 machine's host environment (no network, no Apptainer image):
# the same Snakefile, rules and config, with ../shared/gpu-kit copied to ./gpu-kit (nsys
# importer libraries, nvtx + nvidia-ml-py wheels, Snakemake's cp312 wheelhouse) and
# .profbench-git.json from scripts/stamp-git.sh (the copy has no .git). The machine comes back
# bare on every call: what a call made is saved (without captures) to $OUT/results.tgz, and a
# call that carries such an archive as resume/results.tgz unpacks it first and goes on from
# there, rerunning only what is missing (docs/reliability.md, "Resume anywhere"). Inductor's
# compile cache travels the same way (resume/inductor.tgz), as it would on shared storage: a
# 2.7B compile costs ~3 min cold and ~10 s from the cache.
# Usage (through the device tool, carrying gpu-kit, .profbench-git.json and, to resume, resume):
#   bash scripts/gpu-host-run.sh [CONFIGFILE] [TIME_LIMIT_S] [SNAKEMAKE ARGS...]
set -u
cd "$(dirname "$0")/.."
configfile=${1:-config.yaml}; limit=${2:-540}; shift 2 2>/dev/null; extra=("$@")
source gpu-kit/setup.sh >/dev/null 2>&1
[ -d /tmp/sm/snakemake ] || python3 -m pip install -q --no-index --find-links gpu-kit/wheelhouse \
  --target /tmp/sm 'snakemake[reports]==9.27.1' 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/sm:$PYTHONPATH PATH=/tmp/sm/bin:$PATH PYTHONUNBUFFERED=1
# The host's install keeps no bytecode and its environment sets PYTHONDONTWRITEBYTECODE: give
# Snakemake (and its report) the cache the pipeline gives its jobs (pipeline/bytecode.py).
eval "$(python3 -c 'import os, shlex, sys; sys.path.insert(0, "."); from pipeline.bytecode import keep_bytecode
e = dict(os.environ); note = keep_bytecode(e)
if note: print("export PYTHONPYCACHEPREFIX=" + shlex.quote(e["PYTHONPYCACHEPREFIX"]) + "; unset PYTHONDONTWRITEBYTECODE; echo " + shlex.quote("bytecode: " + note))')"
nvidia-smi --query-gpu=name,driver_version,memory.used,temperature.gpu,clocks.sm --format=csv,noheader
results=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['results'])" "$configfile")
# Captures never leave this machine (too large to bring back), so a later call resumes
# without them: keep_captures false makes them temp() outputs that Snakemake does not redo
# once their tables exist (with true, every capture would be made again on resuming).
printf 'keep_captures: false\n' > /tmp/profbench-lent.yaml
configs=(--configfile "$configfile" /tmp/profbench-lent.yaml)
start=$(date +%s)
export TORCHINDUCTOR_CACHE_DIR=/tmp/profbench-inductor
if [ -f resume/inductor.tgz ]; then
  tar xzf resume/inductor.tgz -C /tmp && echo "compile cache: $(du -sh $TORCHINDUCTOR_CACHE_DIR | cut -f1)"
fi
if [ -f resume/results.tgz ]; then  # an earlier call's results, file times kept by tar
  tar xzf resume/results.tgz && echo "resumed from resume/results.tgz: $(find "$results" -name '*.json' | wc -l) JSON records"
fi
# What this machine made, without the captures, into $OUT: every minute while the pipeline runs
# (a call cut off by its time limit still brings back what was done) and once at the end.
# Outputs of jobs still running are left out (Snakemake marks them in .snakemake/incomplete/
# before a job starts): a later call must not take a half-written file for a finished one.
incomplete() {
  python3 -c 'import base64, pathlib
for m in sorted(pathlib.Path(".snakemake/incomplete").glob("*")):
    try: print(base64.urlsafe_b64decode(m.name).decode())
    except ValueError: pass'
}
save_results() {
  local before try
  for try in 1 2 3 4 5; do
    before=$(incomplete)
    tar czf $OUT/results-tmp.tgz --exclude='*.nsys-rep' --exclude='*.sqlite' \
      --exclude='torch_trace' --exclude='ops_torch_trace' \
      --exclude-from=<(echo "$before") "$results" .snakemake/log 2>/dev/null || return
    # a job that started meanwhile may be in the archive half-written: then try again
    if [ -z "$(comm -13 <(echo "$before" | sort) <(incomplete | sort))" ]; then
      mv $OUT/results-tmp.tgz $OUT/results.tgz; return
    fi
  done
}
( while sleep 60; do save_results; done ) & saver=$!
# The GPU is 2 tokens (profiles/default): a timing job takes both, a capture one (two
# captures overlap their start-ups; their GPU work takes turns); statistics jobs overlap. A failed
# run is already a result row; --keep-going lets an unexpected job failure cost only its own
# outputs. SIGINT at the limit: Snakemake stops its jobs and marks nothing complete.
timeout -s INT -k 20 "$limit" python3 -m snakemake --cores 4 --resources gpu=2 --keep-going \
  "${configs[@]}" "${extra[@]}" >> $OUT/snakemake.log 2>&1
rc=$?
echo "snakemake rc=$rc after $(( $(date +%s) - start )) s"
grep -E "Error|steps \(|Nothing to be done|of .* steps" $OUT/snakemake.log | tail -15
if [ $rc -ne 124 ] && [ $rc -ne 137 ]; then  # a report of what finished, unless cut off
  python3 -m snakemake "${configs[@]}" "${extra[@]}" --report "$results/report.html" \
    >> $OUT/snakemake.log 2>&1 || echo "report failed"
fi
echo "wall time: $(( $(date +%s) - start )) s (pipeline and report)" | tee -a $OUT/snakemake.log
kill $saver 2>/dev/null; wait $saver 2>/dev/null
save_results
# the compile cache for the next call, unless it would not fit the device tool's 64 MiB carry
if [ -d $TORCHINDUCTOR_CACHE_DIR ]; then
  tar czf $OUT/inductor.tgz -C /tmp profbench-inductor
  if [ "$(stat -c %s $OUT/inductor.tgz)" -gt $((28 * 1024 * 1024)) ]; then
    echo "compile cache too large to carry: $(du -sh $OUT/inductor.tgz | cut -f1)"; rm $OUT/inductor.tgz
  fi
fi
ls -la $OUT
