#!/usr/bin/env bash
# A user's first check that generation works: the tiny diffusion LM trained on the CPU to
# memorise four sentences (pretrain_difflm on a real .bin/.idx made by preprocess_data) completes
# each sentence's first half exactly with generate_difflm, in one left-padded batch and with
# semi-autoregressive blocks, and evaluate_difflm's multiple-choice task picks the true
# continuation of every sentence over two corrupted ones (acc 1.0). The fast options (threshold,
# key/value cache) are scored on the same sentences: the accuracy change they cost, stated.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
source "$src/tests/e2e/lib/python_numpy.sh"
# Four "sentences" of token ids (NullTokenizer: text is whitespace-separated ids), each a
# document of exactly --seq-length 16 tokens starting with 1: a GPT sample is then one sentence
# and the next one's leading 1.
# NullTokenizer over 128 ids: 127 is its end-of-document id, so the mask token is 126 (D-4).
"$PY" - <<'P'
import json, random
random.seed(3)
with open("sentences.jsonl", "w") as f, open("prompts.jsonl", "w") as p, open("mc.jsonl", "w") as m:
    for s in range(4):
        toks = [1] + [random.randrange(2, 120) for _ in range(15)]
        f.write(json.dumps({"text": " ".join(map(str, toks))}) + "\n")
        p.write(json.dumps({"prompt": " ".join(map(str, toks[1:8])), "expect": toks[8:16]}) + "\n")
        wrong1 = toks[8:16][::-1]
        wrong2 = toks[8:12] + [(t + 7) % 118 + 2 for t in toks[12:16]]
        m.write(json.dumps({"context": " ".join(map(str, toks[1:8])),
                            "choices": [" ".join(map(str, c)) for c in (wrong1, toks[8:16], wrong2)], "gold": 1}) + "\n")
P
"$bin/preprocess_data" --input sentences.jsonl --output-prefix mem --tokenizer-type NullTokenizer \
  --vocab-size 128 --workers 1 > pre.log 2>&1 || { cat pre.log; exit 1; }
args=$(grep -v '^#' "$src/configs/tiny_dlm.args" | tr '\n' ' ' | sed -e 's/--mock-data//' \
  -e 's/--train-iters [0-9]*//' -e 's/--seq-length [0-9]*//' -e 's/--max-position-embeddings [0-9]*//' \
  -e 's/--lr [0-9e.-]*//' -e 's/--min-lr [0-9e.-]*//' -e 's/--micro-batch-size [0-9]*//' -e 's/--global-batch-size [0-9]*//')
# shellcheck disable=SC2086
"$bin/pretrain_difflm" $args --device cpu --tokenizer-type NullTokenizer --mask-token 126 \
  --data-path mem_text_document --split 100,0,0 --seq-length 16 --max-position-embeddings 16 \
  --train-iters 1200 --lr 5e-3 --min-lr 5e-4 --micro-batch-size 16 --global-batch-size 16 \
  --difflm-varilen-prob 0 --eval-iters 0 --log-interval 100 --save ckpt --save-interval 1200 > train.log 2>&1 \
  || { cat train.log; exit 1; }
grep -o "iteration *1200/ *1200.*lm loss: [^|]*" train.log | grep -o "lm loss: .*"
check() {  # check FILE: every completion is the sentence's second half
  "$PY" - "$1" <<'P'
import json, sys
want = [json.loads(l)["expect"] for l in open("prompts.jsonl")]
got = [json.loads(l)["token_ids"] for l in open(sys.argv[1])]
bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w]
for i, g, w in bad:
    print(f"  sentence {i}: generated {g}, memorised {w}")
sys.exit(1 if bad or len(got) != len(want) else 0)
P
}
"$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 8 --steps 8 --block-length 8 \
  --batch-size 4 --device cpu --output full.jsonl 2> gen.err || { cat gen.err; exit 1; }
check full.jsonl || { echo "FAIL: the memorised sentences were not completed (one block)"; exit 1; }
"$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 8 --steps 8 --block-length 4 \
  --batch-size 3 --device cpu --output blocks.jsonl 2> gen.err || { cat gen.err; exit 1; }
check blocks.jsonl || { echo "FAIL: the memorised sentences were not completed (two blocks)"; exit 1; }
grep -q '"text":"' full.jsonl || { echo "FAIL: no decoded text"; exit 1; }
# The fast options (docs/generation.md) on the same task: the memorised completions are the
# accuracy they keep. Stated, not all required: the threshold and the cache must still complete
# at least 3 of the 4 sentences (the exact sampler: 4), and the line says how many.
score() {  # score FILE: how many completions are the memorised second half
  "$PY" -c "
import json, sys
want = [json.loads(l)['expect'] for l in open('prompts.jsonl')]
got = [json.loads(l)['token_ids'] for l in open(sys.argv[1])]
print(sum(g == w for g, w in zip(got, want)))" "$1"
}
fast_line="fast options, sentences completed of 4 (exact: 4):"
for opts in "--confidence-threshold 0.9" "--kv-cache dual" "--kv-cache prefix" "--kv-cache dual --confidence-threshold 0.9"; do
  # shellcheck disable=SC2086
  "$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 8 --steps 8 --block-length 4 \
    --batch-size 4 --device cpu $opts --output fast.jsonl 2> gen.err || { cat gen.err; exit 1; }
  n=$(score fast.jsonl)
  steps=$("$PY" -c "import json; r=[json.loads(l)['steps'] for l in open('fast.jsonl')]; print(sum(r) / len(r))")
  fast_line="$fast_line $opts: $n ($steps steps per prompt);"
  [ "$n" -ge 3 ] || { echo "FAIL: $opts completed only $n of 4 memorised sentences"; exit 1; }
done
echo "$fast_line"
"$bin/evaluate_difflm" --load ckpt --task multiple-choice --task-jsonl mc.jsonl --mc-num 32 --mc-batch-size 16 \
  --device cpu --output mc_out.jsonl --summary-json mc_summary.json 2> eval.err || { cat eval.err; exit 1; }
"$PY" -c "
import json, sys
s = json.load(open('mc_summary.json'))
print('multiple choice:', s)
sys.exit(0 if s['acc'] == 1.0 and s['documents'] == 4 else 1)" || { echo "FAIL: multiple-choice accuracy below 1"; cat mc_out.jsonl; exit 1; }
echo "PASS: four memorised sentences completed exactly; multiple-choice acc 1.0"
