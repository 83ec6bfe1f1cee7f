#!/usr/bin/env bash
# The pipeline on the lent H100 machine's host environment (no network, no Apptainer image):
# the same Snakefile, rules and config.yaml, with ../shared/gpu-kit copied to ./gpu-kit and
# cp312 Snakemake wheels in gpu-kit/wheelhouse (pip download --python-version 3.12 ...).
# Results, small exports and their `nsys stats` CSVs (future fixtures) go to $OUT.
# Usage (through the device tool, carrying gpu-kit): bash scripts/gpu-host-run.sh 'PATTERNS' [timeout_s]
set -u
cd "$(dirname "$0")/.."
select=$1; limit=${2:-480}
source gpu-kit/setup.sh >/dev/null 2>&1
python3 -m pip install -q --no-index --find-links gpu-kit/wheelhouse --target /tmp/sm 'snakemake[reports]==9.27.1' 2>&1 | grep -v WARN | tail -2
export PYTHONPATH=/tmp/sm:$PYTHONPATH PATH=/tmp/sm/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
start=$(date +%s)
timeout "$limit" python3 -m snakemake --cores 1 --keep-going --config "select=$select" > $OUT/snakemake.log 2>&1
echo "snakemake rc=$? after $(( $(date +%s) - start )) s"
grep -E "Error|Finished jobid|steps \(" $OUT/snakemake.log | tail -25
python3 -m snakemake --report results/report.html --config "select=$select" >> $OUT/snakemake.log 2>&1 || echo "report failed"
# Reference CSVs from this machine's nsys stats for the small exports (future test fixtures).
mkdir -p /tmp/fx
for f in results/*/profile.sqlite; do
  run=$(basename $(dirname $f)); size=$(stat -c %s $f)
  if [ "$size" -lt 4000000 ]; then cp $f /tmp/fx/$run.sqlite; scripts/nsys-stats-csvs.sh nsys $f /tmp/fx/$run >/dev/null 2>&1; fi
done
ls -la results/*/profile.sqlite
tar czf $OUT/results.tgz --exclude='*.nsys-rep' --exclude='*.sqlite' results .snakemake/log
tar czf $OUT/fixtures.tgz -C /tmp fx

