#!/usr/bin/env bash
# The report stage again over a results folder the pipeline made (e.g. a published one): the
# ladders, findings, figures, distributed tables and overview, drawn by this checkout's
# analysis from the same records and statistics. summary.csv, the runs' records and their
# statistics stay as the run wrote them; nothing is measured or edited by hand. The figures
# it cannot redraw (each run's trace/timeline.png and trace/memory.png: captures are not
# kept) are compacted as analysis/outputs/style.save writes figures now (a 256-colour palette).
#   bash scripts/republish.sh RESULTS_DIR [PYTHON]
set -eu
results=${1:?usage: scripts/republish.sh RESULTS_DIR [PYTHON]}
py=${2:-python3}
cd "$(dirname "$0")/.."
[ -f "$results/summary.csv" ] && [ -f "$results/plan.json" ] \
  || { echo "republish: $results has no summary.csv and plan.json (not a results folder)" >&2; exit 2; }
"$py" -m analysis ladders --results "$results" --plan "$results/plan.json" -o "$results/ladders"
if [ -f "$results/distributed.csv" ]; then
  "$py" -m analysis distributed --results "$results" -o "$results/distributed.csv" \
    --plots "$results/plots"
fi
"$py" -m analysis findings --results "$results" -o "$results/findings.csv"
"$py" -m analysis plots --summary "$results/summary.csv" --results "$results" \
  -o "$results/plots" --jobs 2
find "$results" -name '*.png' -print0 | xargs -0 -r "$py" -m analysis.outputs.png
"$py" -m analysis overview --results "$results" -o "$results/SUMMARY.md" \
  --html "$results/overview.html" --rst "$results/report_landing.rst"
