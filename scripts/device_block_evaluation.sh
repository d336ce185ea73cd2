#!/usr/bin/env bash
# One device call on block-diffusion evaluation's speed (docs/evaluation.md): gpu_parity's
# BlockLikelihoodParity.*, then examples/s of evaluate_difflm on the 1.7B architecture (random
# weights: the speed does not depend on them) as a block-diffusion model (block 32, block-causal
# clean half) and, for comparison, as the full-sequence model of the same shape:
#   * ELBO: 16 samples of 2048 tokens, micro-batches of 4, one noise draw;
#   * multiple choice: 32 documents, a 256-token context and 4 choices of 8-23 tokens, LLaDA's
#     --mc-num 128 --mc-batch-size 16 (one is the examples/s of log p(answer | context) x 4).
#   scripts/device_block_evaluation.sh BUILD OUT
# Writes OUT/summary.txt (one summary JSON line per run) and the logs under OUT/logs.
# A CPU smoke run: CONFIG=configs/tiny_dlm.args DEVICE=cpu SEQ=64 CONTEXT=24 BLOCK=8.
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:?usage: device_block_evaluation.sh BUILD OUT}" && pwd); out=${2:?}
mkdir -p "$out/logs"; out=$(cd "$out" && pwd)
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
config=${CONFIG:-configs/megadlms_1.7b.args}; device=${DEVICE:-cuda}
seq=${SEQ:-2048}; context=${CONTEXT:-256}; block=${BLOCK:-32}
work=$(mktemp -d)
sum=$out/summary.txt
: > "$sum"
if [ "$device" = cuda ]; then
  timeout 200 "$build/bin/gpu_parity" --gtest_filter='BlockLikelihoodParity.*' > "$out/logs/parity.log" 2>&1
  echo "parity BlockLikelihoodParity.*: exit $? ($SECONDS s)" >> "$sum"
  grep -E '^\[parity\] BlockLikelihoodParity|^\[  (PASSED|FAILED)' "$out/logs/parity.log" >> "$sum"
fi
save() {  # save DIR FLAGS...: a randomly initialised checkpoint (one step on mock data, weights only)
  local dir=$1; shift
  timeout 300 "$build/bin/pretrain_difflm" @"$config" --mock-data --device "$device" --train-iters 1 \
    --seq-length "$seq" --micro-batch-size 1 --global-batch-size 1 --lr-warmup-iters 0 --lr-decay-iters 10 \
    --lr-wsd-decay-iters 1 --log-interval 1 --eval-iters 0 --save "$dir" --save-interval 1 --no-save-optim "$@" \
    > "$out/logs/save_$(basename "$dir").log" 2>&1
  echo "save $(basename "$dir"): exit $? ($SECONDS s)" >> "$sum"
}
save "$work/bd" --attention-mask-type block_causal --dlm-block-size "$block"
save "$work/full"
meta="$work/bd/iter_0000001/metadata.json"
read -r mask vocab < <(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['run_config']
print(d['diffusion']['mask_token'], d['model']['vocab_size'])" "$meta")
python3 - "$work" "$seq" "$context" "$vocab" "$mask" <<'P'
import json, random, sys
work, seq, ctx, vocab, mask = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
random.seed(0)
tok = lambda: random.choice([t for t in (random.randrange(1, vocab - 1),) if t != mask] or [1])
with open(f"{work}/text.jsonl", "w") as f:  # 16 samples of seq + 1 tokens (NullTokenizer text)
    for _ in range(16):
        f.write(json.dumps({"text": " ".join(str(tok()) for _ in range(seq))}) + "\n")
with open(f"{work}/mc.jsonl", "w") as f:
    for d in range(32):
        f.write(json.dumps({"context_ids": [tok() for _ in range(ctx)],
                            "choices_ids": [[tok() for _ in range(8 + (d + c * 5) % 16)] for c in range(4)],
                            "gold": d % 4}) + "\n")
P
for model in bd full; do
  timeout 300 "$build/bin/evaluate_difflm" --load "$work/$model" --device "$device" --task elbo \
    --text-jsonl "$work/text.jsonl" --tokenizer-type NullTokenizer --seq-length "$seq" --micro-batch-size 4 \
    --max-samples 16 --summary-json "$work/elbo_$model.json" > /dev/null 2> "$out/logs/elbo_$model.log"
  echo "elbo $model: exit $? ($SECONDS s) $(tr -d '\n ' < "$work/elbo_$model.json" 2>/dev/null)" >> "$sum"
  timeout 300 "$build/bin/evaluate_difflm" --load "$work/$model" --device "$device" --task multiple-choice \
    --task-jsonl "$work/mc.jsonl" --mc-num 128 --mc-batch-size 16 --summary-json "$work/mc_$model.json" \
    > /dev/null 2> "$out/logs/mc_$model.log"
  echo "multiple-choice $model: exit $? ($SECONDS s) $(tr -d '\n ' < "$work/mc_$model.json" 2>/dev/null)" >> "$sum"
done
rm -rf "$work"
cat "$sum"
