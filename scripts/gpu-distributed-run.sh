#!/usr/bin/env bash
# Distributed runs on a 2-GPU host (H200 x2), through the pipeline, in one call of the device
# tool (carrying gpu-kit/ and .profbench-git.json, as scripts/gpu-host-run.sh):
#   bash scripts/gpu-distributed-run.sh [TIME_LIMIT_S] [SNAKEMAKE ARGS...]
# 1. scripts/gpu-host-run.sh config/distributed.yaml: the matrix, results.tgz into $OUT (a
#    second call resumes what a first one cut off did not finish);
# 2. parity of one rank's export with `nsys stats` of this host's nsys (2025.3.1, the
#    reference naming): rank 1 of gpt_small_ddp2 and rank 0 of gpt_small_fsdp2, the CSVs and
#    the verdict into $OUT/parity-*;
# 3. the small runs' per-rank exports into $OUT/exports.tgz (real NCCL captures, for fixtures).
set -u
cd "$(dirname "$0")/.."
limit=${1:-540}; shift 2>/dev/null; extra=("$@")
# keep_captures true: the parity below reads the exports that the tables were made from (a
# second call resuming this one captures again, since captures never leave the machine)
bash scripts/gpu-host-run.sh config/distributed.yaml "$limit" --config keep_captures=true \
  "${extra[@]}"
source gpu-kit/setup.sh >/dev/null 2>&1
results=results-distributed
nsys=$(command -v nsys)
for case in gpt_small_ddp2:1 gpt_small_fsdp2:0; do
  run=${case%:*}; rank=${case#*:}
  export_file=$results/$run/profile.rank$rank.sqlite
  [ -s "$export_file" ] || { echo "parity $run rank $rank: no export"; continue; }
  bash scripts/nsys-stats-csvs.sh "$nsys" "$export_file" "$OUT/parity-$run-rank$rank"
  PYTHONPATH=. python3 tests/analysis_fixtures.py "$results/$run/stats/rank$rank" \
    "$OUT/parity-$run-rank$rank" | tee "$OUT/parity-$run-rank$rank/verdict.txt" | tail -6
done
# one archive each: the device tool brings back a limited number of files
tar czf "$OUT/parity.tgz" -C "$OUT" $(cd "$OUT" && ls -d parity-* 2>/dev/null) && rm -rf "$OUT"/parity-*
tar czf "$OUT/exports.tgz" $results/gpt_small_*2/profile.rank*.sqlite 2>/dev/null
ls -la "$OUT"
