#!/usr/bin/env bash
# The process machinery before and after, on one GPU in one call: the same config
# (benchmarks/gpu/process_machinery.yaml, a subset of config/standard.yaml: 17 timed runs, 51
# timing processes, a capture) with the old tree's pipeline, then this tree's, back to back,
# each compiling from an empty Inductor cache of its own; then per side the per-process fixed
# overhead of the timing processes, the median CI half-width and the wall time
# (benchmarks/process_machinery.py). About 2 minutes per side on an H200.
#
#   mkdir before && git archive aa4633fd | tar -x -C before     # the old tree
#   source gpu-kit/setup.sh; OUT=... bash benchmarks/gpu/process_machinery.sh [BEFORE] [CONFIG]
set -eu
cd "$(dirname "$0")/../.."
before=$(realpath "${1:-before}"); config=$(realpath "${2:-benchmarks/gpu/process_machinery.yaml}")
out=$(realpath -m "${OUT:-results/process_machinery}")
mkdir -p "$out"
# Snakemake from the GPU kit's wheels where the machine has none (as scripts/run-on-host.sh)
if ! python3 -c 'import snakemake' 2>/dev/null && [ -d gpu-kit/wheelhouse ]; then
  python3 -m pip install -q --no-index --find-links gpu-kit/wheelhouse \
    --target /tmp/profbench-packages 'snakemake[reports]==9.27.1' 2>&1 | grep -v WARN | tail -2
  export PYTHONPATH=/tmp/profbench-packages${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/profbench-packages/bin:$PATH
fi
sides=()
for side in before after; do
  tree=$([ "$side" = before ] && echo "$before" || pwd)
  results=$out/$side
  rm -rf "$results" "$results.cache"
  start=$(date +%s.%N)
  (cd "$tree" && PROFBENCH_GIT_COMMIT=${side} TORCHINDUCTOR_CACHE_DIR=$results.cache/inductor \
     TRITON_CACHE_DIR=$results.cache/triton python3 -m snakemake --cores "${CORES:-16}" \
     --resources gpu=1 --configfile "$config" --config results="$results" \
     --until time_run profile > "$out/$side.log" 2>&1) \
    || echo "$side: snakemake failed, see $out/$side.log" >&2
  wall=$(python3 -c "import time; print(round(time.time() - $start, 1))")
  echo "$side: $wall s ($out/$side.log)"
  sides+=(--side "$side=$results:$wall")
done
python3 benchmarks/process_machinery.py "${sides[@]}" --out "$out/process_machinery.json"
