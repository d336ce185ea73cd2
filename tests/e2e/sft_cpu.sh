#!/usr/bin/env bash
# Supervised fine-tuning on the CPU, as a user runs it: a tiny diffusion LM pre-trained briefly on
# mock data, then `pretrain_difflm --load PRE --finetune --sft-data-path pairs.jsonl` (masks on
# response tokens only, EOS padding) learns six prompt -> response mappings: generate_difflm
# answers each prompt with its response and stops at the EOS it learned.
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
args=$(grep -v '^#' "$src/configs/tiny_dlm.args" | tr '\n' ' ' | sed -e 's/--mock-data//' \
  -e 's/--train-iters [0-9]*//' -e 's/--seq-length [0-9]*//' -e 's/--max-position-embeddings [0-9]*//' \
  -e 's/--lr [0-9e.-]*//' -e 's/--min-lr [0-9e.-]*//' -e 's/--micro-batch-size [0-9]*//' \
  -e 's/--global-batch-size [0-9]*//' -e 's/--mask-token [0-9]*//')
common="$args --device cpu --mask-token 126 --seq-length 16 --max-position-embeddings 16 --eval-iters 0"
# shellcheck disable=SC2086
"$bin/pretrain_difflm" $common --mock-data --train-iters 20 --lr 3e-3 --min-lr 3e-4 --micro-batch-size 4 \
  --global-batch-size 8 --log-interval 10 --save pre --save-interval 20 > pre.log 2>&1 || { cat pre.log; exit 1; }
# shellcheck disable=SC2086
"$bin/pretrain_difflm" $common --load pre --finetune --tokenizer-type NullTokenizer --sft-data-path pairs.jsonl \
  --train-iters 300 --lr 5e-3 --min-lr 5e-4 --micro-batch-size 16 --global-batch-size 16 --log-interval 50 \
  --save sft --save-interval 300 > sft.log 2>&1 || { cat sft.log; exit 1; }
grep -q "supervised fine-tuning data: 6 examples" sft.log || { cat sft.log; echo "FAIL: SFT data"; exit 1; }
grep -q "iteration        0" sft.log && { echo "FAIL: finetune"; exit 1; }
grep -o "lm loss: [^|]*" sft.log | awk '{print $3}' > losses
first=$(head -1 losses); last=$(tail -1 losses)
awk -v a="$first" -v b="$last" 'BEGIN { printf "SFT loss: %g -> %g\n", a, b; if (!(b < 0.05 && b < a / 10)) { print "FAIL: the SFT loss did not fall"; exit 1 } }'
"$bin/generate_difflm" --load sft --prompts-jsonl prompts.jsonl --gen-length 11 --steps 11 --block-length 11 \
  --batch-size 6 --device cpu --output answers.jsonl 2> gen.err || { cat gen.err; exit 1; }
"$PY" - <<'P' || { echo "FAIL: the fine-tuned model does not answer its prompts"; exit 1; }
import json, sys
want = [json.loads(l)["expect"] + [127] for l in open("prompts.jsonl")]
got = [json.loads(l) for l in open("answers.jsonl")]
bad = [(i, g["token_ids"], w) for i, (g, w) in enumerate(zip(got, want)) if g["token_ids"] != w or not g["stopped_at_eos"]]
for b in bad: print("  prompt %d: answered %s, learned %s" % b)
sys.exit(1 if bad else 0)
P
echo "PASS: six prompt -> response mappings learned with response-only masking; answers stop at EOS"
