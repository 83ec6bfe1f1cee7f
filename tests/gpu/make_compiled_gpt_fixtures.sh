#!/usr/bin/env bash
# The compiled GPT captures of tests/fixtures/README-analysis.md, made again with the
# module-path line in Inductor's stack traces (workloads/steps.py track_module_paths), so
# that their layers and sublayers come from module paths (tests/gpu_pending/
# test_compiled_gpt_module_layers.py checks them).
#
#   source gpu-kit/setup.sh          # nsys on PATH
#   bash tests/gpu/make_compiled_gpt_fixtures.sh [DEST]     (default tests/fixtures/h200)
#
# Six captures of GPT small, bf16 train, context 512, batch 4, cuDNN SDPA, 3 measured steps,
# each a process of its own with an empty Inductor cache (the compile runs there), all six at
# once (compiling is CPU work; the GPU is shared, which only the step times feel):
#   compiled_small_default, compiled_small_reduce-overhead            adamw_master
#   compiled_small_fused_default, compiled_small_fused_reduce-overhead adamw_fused
#   compiled_small_once_default, compiled_small_once_reduce-overhead   adamw_fused,
#                                                                      compile_blocks once
# Per capture DEST gets <stem>.sqlite, <stem>.json (the run record: its structure and
# module_depth) and <stem>_torch_trace/ (trimmed by tests/fixtures/h100/trim_torch_trace.py);
# the .nsys-rep is dropped. About 2-3 minutes on one H200 (16 cores).
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
DEST="$(realpath -m "${1:-$REPO/tests/fixtures/h200}")"
PYTHON="${PYTHON:-python3}"
WORK="$(mktemp -d)"
mkdir -p "$DEST"
command -v nsys > /dev/null || { echo "nsys not on PATH (source gpu-kit/setup.sh)" >&2; exit 1; }

capture() {  # stem, then the workload's own arguments
    local stem="$1"
    shift
    (
        cd "$REPO"
        env TORCH_TRACE="$WORK/trace_$stem" TORCHINDUCTOR_CACHE_DIR="$WORK/inductor_$stem" \
            NSYS_NVTX_PROFILER_REGISTER_ONLY=0 PROFBENCH_CAPTURE=1 \
            nsys profile --trace=cuda,nvtx --sample=none --cpuctxsw=none \
            --cuda-graph-trace=node --capture-range=nvtx --nvtx-capture=profiled_region \
            --capture-range-end=stop --export=sqlite --force-overwrite=true \
            -o "$WORK/$stem" \
            "$PYTHON" -m workloads gpt --size small --mode train --dtype bf16 --context 512 \
            --batch 4 --attention sdpa --sdpa-backend cudnn --warmup 3 --steps 3 \
            --out "$WORK/$stem.json" "$@"
    ) > "$WORK/$stem.log" 2>&1
}

pids=()
for mode in default reduce-overhead; do
    capture "compiled_small_$mode" --optimizer adamw_master --compile "$mode" & pids+=($!)
    capture "compiled_small_fused_$mode" --optimizer adamw_fused --compile "$mode" & pids+=($!)
    capture "compiled_small_once_$mode" --optimizer adamw_fused --compile "$mode" \
        --compile-blocks once & pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done

for json in "$WORK"/compiled_small_*.json; do
    stem="$(basename "$json" .json)"
    status="$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("status"))' \
        "$json")"
    if [[ "$status" != ok || ! -s "$WORK/$stem.sqlite" ]]; then
        echo "$stem: status $status" >&2
        tail -20 "$WORK/$stem.log" >&2
        failed=1
        continue
    fi
    cp "$WORK/$stem.sqlite" "$json" "$DEST/"
    rm -rf "$DEST/${stem}_torch_trace"
    "$PYTHON" "$REPO/tests/fixtures/h100/trim_torch_trace.py" "$WORK/trace_$stem" \
        "$DEST/${stem}_torch_trace"
    echo "$stem: $(du -sh "$DEST/$stem.sqlite" | cut -f1) sqlite," \
        "$(du -sh "$DEST/${stem}_torch_trace" | cut -f1) trace"
done
rm -rf "$WORK"
exit "$failed"
