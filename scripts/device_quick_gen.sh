#!/usr/bin/env bash
# A short device call while tuning exact decoding: the parity suites of the kernels it runs
# (fused QK-norm + RoPE, sampling, attention, key/value cache), the canvas attention rows of
# megadlm_bench, and exact generation at batch 1 and 16 (1.7B random weights, gen 256, block 32,
# 256 steps). scripts/device_generation_speed.sh is the full call.
#   scripts/device_quick_gen.sh BUILD OUT
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:?usage: device_quick_gen.sh BUILD OUT}" && pwd); out=${2:?}
mkdir -p "$out"; out=$(cd "$out" && pwd)
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
work=$(mktemp -d); sum=$out/summary.txt
timeout 120 "$build/bin/gpu_parity" --gtest_filter='FusedParity.*:SamplingParity.*:AttentionParity.*:KvCacheParity.*:TrainingParity.*' > "$work/parity.log" 2>&1
echo "parity: exit $? ($SECONDS s): $(grep -E '^\[  (PASSED|FAILED)' "$work/parity.log" | tr '\n' ' ')" >> "$sum"
grep -E "Failure|expected|FAILED" "$work/parity.log" | head -20 >> "$sum"
timeout 100 "$build/bin/megadlm_bench" ops --op canvas > "$work/attention_ops.txt" 2>&1
grep -E "^attention_fwd_canvas" "$work/attention_ops.txt" | grep -v " B=" >> "$sum"
"$build/bin/pretrain_difflm" @configs/megadlms_1.7b.args --mock-data --device cuda --train-iters 1 \
  --global-batch-size 4 --lr-warmup-iters 0 --lr-decay-iters 10 --lr-wsd-decay-iters 1 --log-interval 1 \
  --eval-iters 0 --save "$work/ckpt" --save-interval 1 --no-save-optim > "$work/save.log" 2>&1
echo "save: exit $? ($SECONDS s)" >> "$sum"
python3 - "$work/prompts.jsonl" <<'P'
import json, random, sys
random.seed(0)
with open(sys.argv[1], "w") as f:
    for i in range(16):
        f.write(json.dumps({"prompt_ids": [random.randrange(1, 50000) for _ in range(32 - (i % 4))]}) + "\n")
P
timeout 150 "$build/bin/generate_bench" --load "$work/ckpt" --prompts-jsonl "$work/prompts.jsonl" \
  --gen-length 256 --steps 256 --block-length 32 --device cuda --batch-sizes 1,16 --batch1-prompts 2 \
  --modes exact --output "$work/gen.jsonl" > "$work/gen.log" 2>&1
echo "generation: exit $? ($SECONDS s)" >> "$sum"
grep -h tokens_per_s "$work/gen.jsonl" >> "$sum"
tar czf "$out/results.tgz" -C "$work" --exclude=ckpt .
cat "$sum"
