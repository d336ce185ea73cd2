#!/usr/bin/env bash
# FSDP and the memory planner on one GPU, from a carried build folder (bin/ lib/; no compiling
# there):
#   1. the FSDP GPU tests (gpu_parity --gtest_filter=FsdpCuda.*): every strategy trains like the
#      run without FSDP; persistent bytes equal the planner's; the pool's peak near its
#      prediction; the communication-stream path bit for bit the blocking one;
#   2. the memory planner against the GPU (scripts/check_planner.sh): eight 1.7B configurations
#      (seq 2k at micro-batch 1 and 4, seq 8k, seq 32k, with and without recomputation, GQA,
#      FSDP), 2 iterations of one micro-batch each; predicted vs in-use vs reserved peak, pass
#      when reserved is within 10 % of the prediction.
# Expected: ~10 s for 1, ~60-75 s for 2 (about 6 s of start-up per configuration, the seq-32k
# ones ~3 s per iteration). Results: OUT/fsdp_gpu.log, OUT/planner/check_planner.md (+ .json,
# one log and metrics file per configuration), OUT/summary.txt.
#   scripts/device_fsdp.sh BUILD_DIR OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?build dir}; out=${2:?out dir}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
t0=$(date +%s)
timeout 60 "$build/bin/gpu_parity" --gtest_filter='FsdpCuda.*' --gtest_output=xml:"$out/fsdp_gpu.xml" \
  > "$out/fsdp_gpu.log" 2>&1
echo "FsdpCuda exit $? in $(( $(date +%s) - t0 )) s" | tee "$out/summary.txt"
grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|Failure' "$out/fsdp_gpu.log" | head -20 | tee -a "$out/summary.txt"
t1=$(date +%s)
PLANNER_MICRO_BATCHES=1 PLANNER_TIMEOUT=30 MEGADLM_BIN="$build/bin" \
  bash scripts/check_planner.sh "$out/planner" 2 > "$out/planner.log" 2>&1
echo "check_planner exit $? in $(( $(date +%s) - t1 )) s" | tee -a "$out/summary.txt"
cat "$out/planner.log" >> "$out/summary.txt"; tail -12 "$out/planner.log"
