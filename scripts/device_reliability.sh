#!/usr/bin/env bash
# Fault detection and replay on the GPU, from a carried build (never builds): fault replay rests on
# a replayed step
# being the same computation, which on a GPU holds only with deterministic kernels. Runs the tiny
# model (configs/tiny_dlm.args) on CUDA:
#   1. --rerun-mode report_stats with --deterministic-mode: every replay must be bitwise identical;
#      without it: the count is reported (informative: how far the default kernels drift);
#   2. an injected transient fault (--error-injection-type transient_error) is replayed away: the
#      run is bitwise the clean one (both --deterministic-mode);
#   3. an injected persistent fault stops the run with exit code 16 and a checkpoint of the last
#      good state, which verifies and resumes bitwise like the clean run;
#   4. a diverging run (--lr 1e3) is reported as a spike, with and without --check-for-spiky-loss.
# About 60 s of GPU time (eight short runs, each mostly CUDA start-up).
#   scripts/device_reliability.sh BUILD OUT      (BUILD holds bin/ and lib/; DEVICE=cpu tries
#   the script itself on a machine without a GPU)
# OUT/summary.txt: one PASS/FAIL/INFO line per check; OUT/*.log, *.jsonl: the runs.
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:?usage: scripts/device_reliability.sh BUILD OUT}" && pwd)
out=${2:?usage: scripts/device_reliability.sh BUILD OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=$build/bin
summary=$out/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1 || echo "no nvidia-smi" > "$out/gpu.txt"
say "INFO device: $(head -1 "$out/gpu.txt")"
iters=12
train() { timeout 120 "$bin/pretrain_difflm" @configs/tiny_dlm.args --device "${DEVICE:-cuda}" --log-interval 1 \
            --lr-warmup-iters 2 --lr-decay-iters "$iters" --train-iters "$iters" --eval-iters 0 "$@"; }
# The numbers of a run's training lines that must repeat bitwise (timings and memory need not).
det() { grep '"kind":"train"' "$1" | while IFS= read -r l; do
          grep -oE '"(iteration|lm_loss|grad_norm|lr|consumed_samples)":[^,}]*' <<< "$l" | paste -sd' '; done; }

# ---- 1
train --deterministic-mode --rerun-mode report_stats > "$out/stats_det.log" 2>&1
rc=$?
stats=$(grep -o 'rerun stats.*' "$out/stats_det.log" | tail -1)
if [ "$rc" = 0 ] && grep -qE "$iters step\(s\) replayed, $iters bitwise identical" <<< "$stats"; then
  say "PASS 1: --deterministic-mode: $stats"
else
  say "FAIL 1: --deterministic-mode replays (exit $rc): ${stats:-$(tail -2 "$out/stats_det.log")}"
fi
train --rerun-mode report_stats > "$out/stats_default.log" 2>&1
say "INFO 1: default kernels (exit $?): $(grep -o 'rerun stats.*' "$out/stats_default.log" | tail -1)"

# ---- 2
train --deterministic-mode --metrics-jsonl "$out/clean.jsonl" > "$out/clean.log" 2>&1 ||
  say "FAIL 2: the clean run: $(tail -2 "$out/clean.log")"
train --deterministic-mode --rerun-mode validate_results --error-injection-rate 3 \
  --error-injection-type transient_error --metrics-jsonl "$out/transient.jsonl" > "$out/transient.log" 2>&1
rc=$?
n=$(grep -c "a TRANSIENT fault" "$out/transient.log")
if [ "$rc" = 0 ] && [ "$n" -ge 1 ] && cmp -s <(det "$out/clean.jsonl") <(det "$out/transient.jsonl"); then
  say "PASS 2: $n injected transient fault(s) replayed away on the GPU; the run is bitwise the clean one"
else
  say "FAIL 2: exit $rc, $n transient verdict(s); $(diff <(det "$out/clean.jsonl") <(det "$out/transient.jsonl") | head -2 | tr '\n' ' ')"
fi

# ---- 3
rm -rf "$out/ck"
train --deterministic-mode --rerun-mode validate_results --error-injection-rate 3 \
  --error-injection-type persistent_error --save "$out/ck" --save-interval 100 > "$out/persistent.log" 2>&1
rc=$?
line=$(grep "a REPRODUCIBLE fault" "$out/persistent.log" | tail -1)
k=$(sed -nE 's/.*the last good state \(iteration ([0-9]+)\) is the checkpoint .*/\1/p' <<< "$line")
if [ "$rc" = 16 ] && [ -n "$k" ] && "$bin/convert_checkpoint" --check "$out/ck" > "$out/check.log" 2>&1; then
  train --deterministic-mode --load "$out/ck" --save "$out/ck" --save-interval 100 \
    --metrics-jsonl "$out/resumed.jsonl" > "$out/resumed.log" 2>&1
  rc2=$?
  if [ "$rc2" = 0 ] && cmp -s <(det "$out/clean.jsonl" | tail -n $((iters - k))) <(det "$out/resumed.jsonl"); then
    say "PASS 3: a persistent fault stopped the run at iteration $((k + 1)) (exit 16); iter $k verifies and resumes bitwise"
  else
    say "FAIL 3: the resume from iter $k (exit $rc2) differs from the clean run: $(tail -2 "$out/resumed.log")"
  fi
else
  say "FAIL 3: exit $rc (expected 16), checkpoint '${k:-none}': ${line:-$(tail -2 "$out/persistent.log")} $(cat "$out/check.log" 2>/dev/null)"
fi

# ---- 4
train --lr 1e3 --clip-grad 0 --no-check-for-nan-in-loss-and-grad --check-for-spiky-loss \
  --rerun-mode validate_results > "$out/diverge_flag.log" 2>&1
rc=$?
if grep -q "found a spiky loss" "$out/diverge_flag.log"; then
  say "PASS 4a: --check-for-spiky-loss reports the divergence (exit $rc): $(grep -m1 'found a spiky loss' "$out/diverge_flag.log" | cut -c1-200)"
else
  say "FAIL 4a: not reported (exit $rc): $(grep 'lm loss' "$out/diverge_flag.log" | tail -2)"
fi
train --lr 1e3 --clip-grad 0 --no-check-for-nan-in-loss-and-grad > "$out/diverge_default.log" 2>&1
rc=$?
if grep -q "may be diverging" "$out/diverge_default.log"; then
  say "PASS 4b: the default run reports the divergence (exit $rc): $(grep -m1 'may be diverging' "$out/diverge_default.log" | cut -c1-200)"
else
  say "FAIL 4b: the default run says nothing (exit $rc): $(grep 'lm loss' "$out/diverge_default.log" | tail -2)"
fi
grep -c '^FAIL' "$summary" > /dev/null && exit 1
exit 0
