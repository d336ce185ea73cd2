#!/usr/bin/env bash
# evaluate_difflm's conditional log-likelihood against the independent NumPy implementation of
# LLaDA's estimator (tests/golden/llada_reference.py): the same masks from
# the documented Philox draws, and log-likelihoods equal within 1e-5 (megadlm's forward is fp32,
# the reference's float64: ~1e-6 apart), with and without guidance and for several mini-batch
# sizes. Requests in lm-evaluation-harness form (text arguments) go through the tokenizer.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
source "$src/tests/e2e/lib/python_numpy.sh"
tiny_checkpoint ckpt
export_hf ckpt hf
cat > requests.jsonl <<'R'
{"context_ids": [5, 17, 33, 2, 90], "continuation_ids": [14, 61, 7]}
{"context_ids": [100, 3], "continuation_ids": [44, 45, 46, 47, 48, 49]}
{"context_ids": [9], "continuation_ids": [12]}
{"context_ids": [], "continuation_ids": [8, 8, 9, 10]}
R
while read -r opts; do
  [ -z "$opts" ] && continue
  "$bin/evaluate_difflm" --load ckpt --task loglik --requests-jsonl requests.jsonl $opts --device cpu \
    --seed 99 --output cpp.jsonl 2> eval.err || { cat eval.err; exit 1; }
  "$PY" "$ref" loglik --model hf --requests-jsonl requests.jsonl --mask-id 127 --seed 99 \
    $(echo "$opts" | sed 's/--mc-batch-size/--mc-batch/') --output py.jsonl > /dev/null
  "$PY" - "$opts" <<'P' || { echo "FAIL: log-likelihoods differ from the reference with $1"; exit 1; }
import json, sys
a = [json.loads(l)["loglikelihood"] for l in open("cpp.jsonl")]
b = [json.loads(l)["loglikelihood"] for l in open("py.jsonl")]
worst = max(abs(x - y) for x, y in zip(a, b))
print(f"{sys.argv[1]}: {len(a)} requests, largest difference {worst:.2e}")
sys.exit(0 if len(a) == len(b) == 4 and worst <= 1e-5 else 1)
P
done <<'CASES'
--mc-num 8 --mc-batch-size 4
--mc-num 6 --mc-batch-size 3
--mc-num 16 --mc-batch-size 16 --cfg-scale 1.0
--mc-num 4 --mc-batch-size 1 --cfg-scale 0.5
CASES
# Text requests in lm-eval's loglikelihood form: (context, continuation), trailing spaces of the
# context moved into the continuation (NullTokenizer: whitespace-separated ids).
cat > text.jsonl <<'R'
{"arguments": ["5 17 33 2 90 ", "14 61 7"]}
R
"$bin/evaluate_difflm" --load ckpt --task loglik --requests-jsonl text.jsonl --tokenizer-type NullTokenizer \
  --mc-num 8 --mc-batch-size 4 --device cpu --seed 99 --output text_out.jsonl 2> eval.err || { cat eval.err; exit 1; }
"$PY" -c "
import json, sys
a = json.loads(open('text_out.jsonl').readline()); b = json.loads(open('cpp.jsonl').readline())
sys.exit(0 if a['context_tokens'] == 5 and a['continuation_tokens'] == 3 else 1)" \
  || { echo "FAIL: the text request was not split into 5 context and 3 continuation tokens"; cat text_out.jsonl; exit 1; }
set +e
"$bin/evaluate_difflm" --load ckpt --task loglik --requests-jsonl requests.jsonl --mc-num 10 --mc-batch-size 4 \
  --device cpu > bad.out 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "\`--mc-num 10\` must be a positive multiple of \`--mc-batch-size 4\`" bad.out \
  || { echo "FAIL: bad --mc-num"; cat bad.out; exit 1; }
echo "PASS: log-likelihoods equal the NumPy reference within 1e-5"
