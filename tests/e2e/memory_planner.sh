#!/usr/bin/env bash
# The memory planner as a user meets it (docs/planner.md):
#   1. `--dry-run` of the 1.7B model prints the predicted peak per GPU broken down, and "fits";
#   2. a layout that cannot fit (32k tokens x 4 per micro-batch on one GPU) is refused by
#      `--dry-run` with exit 2, the predicted bytes and the changes that would fit;
#   3. `--plan --world-size 8` lists five layouts with their launch flags, fastest first;
#   4. a real launch that cannot fit (a hidden size of a million; activations past the host, on
#      the CPU backend) stops with exit 2 and says so before allocating or training (no
#      std::bad_alloc);
#   5. training logs the predicted next to the measured peak after the first iteration.
set -uo pipefail
bin=$1; src=$2
p="$bin/pretrain_difflm"
fail() { echo "FAIL: $*"; exit 1; }
big=(@"$src/configs/megadlms_1.7b.args" --mock-data --train-iters 3000 --global-batch-size 64)

# ---- 1
out=$("$p" "${big[@]}" --dry-run --world-size 8 2>&1); rc=$?
[ $rc -eq 0 ] || fail "1.7B dry run exit $rc: $out"
for text in "memory plan (GB = 1e9 bytes; per GPU, bf16 weights and activations):" \
            "  weights (bf16)" "  gradients (fp32)" "  master weights (fp32)" "  Adam moments (fp32 m, v)" \
            "  activations per micro-batch" "  x micro-batches in flight (pipeline schedule)" \
            "  logits and loss" "  communication buffers" "  workspaces and temporaries" "  predicted peak" \
            "of 141.00 GB (--gpu-memory-gb): fits"; do
  grep -qF -- "$text" <<< "$out" || fail "dry run: missing '$text' in: $out"
done

# ---- 2
out=$("$p" "${big[@]}" --dry-run --world-size 1 --global-batch-size 4 --micro-batch-size 4 \
      --seq-length 32768 --max-position-embeddings 32768 2>&1); rc=$?
[ $rc -eq 2 ] || fail "oversized dry run should exit 2, got $rc: $out"
for text in "DOES NOT FIT" "dry run: refused: the layout does not fit: the busiest rank needs" \
            "it would fit with \`--recompute-granularity full --recompute-method uniform --recompute-num-layers 1\`"; do
  grep -qF -- "$text" <<< "$out" || fail "oversized dry run: missing '$text' in: $out"
done

# ---- 3
out=$("$p" "${big[@]}" --plan --world-size 8 2>&1); rc=$?
[ $rc -eq 0 ] || fail "--plan exit $rc: $out"
grep -qF "layout plan for 8 GPUs" <<< "$out" || fail "--plan: no plan in: $out"
[ "$(grep -c '     flags:' <<< "$out")" -eq 5 ] || fail "--plan: expected 5 layouts with flags in: $out"
# Fastest first: the step times are non-decreasing.
grep -E '^  [1-5] ' <<< "$out" | awk '{ for (i = NF; i > 0; --i) if ($i ~ /^[0-9.]+$/) { n++; if (n == 3) { t = $i; break } } n = 0;
  if (t + 0 < prev + 0) bad = 1; prev = t } END { exit bad }' || fail "--plan: not sorted by step time: $out"

# ---- 4
# A hidden size of a million: its parameters alone exceed the host (M-31, the parameter check
# that runs first); never a bad_alloc, never an iteration.
out=$("$p" @"$src/configs/tiny_dlm.args" --device cpu --hidden-size 1000000 --train-iters 20 2>&1); rc=$?
[ $rc -eq 2 ] || fail "a 1M hidden size should exit 2, got $rc: $out"
grep -qE "\[M-31\]|the layout does not fit: the busiest rank needs" <<< "$out" || fail "no memory message: $out"
grep -qE "bad_alloc|iteration +[0-9]+/" <<< "$out" && fail "the oversized launch allocated or trained: $out"
# Small parameters but activations past the host: the planner's launch check, with its advice.
out=$("$p" @"$src/configs/tiny_dlm.args" --device cpu --seq-length 65536 --max-position-embeddings 65536 \
      --micro-batch-size 128 --global-batch-size 128 --train-iters 20 2>&1); rc=$?
[ $rc -eq 2 ] || fail "activations past the host should exit 2, got $rc: $out"
grep -qF "the layout does not fit: the busiest rank needs" <<< "$out" || fail "no planner message: $out"
grep -qE "bad_alloc|iteration +[0-9]+/" <<< "$out" && fail "the oversized launch allocated or trained: $out"

# ---- 5
out=$("$p" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 20 --lr-warmup-iters 1 --log-interval 1 --eval-iters 0 2>&1); rc=$?
[ $rc -eq 0 ] || fail "tiny run exit $rc: $out"
grep -qE "^ > peak memory by step 1 \(GB\): predicted peak [0-9.]+ \| measured peak [0-9.]+ \(resident set of the process\)" <<< "$out" \
  || fail "no predicted-vs-measured memory line: $out"
echo "PASS"
