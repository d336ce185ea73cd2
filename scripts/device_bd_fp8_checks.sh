#!/usr/bin/env bash
# One device call (~6-9 minutes) that verifies and times the copy-free block-diffusion bulk attention
# and the FP8 recipes on one GPU, from a carried build folder (bin/ and lib/; nothing is built):
#   1. gpu_parity: block diffusion (bulk and flash), context parallelism and every attention test (the
#      cuDNN plan key and the merge kernel serve them all), FP8 (per-tensor and blockwise);
#      the auto-threshold case under MEGADLM_BD_ATTENTION=bulk and =flash;
#   2. megadlm_bench ops --op attention_fwd_bd / attention_bwd_bd: flash vs bulk at L 2048 / 4096 / 8192
#      (the first L where bulk wins both is kBlockDiffusionBulkMinHalf);
#   3. megadlm_bench ops --op fp8_ (per-tensor and blockwise GEMMs, block quantizers);
#   4. scripts/bench_fp8.sh with bf16, delayed and blockwise (6 iterations each);
#   5. if time is left, a CUPTI trace of an FP8-delayed iteration (scripts/trace_iteration.sh).
#
#   scripts/device_bd_fp8_checks.sh BUILD OUT        OUT/summary.txt has one line per stage
set -uo pipefail
cd "$(dirname "$0")/.."
B=$(cd "${1:?usage: scripts/device_bd_fp8_checks.sh BUILD OUT}" && pwd)
W=${2:?usage: scripts/device_bd_fp8_checks.sh BUILD OUT}
mkdir -p "$W"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MEGADLM_BIN=$B/bin
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$W/machine.txt"
sm() { echo "$*" | tee -a "$W/summary.txt"; }
t=$SECONDS
timeout 150 "$B/bin/gpu_parity" --gtest_filter='AttentionBlockDiffusionParity.*:ContextParallelParity.*:AttentionParity.*:Fp8Parity.*:Fp8TrainingParity.*' > "$W/parity.log" 2>&1
sm "parity rc=$? $((SECONDS - t))s: $(grep -cE '^\[       OK' "$W/parity.log") ok; $(grep -E '^\[  PASSED|^\[  FAILED' "$W/parity.log" | tr '\n' ' ')"
grep -h "row window\|lse window\|copies (cuDNN" "$W/parity.log" | sort | uniq -c | head -5 >> "$W/summary.txt"
for v in bulk flash; do
  MEGADLM_BD_ATTENTION=$v timeout 25 "$B/bin/gpu_parity" --gtest_filter='AttentionBlockDiffusionParity.BulkIsWhatAuto*' > "$W/parity_auto_$v.log" 2>&1
  sm "auto-threshold case under $v: rc=$?"
done
t=$SECONDS
timeout 60 "$B/bin/megadlm_bench" ops --op attention_fwd_bd > "$W/bench_bd_fwd.log" 2>&1
timeout 90 "$B/bin/megadlm_bench" ops --op attention_bwd_bd > "$W/bench_bd_bwd.log" 2>&1
sm "bd attention bench $((SECONDS - t))s"; grep -hE "attention_(fwd|bwd)_bd" "$W"/bench_bd_*.log | cut -c1-200 >> "$W/summary.txt"
t=$SECONDS
timeout 45 "$B/bin/megadlm_bench" ops --op fp8_ > "$W/bench_fp8_ops.log" 2>&1
sm "fp8 ops bench rc=$? $((SECONDS - t))s"; grep -E "fp8_" "$W/bench_fp8_ops.log" | cut -c1-200 >> "$W/summary.txt"
t=$SECONDS
ITERS=6 RECIPES="bf16 delayed blockwise" timeout $((480 - SECONDS)) bash scripts/bench_fp8.sh "$W/fp8" > "$W/fp8.out" 2>&1
sm "fp8 training bench rc=$? $((SECONDS - t))s"; cat "$W"/fp8/*.md 2>/dev/null | head -20 >> "$W/summary.txt"
if [ $SECONDS -lt 480 ]; then
  t=$SECONDS
  timeout $((560 - SECONDS)) bash scripts/trace_iteration.sh "$W/trace" fp8d 3 @configs/megadlms_1.7b.args \
    --micro-batch-size 4 --global-batch-size 16 --fp8-format hybrid --fp8-recipe delayed > "$W/trace_fp8d.out" 2>&1
  rm -f "$W"/trace/*.trace.jsonl
  sm "fp8 delayed trace $((SECONDS - t))s (OUT/trace/fp8d.gaps.md)"
fi
cat "$W/summary.txt"
