#!/usr/bin/env bash
# Block-diffusion supervised fine-tuning on the CPU, as a user runs it (docs/finetuning.md,
# "Block diffusion"): a tiny block-diffusion LM (block 4) pre-trained briefly on mock data, then
# `--finetune --sft-data-path pairs.jsonl` with the block diffusion flags learns six prompt ->
# response mappings: the loss falls, and block decoding (generate_difflm's default for the
# checkpoint) answers every prompt with its response and stops at EOS. The same with the causal
# clean half, one noise level per row and the token normalisation (block and autoregressive
# decoding both answer). A fine-tuning run resumed from its checkpoint continues bitwise.
set -euo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/tests/e2e/lib/python_numpy.sh"
cd "$tmp"
"$PY" - <<'P'
import json, random
random.seed(5)
with open("pairs.jsonl", "w") as f, open("prompts.jsonl", "w") as p:
    for k in range(6):
        prompt = [random.randrange(2, 120) for _ in range(5)]
        resp = [random.randrange(2, 120) for _ in range(random.choice([3, 4, 5]))]
        f.write(json.dumps({"prompt_ids": prompt, "response_ids": resp}) + "\n")
        p.write(json.dumps({"prompt_ids": prompt, "expect": resp}) + "\n")
P
# NullTokenizer over 128 ids: EOD (the EOS that pads responses) is 127, so the mask token is 126.
# Prompts of 5 tokens and blocks of 4: the prompt's last block is shared with the response.
args=$(grep -v '^#' "$src/configs/tiny_dlm.args" | tr '\n' ' ' | sed -e 's/--mock-data//' \
  -e 's/--train-iters [0-9]*//' -e 's/--seq-length [0-9]*//' -e 's/--max-position-embeddings [0-9]*//' \
  -e 's/--lr [0-9e.-]*//' -e 's/--min-lr [0-9e.-]*//' -e 's/--micro-batch-size [0-9]*//' \
  -e 's/--global-batch-size [0-9]*//' -e 's/--mask-token [0-9]*//' -e 's/--attention-mask-type [a-z_]*//')
common="$args --device cpu --mask-token 126 --seq-length 16 --max-position-embeddings 16 --eval-iters 0
  --attention-mask-type block_causal --dlm-block-size 4 --dlm-loss-weight inv_t_eps"
sft="--load pre --finetune --tokenizer-type NullTokenizer --sft-data-path pairs.jsonl --lr 5e-3 --min-lr 5e-4
  --micro-batch-size 16 --global-batch-size 16"
run() {
  local name=$1; shift
  # shellcheck disable=SC2086
  "$bin/pretrain_difflm" $common "$@" > "$name.log" 2>&1 || { echo "FAIL: $name exited $?"; cat "$name.log"; exit 1; }
}
falls() {  # the first logged loss (mean of iterations 1-50) against the last
  grep -o "lm loss: [^|]*" "$1.log" | awk '{print $3}' > "$1.losses"
  awk -v name="$1" -v a="$(head -1 "$1.losses")" -v b="$(tail -1 "$1.losses")" 'BEGIN {
    printf "%s: lm loss %g -> %g\n", name, a, b
    if (!(b < 0.05 && b < a / 10)) { print "FAIL: " name ": the loss did not fall"; exit 1 } }'
}
answers() {  # generate_difflm on checkpoint $1 with --decode $2 answers every prompt exactly
  "$bin/generate_difflm" --load "$1" --prompts-jsonl prompts.jsonl --gen-length 8 --batch-size 6 --device cpu \
    --decode "$2" --output "answers_$1_$2.jsonl" 2> gen.err || { cat gen.err; exit 1; }
  "$PY" - "answers_$1_$2.jsonl" <<'P' || { echo "FAIL: $1 ($2 decoding) does not answer its prompts"; exit 1; }
import json, sys
want = [json.loads(l)["expect"] + [127] for l in open("prompts.jsonl")]
got = [json.loads(l) for l in open(sys.argv[1])]
bad = [(i, g["token_ids"], w) for i, (g, w) in enumerate(zip(got, want)) if g["token_ids"] != w or not g["stopped_at_eos"]]
for b in bad: print("  prompt %d: answered %s, learned %s" % b)
sys.exit(1 if bad or len(got) != 6 else 0)
P
  echo "$1: $2 decoding answers the six prompts"
}
run pre --mock-data --train-iters 20 --lr 3e-3 --min-lr 3e-4 --micro-batch-size 4 --global-batch-size 8 \
  --log-interval 10 --save pre --save-interval 20
# shellcheck disable=SC2086
run sft $sft --train-iters 300 --log-interval 50 --save sft --save-interval 300
grep -q "supervised fine-tuning data: 6 examples" sft.log || { cat sft.log; echo "FAIL: SFT data"; exit 1; }
falls sft
answers sft block
grep -q "block length 4" gen.err || { cat gen.err; echo "FAIL: block decoding did not use the checkpoint's block size"; exit 1; }
# The causal clean half (next-token loss on the response), one t per row, token normalisation.
variant=(--dlm-bd-clean-attention causal --dlm-diffusion-loss-scale 0.5 --dlm-t-granularity sequence
         --dlm-sft-loss-norm token)
# shellcheck disable=SC2086
run sftc $sft "${variant[@]}" --train-iters 200 --log-interval 50 --save sftc --save-interval 200
falls sftc
answers sftc block
answers sftc ar
# Resume is exact: 20 fine-tuning iterations straight, or 10, a checkpoint, and 10 more from it
# (the resume continues the fine-tuning run: no --finetune, the SFT data position restored).
for v in bc causal; do
  extra=(); [ "$v" = causal ] && extra=("${variant[@]}")
  # shellcheck disable=SC2086
  run "straight_$v" $sft "${extra[@]}" --train-iters 20 --lr-decay-iters 40 --log-interval 1 --metrics-jsonl "straight_$v.jsonl"
  # shellcheck disable=SC2086
  run "first_$v" $sft "${extra[@]}" --train-iters 10 --lr-decay-iters 40 --log-interval 1 --save "ck_$v" --save-interval 10
  # shellcheck disable=SC2086
  run "resumed_$v" --tokenizer-type NullTokenizer --sft-data-path pairs.jsonl --lr 5e-3 --min-lr 5e-4 \
    --micro-batch-size 16 --global-batch-size 16 "${extra[@]}" --train-iters 20 --lr-decay-iters 40 --log-interval 1 \
    --load "ck_$v" --metrics-jsonl "resumed_$v.jsonl"
  "$PY" - "$v" <<'P' || { echo "FAIL: the resumed $v fine-tuning run differs from the straight one"; exit 1; }
import json, sys
v = sys.argv[1]
rows = lambda n: {r["iteration"]: r for r in map(json.loads, open(n)) if "lm_loss" in r}
a, b = rows("straight_%s.jsonl" % v), rows("resumed_%s.jsonl" % v)
its = list(range(11, 21))
assert all(i in a and i in b for i in its) and min(b) == 11, (sorted(a), sorted(b))  # b starts after the checkpoint
bad = [(i, a[i]["lm_loss"], b[i]["lm_loss"]) for i in its
       if a[i]["lm_loss"] != b[i]["lm_loss"] or a[i]["grad_norm"] != b[i]["grad_norm"]]
assert not bad, bad
print("resume (%s): iterations 11-20 bitwise equal to the straight run" % v)
P
done
echo "PASS: block-diffusion fine-tuning learns the prompt -> response mappings, decodes them block by block, resumes exactly"
