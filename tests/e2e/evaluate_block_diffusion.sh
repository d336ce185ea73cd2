#!/usr/bin/env bash
# evaluate_difflm on block-diffusion checkpoints against the independent NumPy reference
# (tests/golden/block_likelihood_reference.py: each block term from the inference-time sequence
# [clean blocks before it ; the noisy block], not megadlm's doubled [x_t | x_0] row): the block
# ELBO and log p(answer | context), for the block-causal clean half and for the causal one with
# its next-token loss (configs/tiny_dlm.args, --dlm-block-size 8, two training steps on the CPU),
# equal within 2e-5 (fp32 forward against float64); the reference of the other clean-half rule
# differs (the mask matters); multiple-choice scores are the reference's log-likelihoods;
# is_greedy is the reference's block-by-block greedy decoding; examples/s reported; guidance
# refused by flag.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
source "$src/tests/e2e/lib/python_numpy.sh"
bref="$src/tests/golden/block_likelihood_reference.py"
bd=(--attention-mask-type block_causal --dlm-block-size 8 --dlm-loss-weight inv_t_eps)
tiny_checkpoint bd "${bd[@]}"
tiny_checkpoint bdc "${bd[@]}" --dlm-bd-clean-attention causal --dlm-ar-loss-weight 1.0 --dlm-diffusion-loss-scale 0.3
export_hf bd hf_bd
export_hf bdc hf_bdc
# Requests: answers inside one block, across two and three blocks, a ragged last block, no context.
cat > requests.jsonl <<'R'
{"context_ids": [5, 17, 33, 2, 90], "continuation_ids": [14, 61, 7]}
{"context_ids": [100, 3, 4, 5, 6, 7, 8, 9, 10], "continuation_ids": [44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55]}
{"context_ids": [9], "continuation_ids": [12]}
{"context_ids": [], "continuation_ids": [8, 8, 9, 10, 11, 12, 13, 14, 15, 16, 90, 91, 92, 93, 94, 95, 96, 97, 98]}
R
compare() {  # compare CPP_JSONL PY_JSONL WHAT: loglikelihoods equal within 2e-5
  "$PY" - "$@" <<'P' || { echo "FAIL: $3 differs from the reference"; exit 1; }
import json, sys
a = [json.loads(l)["loglikelihood"] for l in open(sys.argv[1])]
b = [json.loads(l)["loglikelihood"] for l in open(sys.argv[2])]
worst = max(abs(x - y) for x, y in zip(a, b))
print(f"{sys.argv[3]}: {len(a)} requests, largest difference {worst:.2e}")
sys.exit(0 if len(a) == len(b) == 4 and worst <= 2e-5 else 1)
P
}
for model in bd:block_causal bdc:causal; do
  ck=${model%%:*} clean=${model##*:}
  for opts in "--mc-num 8 --mc-batch-size 4" "--mc-num 6 --mc-batch-size 3"; do
    "$bin/evaluate_difflm" --load "$ck" --task loglik --requests-jsonl requests.jsonl $opts --device cpu --seed 99 \
      --output cpp.jsonl --summary-json summary.json 2> eval.err || { cat eval.err; exit 1; }
    "$PY" "$bref" loglik --model "hf_$ck" --requests-jsonl requests.jsonl --mask-id 127 --block-size 8 --seed 99 \
      --clean "$clean" $(echo "$opts" | sed 's/--mc-batch-size/--mc-batch/') --output py.jsonl > /dev/null
    compare cpp.jsonl py.jsonl "$ck loglik $opts"
  done
  "$PY" -c "
import json, sys
s = json.load(open('summary.json'))
sys.exit(0 if s['block_size'] == 8 and s['requests'] == 4 and s['examples_per_second'] > 0 else 1)" \
    || { echo "FAIL: the summary lacks block_size 8 or examples_per_second"; cat summary.json; exit 1; }
  # The other clean-half rule gives other numbers on the multi-block requests.
  other=$([ "$clean" = causal ] && echo block_causal || echo causal)
  "$PY" "$bref" loglik --model "hf_$ck" --requests-jsonl requests.jsonl --mask-id 127 --block-size 8 --seed 99 \
    --clean "$other" --mc-num 6 --mc-batch 3 --output other.jsonl > /dev/null
  "$PY" -c "
import json, sys
a = [json.loads(l)['loglikelihood'] for l in open('cpp.jsonl')]
b = [json.loads(l)['loglikelihood'] for l in open('other.jsonl')]
sys.exit(0 if abs(a[1] - b[1]) > 1e-3 and abs(a[3] - b[3]) > 1e-3 else 1)" \
    || { echo "FAIL: $ck: the $other reference agrees too: the clean-half rule is not tested"; exit 1; }
done
# The block ELBO: 3 samples of 16 tokens (two blocks each), micro-batches of 2, 2 noise draws.
"$PY" - > text.jsonl <<'P'
import json
for l in range(3):
    print(json.dumps({"text": " ".join(str((l * 37 + i * 11) % 120 + 3) for i in range(20))}))
P
for model in bd:block_causal bdc:causal; do
  ck=${model%%:*} clean=${model##*:}
  "$bin/evaluate_difflm" --load "$ck" --task elbo --text-jsonl text.jsonl --tokenizer-type NullTokenizer \
    --seq-length 16 --micro-batch-size 2 --mc-num 2 --device cpu --seed 7 --summary-json elbo.json \
    > /dev/null 2> eval.err || { cat eval.err; exit 1; }
  # NullTokenizer: EOD = 127 after each line (also the mask id: a clean token like any other here)
  "$PY" "$bref" elbo --model "hf_$ck" --text-jsonl text.jsonl --eod 127 --seq-length 16 --mask-id 127 \
    --block-size 8 --seed 7 --draws 2 --clean "$clean" | tail -1 > elbo_ref.json
  "$PY" - "$ck" <<'P' || { echo "FAIL: $ck: the block ELBO differs from the reference"; cat elbo.json elbo_ref.json; exit 1; }
import json, sys
a, b = json.load(open("elbo.json")), json.load(open("elbo_ref.json"))
worst = max(abs(x - y) for x, y in zip(a["per_draw"] + [a["elbo_per_token"]], b["per_draw"] + [b["elbo_per_token"]]))
print(f"{sys.argv[1]} elbo: {a['elbo_per_token']:.6f}, largest difference {worst:.2e}, {a['examples_per_second']:.0f} samples/s")
if "ar_nll_per_token" in b:  # the causal clean half: its exact autoregressive NLL too
    d = abs(a["ar_nll_per_token"] - b["ar_nll_per_token"])
    print(f"{sys.argv[1]} ar_nll_per_token: {a['ar_nll_per_token']:.6f}, difference {d:.2e}")
    worst = max(worst, d) if a["ar_tokens"] == 3 * 15 else 1.0
elif "ar_nll_per_token" in a:
    worst = 1.0
sys.exit(0 if a["samples"] == b["samples"] == 3 and a["block_size"] == 8 and worst <= 1e-5 else 1)
P
done
# Multiple choice: each choice's log-likelihood is the reference's (requests numbered in order).
cat > mc.jsonl <<'R'
{"context_ids": [5, 17, 33, 2, 90], "choices_ids": [[14, 61, 7], [20, 21, 22, 23, 24, 25, 26, 27, 28]], "gold": 0}
{"context_ids": [1, 2, 3, 4, 5, 6, 7], "choices_ids": [[9], [10, 11], [12, 13, 14]], "gold": 2}
R
"$PY" -c "
import json
for l in open('mc.jsonl'):
    d = json.loads(l)
    for c in d['choices_ids']:
        print(json.dumps({'context_ids': d['context_ids'], 'continuation_ids': c}))" > mc_requests.jsonl
"$bin/evaluate_difflm" --load bd --task multiple-choice --task-jsonl mc.jsonl --mc-num 8 --mc-batch-size 4 --device cpu \
  --seed 3 --output mc_out.jsonl --summary-json mc_summary.json 2> eval.err || { cat eval.err; exit 1; }
"$PY" "$bref" loglik --model hf_bd --requests-jsonl mc_requests.jsonl --mask-id 127 --block-size 8 --seed 3 \
  --mc-num 8 --mc-batch 4 --output mc_py.jsonl > /dev/null
"$PY" - <<'P' || { echo "FAIL: multiple choice differs from the reference"; cat mc_out.jsonl mc_summary.json; exit 1; }
import json, sys
got = [v for l in open("mc_out.jsonl") for v in json.loads(l)["loglikelihoods"]]
want = [json.loads(l)["loglikelihood"] for l in open("mc_py.jsonl")]
s = json.load(open("mc_summary.json"))
docs = [json.loads(l) for l in open("mc_out.jsonl")]
preds = [max(range(len(d["loglikelihoods"])), key=lambda c: d["loglikelihoods"][c]) for d in docs]
acc = sum(p == d["gold"] for p, d in zip(preds, docs)) / len(docs)
worst = max(abs(x - y) for x, y in zip(got, want))
print(f"multiple choice: {len(got)} choices, largest difference {worst:.2e}, acc {s['acc']}, "
      f"{s['examples_per_second']:.0f} documents/s")
sys.exit(0 if len(got) == len(want) == 5 and worst <= 2e-5 and s["acc"] == acc and s["documents"] == 2 else 1)
P
# is_greedy (--check-greedy): true exactly for the continuation the reference's block-by-block
# greedy decoding gives (12 tokens after a 5-token context: answer blocks of 3, 8 and 1 tokens),
# false when its first or its last token is changed.
echo '{"prompt_ids": [5, 17, 33, 2, 90]}' > gp.jsonl
for model in bd:block_causal bdc:causal; do
  ck=${model%%:*} clean=${model##*:}
  "$PY" "$bref" greedy --model "hf_$ck" --prompts-jsonl gp.jsonl --gen-length 12 --mask-id 127 --block-size 8 \
    --clean "$clean" | tail -1 > greedy.json
  "$PY" -c "
import json
g = json.load(open('greedy.json'))['token_ids']
for c in (g, [(g[0] + 1) % 120] + g[1:], g[:-1] + [(g[-1] + 1) % 120]):
    print(json.dumps({'context_ids': [5, 17, 33, 2, 90], 'continuation_ids': c}))" > greedy_requests.jsonl
  "$bin/evaluate_difflm" --load "$ck" --task loglik --requests-jsonl greedy_requests.jsonl --mc-num 4 \
    --mc-batch-size 4 --check-greedy --device cpu --output greedy_out.jsonl 2> eval.err || { cat eval.err; exit 1; }
  [ "$("$PY" -c "import json; print([json.loads(l)['is_greedy'] for l in open('greedy_out.jsonl')])")" = \
    "[True, False, False]" ] || { echo "FAIL: $ck: is_greedy is not the reference's block greedy decoding";
    cat greedy.json greedy_out.jsonl; exit 1; }
  echo "$ck is_greedy: the reference's greedy continuation $(cat greedy.json) reproduced"
done
set +e
"$bin/evaluate_difflm" --load bd --task loglik --requests-jsonl requests.jsonl --mc-num 4 --mc-batch-size 4 \
  --cfg-scale 1.0 --device cpu > bad.out 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "classifier-free guidance is not defined for block-diffusion checkpoints" bad.out \
  || { echo "FAIL: --cfg-scale on a block-diffusion checkpoint was not refused"; cat bad.out; exit 1; }
echo "PASS: block-diffusion ELBO, log-likelihoods and multiple choice equal the NumPy reference"
