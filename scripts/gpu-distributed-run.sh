#!/usr/bin/env bash
# Distributed runs on a host with 2 GPUs, through the pipeline in the host's own Python
# environment (as scripts/run-on-host.sh; .profbench-git.json from scripts/stamp-git.sh where
# the copy has no .git), everything it brings back in $OUT:
#   bash scripts/gpu-distributed-run.sh [TIME_LIMIT_S] [SNAKEMAKE ARGS...]
# 1. config/distributed.yaml through the pipeline, results.tgz into $OUT (run again with that
#    archive as resume/results.tgz, it finishes what a run cut off at its limit left);
# 2. parity of one rank's export with `nsys stats` of this host's nsys (2025.3.1, the
#    reference naming): rank 1 of gpt_small_ddp2 and rank 0 of gpt_small_fsdp2, the CSVs and
#    the verdict into $OUT/parity-*;
# 3. the small runs' per-rank exports into $OUT/exports.tgz (real NCCL captures, for fixtures).
set -u
cd "$(dirname "$0")/.."
limit=${1:-540}; shift 2>/dev/null; extra=("$@")
# keep_captures true: the parity below reads the exports that the tables were made from (a
# resumed run captures again, since captures are not archived)
bash scripts/run-on-host.sh config/distributed.yaml "$limit" --config keep_captures=true \
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
# one archive each rather than a folder of CSVs per case: fewer files to copy off the host
tar czf "$OUT/parity.tgz" -C "$OUT" $(cd "$OUT" && ls -d parity-* 2>/dev/null) && rm -rf "$OUT"/parity-*
tar czf "$OUT/exports.tgz" $results/gpt_small_*2/profile.rank*.sqlite 2>/dev/null
ls -la "$OUT"
