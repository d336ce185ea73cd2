#!/usr/bin/env bash
# Adapting an autoregressive model to block diffusion, as docs/finetuning.md tells a user to:
# real English text (the corpus of pretrain_real_text_cpu.sh, GPT-2's tokenizer) -> a tiny
# `--model-running-mode vanilla` model -> `--finetune` from it with the block objective (causal
# clean half + AR loss) and the block-size warm-up `--dlm-block-size-schedule 1:10 4:20` up to
# `--dlm-block-size 16`. Checked: the adapted run's loss falls and ends below the same block run
# from random weights (the AR weights carry over); the checkpoint records the schedule and where
# the weights came from; a resume without the schedule flag continues the checkpoint's schedule
# bitwise; resuming the AR checkpoint under the block objective without --finetune is refused.
# Then the adapted checkpoint is decoded and evaluated (step 6): block ELBO below the random-init
# run's, cached = uncached block decoding, its greedy tokens greedy for the block evaluator, the
# harness's generate_until the same tokens, more than one token a forward with a threshold.
set -euo pipefail
bin=$1; src=$2
source "$src/tests/e2e/lib/licenses_corpus.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
licenses_corpus "$tmp/licenses" GPL-3 GPL-2 LGPL-2.1 LGPL-3 Apache-2.0 MPL-2.0 Artistic GFDL-1.3

# configs/tiny_dlm.args's model shapes on the tokenizer's vocabulary, without its objective.
args=$(grep -v '^#' "$src/configs/tiny_dlm.args" | tr '\n' ' ' \
       | sed -e 's/--mock-data//' -e 's/--vocab-size [0-9]*//' -e 's/--mask-token [0-9]*//' \
             -e 's/--train-iters [0-9]*//' -e 's/--make-vocab-size-divisible-by [0-9]*//' \
             -e 's/--model-running-mode [a-z-]*//' -e 's/--attention-mask-type [a-z_]*//' \
             -e 's/--difflm-varilen-prob [0-9.]*//')
common=(--device cpu --tokenizer-type GPT2BPETokenizer --vocab-file "$enc/encoder.json"
        --merge-file "$enc/vocab.bpe" --data-path "$tmp/licenses_text_document" --split 90,10,0
        --data-cache-path "$tmp/cache" --mask-token 50257 --make-vocab-size-divisible-by 64
        --micro-batch-size 4 --global-batch-size 4 --log-interval 1 --eval-iters 0 --lr 2e-3)
bd=(--model-running-mode difflm-noshift --attention-mask-type block_causal --dlm-block-size 16
    --dlm-bd-clean-attention causal --dlm-ar-loss-weight 1.0 --dlm-diffusion-loss-scale 0.3
    --difflm-varilen-prob 0)
schedule=(--dlm-block-size-schedule 1:10 4:20)
run() {
  local name=$1; shift
  # shellcheck disable=SC2086
  "$bin/pretrain_difflm" $args "${common[@]}" --metrics-jsonl "$tmp/$name.jsonl" "$@" \
    > "$tmp/$name.log" 2>&1 || { cat "$tmp/$name.log"; echo "FAIL: $name exited non-zero"; exit 1; }
}

# 1. The AR model.
run ar --model-running-mode vanilla --train-iters 60 --save "$tmp/ar" --save-interval 60

# 2. Adapted: its weights, the block objective, the warm-up; and the same from random weights.
run adapted "${bd[@]}" "${schedule[@]}" --train-iters 40 --load "$tmp/ar" --finetune \
  --save "$tmp/bd" --save-interval 20
run scratch "${bd[@]}" "${schedule[@]}" --train-iters 40 --save "$tmp/scratch_ckpt" --save-interval 40
grep -q "adapting the checkpoint's weights from vanilla (autoregressive, causal) to difflm-noshift (block diffusion" \
  "$tmp/adapted.log" || { cat "$tmp/adapted.log"; echo "FAIL: no adaptation line"; exit 1; }
for want in "block size 1 from iteration 1" "block size 4 from iteration 11" "block size 16 from iteration 21"; do
  grep -q "block-size schedule: $want" "$tmp/adapted.log" || { echo "FAIL: no '$want'"; exit 1; }
done
python3 - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
rows = lambda n: [json.loads(l)["lm_loss"] for l in open(os.path.join(d, n + ".jsonl")) if '"lm_loss"' in l]
ar, ad, sc = rows("ar"), rows("adapted"), rows("scratch")
assert len(ar) == 60 and len(ad) == 40 and len(sc) == 40, (len(ar), len(ad), len(sc))
mean = lambda v: sum(v) / len(v)
print("AR loss: first 10 %.3f, last 10 %.3f" % (mean(ar[:10]), mean(ar[-10:])))
print("adapted loss: block 1 %.3f, block 4 %.3f, block 16 first/last 10 %.3f/%.3f" %
      (mean(ad[:10]), mean(ad[10:20]), mean(ad[20:30]), mean(ad[30:])))
