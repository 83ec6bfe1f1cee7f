#!/usr/bin/env bash
# Write the reference `nsys stats` CSVs that profbench's analysis engine must reproduce.
# Usage: scripts/nsys-stats-csvs.sh NSYS EXPORT.sqlite OUTDIR   -> OUTDIR/<report>.csv
set -euo pipefail
nsys=$1; export_file=$2; out=$3
reports=(cuda_gpu_kern_sum nvtx_sum nvtx_kern_sum nvtx_gpu_proj_sum cuda_api_sum
         cuda_gpu_mem_time_sum cuda_gpu_mem_size_sum)
mkdir -p "$out"
for r in "${reports[@]}"; do
  # One report per call so each file is exactly that report's CSV; --force-export=false keeps
  # the export untouched (no re-export from a .nsys-rep).
  "$nsys" stats --report "$r" --format csv --force-export=false --force-overwrite=true \
      --output "$out/tmp" "$export_file" >"$out/$r.log" 2>&1 || true
  if [ -f "$out/tmp_$r.csv" ]; then mv "$out/tmp_$r.csv" "$out/$r.csv"; fi
done
"$nsys" --version > "$out/nsys_version.txt"
