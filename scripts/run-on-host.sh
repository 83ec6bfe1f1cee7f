#!/usr/bin/env bash
# The pipeline without Apptainer, in the Python environment this host already has (a cluster
# module, a vendor container, a venv): the same Snakefile, rules and config as the image run.
# `make run CONTAINER=none` calls it; a batch job or a machine that is reclaimed calls it the
# same way and resumes where the last attempt stopped.
#
#   bash scripts/run-on-host.sh [CONFIGFILE] [TIME_LIMIT_S] [SNAKEMAKE ARGS...]
#
# Environment:
#   WHEEL_KIT    a folder for a host without network: `setup.sh` (sourced first, e.g. to put
#                nsys on PATH) and `wheelhouse/` (Snakemake's wheels, installed offline into
#                $HOST_PACKAGES when this Python has no Snakemake). Default: ./gpu-kit if present.
#   HOST_PACKAGES where those wheels go (default /tmp/profbench-packages).
#   ARCHIVE_DIR  where the results (without captures) are archived every minute and at the end,
#                as results.tgz, with the compile cache as inductor.tgz (default: $OUT if set,
#                else no archive). RESUME_DIR (default ./resume) holding such archives is
#                unpacked first: only what is missing is run (docs/reliability.md).
#   CORES        Snakemake's --cores (default 4 per GPU, at most the machine's cores, at
#                least 4).
set -u
cd "$(dirname "$0")/.."
configfile=${1:-config.yaml}; limit=${2:-0}; shift $(( $# < 2 ? $# : 2 )); extra=("$@")
kit=${WHEEL_KIT:-$([ -d gpu-kit ] && echo gpu-kit)}
packages=${HOST_PACKAGES:-/tmp/profbench-packages}
archive=${ARCHIVE_DIR:-${OUT:-}}
resume=${RESUME_DIR:-resume}
if [ -n "$kit" ]; then
  [ -f "$kit/setup.sh" ] && source "$kit/setup.sh" >/dev/null 2>&1
  if ! python3 -c 'import snakemake' 2>/dev/null && [ ! -d "$packages/snakemake" ]; then
    python3 -m pip install -q --no-index --find-links "$kit/wheelhouse" --target "$packages" \
      'snakemake[reports]==9.27.1' 2>&1 | grep -v WARN | tail -2
  fi
  export PYTHONPATH=$packages${PYTHONPATH:+:$PYTHONPATH} PATH=$packages/bin:$PATH
fi
export PYTHONUNBUFFERED=1
python3 -m pipeline.checks --gpu --host-env \
  --why "the pipeline runs its GPU jobs in this host's Python environment" || exit 1
# An install that keeps no bytecode (PYTHONDONTWRITEBYTECODE, a read-only tree): give Snakemake
# and its report the cache the pipeline gives its jobs (pipeline/bytecode.py).
eval "$(python3 -c 'import os, shlex, sys; sys.path.insert(0, "."); from pipeline.bytecode import keep_bytecode
e = dict(os.environ); note = keep_bytecode(e)
if note: print("export PYTHONPYCACHEPREFIX=" + shlex.quote(e["PYTHONPYCACHEPREFIX"]) + "; unset PYTHONDONTWRITEBYTECODE; echo " + shlex.quote("bytecode: " + note))')"
nvidia-smi --query-gpu=name,driver_version,memory.used,temperature.gpu,clocks.sm --format=csv,noheader
results=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['results'])" "$configfile")
configs=(--configfile "$configfile")
# Snakemake's own output: beside the archives, else in the results folder's logs
log=${archive:-$results/logs}/snakemake-host.log
mkdir -p "$(dirname "$log")"
if [ -n "$archive" ]; then
  # Archived results travel without captures, so a resumed attempt must not redo them:
  # keep_captures false makes them temp() outputs that are not remade once their tables exist.
  printf 'keep_captures: false\n' > /tmp/profbench-archived.yaml
  configs+=(/tmp/profbench-archived.yaml)
fi
# Inductor's compile cache travels with the archives (a cold 2.7B compile is minutes, a cached
# one seconds): a known folder whenever one is written or unpacked.
if [ -n "$archive" ] || [ -f "$resume/inductor.tgz" ]; then
  export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/profbench-inductor}
