#!/usr/bin/env bash
# Calls I and J (issues 18, 20): the default config from the cold start of call H, resumed from
# the previous call's results (without captures) and Inductor cache, as on a preemptible node.
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
bash scripts/gpu-host-run.sh ${1:-config.yaml} ${2:-530}
echo "call took $(( $(date +%s) - t0 )) s"
