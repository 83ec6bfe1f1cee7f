#!/usr/bin/env bash
# A results folder the pipeline made, as a published folder (published/README.md): the same
# folder without what is large and shown elsewhere: the captures (profile.sqlite, .nsys-rep,
# the memory capture's memory.json, the torch traces), report.html, the logs, and the two
# statistics the report does not show (nvtx_kern_sum.csv, kernel_map.csv). The figures are
# compacted (analysis/outputs/png.py); nothing is measured or edited by hand. Perfetto traces
# are kept for each ladder's first and last rung only (every captured run keeps its
# timeline.png and statistics); a results folder of another config inside this one (its own
# plan.json, e.g. results/fp8 inside results/) is left out: it is published on its own.
#
#   bash scripts/publish.sh RESULTS_DIR DEST [RUN ...]
#
# RUN ...: runs to leave out (a run whose result must not be published, e.g. one a config
# error made into something its name does not say). Their folders go, the plan loses them and
# the summary and report stage are made again from the records of the runs kept
# (`analysis aggregate`, then scripts/republish.sh), so no table or finding cites them.
set -eu
results=${1:?usage: scripts/publish.sh RESULTS_DIR DEST [RUN ...]}
dest=${2:?usage: scripts/publish.sh RESULTS_DIR DEST [RUN ...]}
shift 2
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."
[ -f "$results/summary.csv" ] && [ -f "$results/plan.json" ] \
  || { echo "publish: $results has no summary.csv and plan.json (not a results folder)" >&2; exit 2; }
[ -e "$dest" ] && { echo "publish: $dest exists: remove it first (a new run replaces its folder)" >&2; exit 2; }
mkdir -p "$dest"
tar -C "$results" -cf - --exclude='*.nsys-rep' --exclude='*.sqlite' --exclude='*torch_trace' \
  --exclude=memory.json --exclude=report.html --exclude=logs --exclude=nvtx_kern_sum.csv \
  --exclude=kernel_map.csv . | tar -C "$dest" -xf -
if [ $# -gt 0 ]; then
  for run in "$@"; do
    [ -d "$dest/$run" ] || { echo "publish: no run $run in $results" >&2; exit 2; }
    rm -rf "${dest:?}/$run"
  done
  "$py" - "$dest/plan.json" "$@" <<'EOF'
import json, shutil, sys
from pathlib import Path
path, dropped = sys.argv[1], set(sys.argv[2:])
plan = json.load(open(path))
plan["runs"] = {k: v for k, v in plan["runs"].items() if k not in dropped}
kept = [c for c in plan.get("comparisons", []) if not dropped & {c["a"], c["b"]}]
for c in plan.get("comparisons", []):
    if c not in kept:  # a comparison with a run left out goes with it
        shutil.rmtree(Path(path).parent / "compare" / c["name"], ignore_errors=True)
plan["comparisons"] = kept
plan["left_out"] = sorted(dropped)
open(path, "w").write(json.dumps(plan, indent=2, default=str) + "\n")
EOF
  calibration=(); [ -f "$dest/calibration.json" ] && calibration=(--calibration "$dest/calibration.json")
  "$py" -m analysis aggregate --results "$dest" --plan "$dest/plan.json" "${calibration[@]}" \
    -o "$dest/summary.csv"
  rm -rf "$dest/ladders" "$dest/plots"  # made again below, without the runs left out
fi
for nested in "$dest"/*/plan.json; do
  [ -f "$nested" ] || continue
  echo "publish: left out $(basename "$(dirname "$nested")")/: another config's results folder"
  rm -rf "$(dirname "$nested")"
done
# traces of the ladders' ends, read from the plan as it stands (runs left out are gone)
"$py" - "$dest" <<'EOF'
import sys
from pathlib import Path
from analysis.outputs.ladders import ladder_ends
from analysis.outputs.runs import read_plan
dest = Path(sys.argv[1])
ends = ladder_ends(read_plan(dest))
for trace in dest.glob("*/trace/trace.perfetto-trace.gz"):
    if trace.parent.parent.name not in ends:
        trace.unlink()
EOF
bash scripts/republish.sh "$dest" "$py"
echo "published $results as $dest: $(du -sb "$dest" | cut -f1) bytes"