print("from random weights: block 1 %.3f, block 16 last 10 %.3f" % (mean(sc[:10]), mean(sc[30:])))
assert mean(ar[-10:]) < 0.85 * mean(ar[:10]), "the AR model did not learn"
# The weights carry over: the adapted run starts far below the random start, and stays below.
assert mean(ad[:10]) < 0.85 * mean(sc[:10]), "the AR weights did not carry over"
assert mean(ad[30:]) < mean(sc[30:]), "the adapted model ends above the one trained from scratch"
# At the final block size the loss falls.
assert mean(ad[30:]) < mean(ad[20:30]), "the loss does not fall at the final block size"
PY

# 3. The checkpoint records the schedule and the adaptation.
python3 - "$tmp/bd" <<'PY'
import glob, json, sys
text = "".join(open(p).read() for p in glob.glob(sys.argv[1] + "/iter_0000020/*.json"))
assert '"block_size_schedule"' in text and '"adapted_from": "vanilla (autoregressive, causal)' in text, text[:2000]
PY

# 4. Resume: 20 adapted iterations, then 20 more from the checkpoint without the schedule flag,
#    equal the straight 40 bitwise (iterations 21-40: block 16, taken from the checkpoint).
run resumed "${bd[@]}" --train-iters 40 --load "$tmp/bd" --ckpt-step 20
grep -q "continuing the checkpoint's block-size schedule (block size 16 at iteration 21)" "$tmp/resumed.log" ||
  { cat "$tmp/resumed.log"; echo "FAIL: the schedule was not taken from the checkpoint"; exit 1; }
python3 - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
rows = lambda n: [json.loads(l) for l in open(os.path.join(d, n + ".jsonl")) if '"lm_loss"' in l]
a, b = rows("adapted")[20:], rows("resumed")
assert len(a) == 20 and len(b) == 20, (len(a), len(b))
for x, y in zip(a, b):
    assert x["lm_loss"] == y["lm_loss"] and x["grad_norm"] == y["grad_norm"], (x, y)
print("resume: iterations 21-40 bitwise equal to the straight adapted run")
PY
# ... and a resume with another schedule is refused, naming both.
if "$bin/pretrain_difflm" $args "${common[@]}" "${bd[@]}" --dlm-block-size-schedule 2:10 --train-iters 40 \
     --load "$tmp/bd" --ckpt-step 20 > "$tmp/other.log" 2>&1; then
  echo "FAIL: a resume with another schedule ran"; exit 1
fi
grep -q "another --dlm-block-size-schedule (1:10 4:20; this run 2:10)" "$tmp/other.log" ||
  { cat "$tmp/other.log"; echo "FAIL: wrong message for another schedule"; exit 1; }

# 5. The AR checkpoint under the block objective without --finetune: refused, pointing at it.
if "$bin/pretrain_difflm" $args "${common[@]}" "${bd[@]}" --train-iters 70 --load "$tmp/ar" \
     > "$tmp/noft.log" 2>&1; then
  echo "FAIL: resuming an AR checkpoint as block diffusion ran"; exit 1
fi
grep -q "was trained with another objective: vanilla (autoregressive, causal)" "$tmp/noft.log" &&
  grep -q "add --finetune" "$tmp/noft.log" || { cat "$tmp/noft.log"; echo "FAIL: wrong refusal"; exit 1; }

# 6. Decoding and evaluating the adapted model, as a user would after adapting: the block ELBO
#    (evaluate_difflm) on the corpus is finite and below the same block run from random weights
#    and far below the uniform ln(vocabulary); block decoding (generate_difflm --decode block)
#    gives the same tokens with the exact cache and without it; its greedy continuations are what
#    the block evaluator calls greedy (is_greedy true; a changed last token: false, lower
#    log-likelihood); the harness's generate_until decodes the same tokens; with a confidence
#    threshold more than one token is committed per forward on average (reported).
decode_and_evaluate_adapted() {
  local ckpt=$1 base=$2
  local tk=(--tokenizer-type GPT2BPETokenizer --vocab-file "$enc/encoder.json" --merge-file "$enc/vocab.bpe")
  local m
  for m in "$ckpt" "$base"; do
    "$bin/evaluate_difflm" --load "$m" --task elbo --data-path "$tmp/licenses_text_document" --max-samples 16 \
      --mc-num 2 --device cpu "${tk[@]}" --summary-json "$m.elbo.json" > /dev/null 2> "$tmp/elbo.err" ||
      { cat "$tmp/elbo.err"; echo "FAIL: evaluate_difflm --task elbo on $m"; exit 1; }
  done
  cat > "$tmp/prompts.jsonl" <<'P'
{"prompt": "This License applies to any program or other work which"}
{"prompt": "You may copy and distribute verbatim copies of the"}
{"prompt": "THERE IS NO WARRANTY FOR THE PROGRAM, TO THE EXTENT"}
{"prompt": "the"}
P
  local gen=(--load "$ckpt" --prompts-jsonl "$tmp/prompts.jsonl" --gen-length 32 --batch-size 4 --device cpu "${tk[@]}")
  for kv in exact none; do
    "$bin/generate_difflm" "${gen[@]}" --kv-cache $kv --output "$tmp/gen_$kv.jsonl" 2> "$tmp/gen_$kv.err" ||
      { cat "$tmp/gen_$kv.err"; echo "FAIL: generate_difflm --decode block --kv-cache $kv"; exit 1; }
  done
  grep -q "decode: block, kv cache exact, causal clean stream" "$tmp/gen_exact.err" ||
    { cat "$tmp/gen_exact.err"; echo "FAIL: the adapted checkpoint is not block-decoded with its causal clean stream"; exit 1; }
  "$bin/generate_difflm" "${gen[@]}" --confidence-threshold 0.2 --output "$tmp/gen_fast.jsonl" 2> "$tmp/gen.err" ||
    { cat "$tmp/gen.err"; echo "FAIL: generate_difflm --confidence-threshold"; exit 1; }
  # The greedy continuations as loglik requests (is_greedy), each also with its last token changed,
  # and as harness generate_until requests.
  python3 - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(d, "gen_exact.jsonl"))]
