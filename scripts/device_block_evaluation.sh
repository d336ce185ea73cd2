#!/usr/bin/env bash
# One device call on block-diffusion evaluation's speed (docs/evaluation.md): gpu_parity's
# BlockLikelihoodParity.*, then examples/s of evaluate_difflm on the 1.7B architecture (random
# weights: the speed does not depend on them) as a block-diffusion model (block 32, block-causal
# clean half) and, for comparison, as the full-sequence model of the same shape:
#   * ELBO: 16 samples of 2048 tokens, micro-batches of 4, one noise draw;
#   * multiple choice: 32 documents, a 256-token context and 4 choices of 8-23 tokens, LLaDA's
#     --mc-num 128 --mc-batch-size 16 (one is the examples/s of log p(answer | context) x 4).
#   scripts/device_block_evaluation.sh BUILD OUT
# Then, when python3 has torch and transformers, the same computations through transformers
# (scripts/bench_block_evaluation_reference.py on each checkpoint exported by `convert_checkpoint
# --to-hf --dtype bf16`, the same text.jsonl and mc.jsonl; multiple choice on the first REF_DOCS
# (16) documents, whose choice lengths cycle with period 16, so the same mix as all 32).
# Writes OUT/summary.txt (one summary JSON line per megadlm run, the reference's `reference ...`
# lines, or the line saying why it was skipped), OUT/evaluation.md (task, model, examples/s of
# megadlm and of transformers, their ratio, the mean values) and the logs under OUT/logs.
# A CPU smoke run: CONFIG=configs/tiny_dlm.args DEVICE=cpu SEQ=64 CONTEXT=24 BLOCK=8. PARITY=0 skips the
# parity tests (for a call that has run them already).
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
if [ "$device" = cuda ] && [ "${PARITY:-1}" = 1 ]; then
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
    > "$work/mc_$model.out" 2> "$out/logs/mc_$model.log"
  echo "multiple-choice $model: exit $? ($SECONDS s) $(tr -d '\n ' < "$work/mc_$model.json" 2>/dev/null)" >> "$sum"
done
# The transformers reference: each checkpoint exported to a Hugging Face folder (both at once:
# CPU and disk work, after megadlm's timed runs), then one process per model runs both tasks.
ref_docs=${REF_DOCS:-16}
if ref_err=$(python3 -c "import torch, transformers" 2>&1); then
  for model in bd full; do
    timeout 150 "$build/bin/convert_checkpoint" --to-hf --load "$work/$model" --out "$work/hf_$model" --dtype bf16 \
      > "$out/logs/convert_$model.log" 2>&1 &
  done
  for model in bd full; do
    wait -n; echo "convert (one of bd, full): exit $? ($SECONDS s)" >> "$sum"
  done
  for model in bd full; do
    read -r lw minm tg < <(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['run_config']['diffusion']
print(d['loss_weight'], d['min_masked'], d['t_granularity'])" "$work/$model/iter_0000001/metadata.json")
    timeout 200 python3 scripts/bench_block_evaluation_reference.py --model "$work/hf_$model" --name "$model" \
      --device "$device" --text-jsonl "$work/text.jsonl" --seq-length "$seq" --micro-batch-size 4 --max-samples 16 \
      --task-jsonl "$work/mc.jsonl" --mc-num 128 --mc-batch-size 16 --max-documents "$ref_docs" \
      --loss-weight "$lw" --min-masked "$minm" --t-granularity "$tg" --summary-json "$work/ref_$model.jsonl" \
      > "$out/logs/reference_$model.log" 2>&1
    echo "reference $model: exit $? ($SECONDS s)" >> "$sum"
    grep -E '^reference ' "$out/logs/reference_$model.log" >> "$sum"
  done
  ref_note="ran (multiple choice on the first $ref_docs documents)"
else
  ref_note="skipped: python3 has no torch + transformers ($(echo "$ref_err" | tail -1))"
  echo "transformers reference: $ref_note" >> "$sum"
fi
python3 - "$work" "$out/evaluation.md" "$ref_note" "$device" "$seq" "$context" "$block" <<'P'
import json, os, sys
work, md, note, device, seq, ctx, block = sys.argv[1:8]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
def mean_ll(path):  # megadlm's per-document output lines: the mean log-likelihood of a choice
    try:
        lls = [x for l in open(path) if l.strip() for x in json.loads(l).get("loglikelihoods", [])]
    except (OSError, ValueError):
        return None
    return sum(lls) / len(lls) if lls else None
ref = {}
for model in ("bd", "full"):
    try:
        for l in open(os.path.join(work, f"ref_{model}.jsonl")):
            r = json.loads(l)
            ref[(r["task"], model)] = r
    except (OSError, ValueError):
        pass
names = {"bd": f"block diffusion (block {block})", "full": "full sequence"}
rows = ["| task | model | megadlm examples/s | transformers examples/s | megadlm / transformers | megadlm value | transformers value |",
        "|---|---|---|---|---|---|---|"]
def num(v, f="{:.3f}"):
    return f.format(v) if isinstance(v, (int, float)) else "-"
for task, key in (("elbo", "elbo"), ("multiple-choice", "mc")):
    for model in ("bd", "full"):
        m, r = load(os.path.join(work, f"{key}_{model}.json")), ref.get((task, model))
        me = m.get("examples_per_second") if m else None
        re_ = r.get("examples_per_s") if r else None
        ratio = f"{me / re_:.2f}x" if me and re_ else "-"
        if task == "elbo":
            mv = f"ELBO/token {num(m.get('elbo_per_token'))}" if m else "-"
            rv = f"ELBO/token {num(r['elbo_per_token'])}" if r else "-"
        else:
            mv = f"mean log p {num(mean_ll(os.path.join(work, f'mc_{model}.out')), '{:.2f}')}, acc {num(m.get('acc'), '{:.2f}')} ({m.get('documents')} docs)" if m else "-"
            rv = f"mean log p {num(r['mean_loglikelihood'], '{:.2f}')}, acc {num(r['acc'], '{:.2f}')} ({r['documents']} docs)" if r else "-"
        rows.append(f"| {task} | {names[model]} | {num(me, '{:.2f}')} | {num(re_, '{:.2f}')} | {ratio} | {mv} | {rv} |")
head = [f"Evaluation speed on {device}: evaluate_difflm against the same computation through transformers "
        f"(scripts/bench_block_evaluation_reference.py, bf16 on CUDA, sdpa with a 4D additive mask). ELBO: 16 samples "
        f"of {seq} tokens, micro-batches of 4, one noise draw. Multiple choice: {ctx}-token contexts, 4 choices, "
        f"--mc-num 128 --mc-batch-size 16; megadlm over 32 documents. Random weights and different random noise: "
        f"the values agree in magnitude, not exactly. transformers reference: {note}.", ""]
open(md, "w").write("\n".join(head + rows) + "\n")
P
echo "table: $out/evaluation.md ($SECONDS s)" >> "$sum"
rm -rf "$work"
cat "$sum"
cat "$out/evaluation.md"