fi
start=$(date +%s)
if [ -f "$resume/inductor.tgz" ]; then
  tar xzf "$resume/inductor.tgz" -C "$(dirname "$TORCHINDUCTOR_CACHE_DIR")" \
    && echo "compile cache: $(du -sh "$TORCHINDUCTOR_CACHE_DIR" | cut -f1)"
fi
if [ -f "$resume/results.tgz" ]; then  # an earlier attempt's results, file times kept by tar
  tar xzf "$resume/results.tgz" && echo "resumed from $resume/results.tgz: $(find "$results" -name '*.json' | wc -l) JSON records"
fi
# Outputs of jobs still running are left out of an archive (Snakemake marks them in
# .snakemake/incomplete/ before a job starts): a later attempt must not take a half-written
# file for a finished one.
incomplete() {
  python3 -c 'import base64, pathlib
for m in sorted(pathlib.Path(".snakemake/incomplete").glob("*")):
    try: print(base64.urlsafe_b64decode(m.name).decode())
    except ValueError: pass'
}
save_results() {
  [ -n "$archive" ] || return 0
  local before try
  for try in 1 2 3 4 5; do
    before=$(incomplete)
    tar czf "$archive/results-tmp.tgz" --exclude='*.nsys-rep' --exclude='*.sqlite' \
      --exclude='torch_trace' --exclude='ops_torch_trace' \
      --exclude-from=<(echo "$before") "$results" .snakemake/log 2>/dev/null || return
    # a job that started meanwhile may be in the archive half-written: then try again
    if [ -z "$(comm -13 <(echo "$before" | sort) <(incomplete | sort))" ]; then
      mv "$archive/results-tmp.tgz" "$archive/results.tgz"; return
    fi
  done
}
( while sleep 60; do save_results; done ) & saver=$!
# `gpu` counts whole GPUs: every GPU of this host, each GPU job on GPUs of its own (one-GPU
# jobs side by side; pipeline/gpus.py), 4 cores per GPU for the timing jobs and the analysis
# beside them. A failed run is already a result row; --keep-going lets an unexpected job
# failure cost only its own outputs. At the time limit, SIGINT: Snakemake stops its jobs and
# marks nothing complete.
gpus=$(python3 -m pipeline.gpus count) || exit 1
cores=$(( 4 * gpus < $(nproc) ? 4 * gpus : $(nproc) )); cores=$(( cores < 4 ? 4 : cores ))
echo "GPUs: $gpus (--resources gpu=$gpus), --cores ${CORES:-$cores}"
timeout_cmd=(); [ "$limit" -gt 0 ] && timeout_cmd=(timeout -s INT -k 20 "$limit")
"${timeout_cmd[@]}" python3 -m snakemake --cores "${CORES:-$cores}" --resources gpu="$gpus" \
  --keep-going "${configs[@]}" "${extra[@]}" >> "$log" 2>&1
rc=$?
echo "snakemake rc=$rc after $(( $(date +%s) - start )) s"
grep -E "Error|steps \(|Nothing to be done|of .* steps" "$log" | tail -15
if [ $rc -ne 124 ] && [ $rc -ne 137 ]; then  # a report of what finished, unless cut off
  python3 -m snakemake "${configs[@]}" "${extra[@]}" --report "$results/report.html" \
    >> "$log" 2>&1 || echo "report failed"
fi
echo "wall time: $(( $(date +%s) - start )) s (pipeline and report)" | tee -a "$log"
kill $saver 2>/dev/null; wait $saver 2>/dev/null
save_results
if [ -n "$archive" ] && [ -d "${TORCHINDUCTOR_CACHE_DIR:-/nonexistent}" ]; then
  tar czf "$archive/inductor.tgz" -C "$(dirname "$TORCHINDUCTOR_CACHE_DIR")" \
    "$(basename "$TORCHINDUCTOR_CACHE_DIR")"
fi
exit $rc