with open(os.path.join(d, "ll.jsonl"), "w") as ll, open(os.path.join(d, "harness.jsonl"), "w") as h:
    for r in rows:
        cont = r["token_ids"]
        other = cont[:-1] + [(cont[-1] + 1) % 50257]
        for c in (cont, other):
            ll.write(json.dumps({"context_ids": r["prompt_ids"], "continuation_ids": c}) + "\n")
        h.write(json.dumps({"request_type": "generate_until",
                            "arguments": [r["prompt"], {"until": [], "max_gen_toks": 32}]}) + "\n")
PY
  "$bin/evaluate_difflm" --load "$ckpt" --task loglik --requests-jsonl "$tmp/ll.jsonl" --check-greedy --mc-num 8 \
    --mc-batch-size 8 --device cpu "${tk[@]}" --output "$tmp/ll_out.jsonl" 2> "$tmp/ll.err" ||
    { cat "$tmp/ll.err"; echo "FAIL: evaluate_difflm --task loglik"; exit 1; }
  "$bin/evaluate_difflm" --load "$ckpt" --task harness --requests-jsonl "$tmp/harness.jsonl" --mc-num 8 \
    --mc-batch-size 8 --device cpu "${tk[@]}" --output "$tmp/harness_out.jsonl" 2> "$tmp/h.err" ||
    { cat "$tmp/h.err"; echo "FAIL: evaluate_difflm --task harness"; exit 1; }
  python3 - "$tmp" "$ckpt.elbo.json" "$base.elbo.json" <<'PY'
import json, math, os, sys
d = sys.argv[1]
ad, sc = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
uniform = math.log(50304)
for k in ("elbo_per_token", "ar_nll_per_token"):
    assert math.isfinite(ad[k]) and math.isfinite(sc[k]), (k, ad, sc)
    assert ad[k] < sc[k] - 0.5, f"adapted {k} {ad[k]:.3f} not below the random-init run's {sc[k]:.3f}"
    assert ad[k] < 0.75 * uniform, f"adapted {k} {ad[k]:.3f} not far below uniform {uniform:.3f}"
assert ad["block_size"] == 16 and ad["tokens"] == 1024, ad
print("ELBO per token: adapted %.3f (its causal clean stream's AR NLL %.3f), from random weights %.3f, "
      "uniform %.3f" % (ad["elbo_per_token"], ad["ar_nll_per_token"], sc["elbo_per_token"], uniform))
load = lambda n: [json.loads(l) for l in open(os.path.join(d, n))]
ex, no, fast = load("gen_exact.jsonl"), load("gen_none.jsonl"), load("gen_fast.jsonl")
assert len(ex) == 4 and all(len(r["token_ids"]) >= 1 for r in ex), ex
assert [r["token_ids"] for r in ex] == [r["token_ids"] for r in no], "exact cache and no cache decode differently"
ll = load("ll_out.jsonl")
assert len(ll) == 8
for i in range(4):
    g, o = ll[2 * i], ll[2 * i + 1]
    assert g["is_greedy"] is True, f"prompt {i}: the block decoder's greedy tokens are not greedy for the evaluator"
    assert o["is_greedy"] is False and o["loglikelihood"] < g["loglikelihood"], (i, g, o)
    assert all(math.isfinite(x["loglikelihood"]) for x in (g, o))
hz = load("harness_out.jsonl")
for r, h in zip(ex, hz):
    assert h["generated_ids"] == r["token_ids"][:32] and h["generated_text"] == r["text"], (r, h)
tokens = sum(len(r["token_ids"]) for r in fast)
forwards = sum(r["steps"] for r in fast)
assert tokens / forwards > 1.0, (tokens, forwards)
print("block decoding: cached = uncached, greedy for the evaluator (is_greedy 4/4, changed last token 0/4), "
      "harness generate_until the same; --confidence-threshold 0.2: %d tokens in %d forwards = %.2f a forward"
      % (tokens, forwards, tokens / forwards))
PY
}
decode_and_evaluate_adapted "$tmp/bd" "$tmp/scratch_ckpt"

echo "PASS: AR -> block diffusion with the block-size warm-up (loss falls, beats random init), recorded, resumed bitwise, misuse refused; decoded and evaluated"
