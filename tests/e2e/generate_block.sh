#!/usr/bin/env bash
# Block decoding of block-diffusion checkpoints (generate_difflm --decode block|ar) against an
# independent NumPy implementation of the decoding rule (tests/golden/block_reference.py: float64,
# no cache, one prompt at a time, written from the rule, not from the C++): the same tokens and the
# same number of decoding forwards per prompt, static schedule and confidence threshold, low
# confidence and random remasking, temperature 0 and > 0, both clean-half variants (block-causal,
# and causal with the next-token loss, which also decodes autoregressively). megadlm runs the
# ragged prompts as one batch (block-aligned left padding), the reference each alone. Every case
# runs with the exact cache and with --kv-cache none (training's doubled forward, recomputed each
# step): the same tokens. Then a block-diffusion model that memorised four sentences completes
# them, with a threshold at more than one token per forward (reported); EOS stopping; bad arguments are refused by flag.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
source "$src/tests/e2e/lib/python_numpy.sh"
source "$src/tests/e2e/lib/expect.sh"
bref="$src/tests/golden/block_reference.py"
bd=(--attention-mask-type block_causal --dlm-block-size 4)
tiny_checkpoint ckpt "${bd[@]}"
export_hf ckpt hf
tiny_checkpoint ckc "${bd[@]}" --dlm-bd-clean-attention causal --dlm-ar-loss-weight 1.0
export_hf ckc hfc
grep -rq '"block_size": *4' ckpt || { echo "FAIL: the checkpoint does not record its block size"; exit 1; }
# Prompt lengths 7, 2, 4, 1 and 9: every remainder mod 4, a prompt that ends on a block boundary.
cat > prompts.jsonl <<'P'
{"prompt_ids": [5, 17, 33, 2, 90, 14, 61]}
{"prompt_ids": [100, 3]}
{"prompt_ids": [44, 45, 46, 47]}
{"prompt_ids": [9]}
{"prompt_ids": [8, 1, 12, 120, 66, 19, 7, 50, 31]}
P
compare() {  # A B: token lists and decoding forwards per prompt equal
  "$PY" - "$@" <<'PYEOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
bad = [i for i in range(max(len(a), len(b)))
       if i >= len(a) or i >= len(b) or a[i]["token_ids"] != b[i]["token_ids"] or a[i]["steps"] != b[i]["steps"]]
for i in bad:
    print(f"  prompt {i}: {a[i] if i < len(a) else None}\n            {b[i] if i < len(b) else None}")
sys.exit(1 if bad else 0)
PYEOF
}
n=0
while IFS='|' read -r model hf copts ropts; do
  [ -z "$model" ] && continue
  n=$((n + 1))
  "$PY" "$bref" generate --model "$hf" --prompts-jsonl prompts.jsonl --gen-length 16 --mask-id 127 --seed 77 \
    $ropts --output py.jsonl
  for kv in exact none; do
    "$bin/generate_difflm" --load "$model" --prompts-jsonl prompts.jsonl --gen-length 16 --batch-size 5 \
      --device cpu --seed 77 --no-stop-at-eos --kv-cache $kv $copts --output "cpp_$kv.jsonl" 2> gen.err ||
      { cat gen.err; exit 1; }
    compare "cpp_$kv.jsonl" py.jsonl || { echo "FAIL: --kv-cache $kv $copts differs from the reference"; exit 1; }
  done
  echo "same tokens and forwards as the reference, cached and uncached: $copts"
done <<'CASES'
ckpt|hf|--steps 8|--steps 8 --block-length 4
ckpt|hf|--steps 16|--steps 16 --block-length 4
ckpt|hf|--steps 4 --remasking random|--steps 4 --block-length 4 --remasking random
ckpt|hf|--steps 16 --temperature 0.7|--steps 16 --block-length 4 --temperature 0.7
ckpt|hf|--confidence-threshold 0.3|--steps 16 --block-length 4 --confidence-threshold 0.3
ckpt|hf|--confidence-threshold 0.2 --temperature 0.5 --block-length 8|--steps 16 --block-length 8 --confidence-threshold 0.2 --temperature 0.5
ckc|hfc|--steps 8|--steps 8 --block-length 4 --causal
ckc|hfc|--confidence-threshold 0.3|--steps 16 --block-length 4 --causal --confidence-threshold 0.3
ckc|hfc|--decode ar|--ar
ckc|hfc|--decode ar --temperature 0.8|--ar --temperature 0.8
CASES
# One prompt alone gives what it gives in the batch (batch 1 vs 5 above).
"$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 --batch-size 1 \
  --device cpu --seed 77 --no-stop-at-eos --output single.jsonl 2> gen.err || { cat gen.err; exit 1; }
"$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 --batch-size 5 \
  --device cpu --seed 77 --no-stop-at-eos --output batched.jsonl 2> gen.err
compare single.jsonl batched.jsonl || { echo "FAIL: batch 1 and batch 5 differ"; exit 1; }

# `--decode full` on a block-diffusion checkpoint: LLaDA's full-sequence sampler, bidirectional over
# the canvas, equal to llada_reference.py on the exported folder.
"$bin/generate_difflm" --load ckpt --decode full --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 \
  --block-length 4 --batch-size 5 --device cpu --no-stop-at-eos --output fullseq.jsonl 2> gen.err || { cat gen.err; exit 1; }
"$PY" "$ref" generate --model hf --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 --block-length 4 \
  --mask-id 127 --output fullseq_ref.jsonl > /dev/null
"$PY" - <<'PYEOF' || { echo "FAIL: --decode full on a block-diffusion checkpoint differs from llada_reference.py"; exit 1; }
import json
a = [json.loads(l)["token_ids"] for l in open("fullseq.jsonl")]
b = [json.loads(l)["token_ids"] for l in open("fullseq_ref.jsonl")]
assert a == b, (a, b)
PYEOF
echo "--decode full on the block-diffusion checkpoint: llada_reference.py's tokens"

# EOS: a token the reference generates in prompt 0's second decoded block becomes the EOS id.
"$PY" "$bref" generate --model hf --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 --block-length 4 \
  --mask-id 127 --output full.jsonl
eos=$("$PY" -c "import json; print(json.loads(open('full.jsonl').readline())['token_ids'][3])")
"$PY" "$bref" generate --model hf --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 --block-length 4 \
  --mask-id 127 --eos-id "$eos" --output stop_ref.jsonl
"$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 --batch-size 5 \
  --device cpu --eos-token-id "$eos" --output stop.jsonl 2> gen.err || { cat gen.err; exit 1; }
compare stop.jsonl stop_ref.jsonl || { echo "FAIL: stopping at EOS $eos differs from the reference"; exit 1; }
grep -q '"stopped_at_eos":true' stop.jsonl || { echo "FAIL: no row stopped at EOS $eos"; exit 1; }
echo "stopping at EOS $eos: the reference's tokens"

# A block-diffusion model (blocks of 4) trained on the CPU to memorise four sentences (as
# generate_memorized.sh does for the full-sequence model) completes each from its first 5 tokens,
# and with a threshold commits more than one token per decoding forward.
"$PY" - <<'PYEOF'
import json, random
random.seed(3)
with open("sentences.jsonl", "w") as f, open("mprompts.jsonl", "w") as p:
    for s in range(4):
        toks = [1] + [random.randrange(2, 120) for _ in range(15)]
        f.write(json.dumps({"text": " ".join(map(str, toks))}) + "\n")
        p.write(json.dumps({"prompt": " ".join(map(str, toks[1:6])), "expect": toks[6:14]}) + "\n")
PYEOF
"$bin/preprocess_data" --input sentences.jsonl --output-prefix mem --tokenizer-type NullTokenizer \
  --vocab-size 128 --workers 1 > pre.log 2>&1 || { cat pre.log; exit 1; }
args=$(grep -v '^#' "$src/configs/tiny_dlm.args" | tr '\n' ' ' | sed -e 's/--mock-data//' \
  -e 's/--train-iters [0-9]*//' -e 's/--seq-length [0-9]*//' -e 's/--max-position-embeddings [0-9]*//' \
  -e 's/--lr [0-9e.-]*//' -e 's/--min-lr [0-9e.-]*//' -e 's/--micro-batch-size [0-9]*//' \
  -e 's/--global-batch-size [0-9]*//' -e 's/--attention-mask-type [a-z_]*//')
# shellcheck disable=SC2086
"$bin/pretrain_difflm" $args "${bd[@]}" --device cpu --tokenizer-type NullTokenizer --mask-token 126 \
  --data-path mem_text_document --split 100,0,0 --seq-length 16 --max-position-embeddings 16 \
  --train-iters 600 --lr 5e-3 --min-lr 5e-4 --micro-batch-size 16 --global-batch-size 16 \
  --difflm-varilen-prob 0 --eval-iters 0 --log-interval 100 --save mem_ckpt --save-interval 600 > train_mem.log 2>&1 \
  || { cat train_mem.log; exit 1; }
for mode in "--confidence-threshold 0.9" "--steps 8"; do
  "$bin/generate_difflm" --load mem_ckpt --prompts-jsonl mprompts.jsonl --gen-length 8 --batch-size 4 --device cpu \
    --no-stop-at-eos $mode --output mem.jsonl 2> mem.err || { cat mem.err; exit 1; }
  grep "tokens per forward" mem.err
  "$PY" - "$mode" <<'PYEOF'
import json, sys
want = [json.loads(l)["expect"] for l in open("mprompts.jsonl")]
got = [json.loads(l) for l in open("mem.jsonl")]
bad = [(i, g["token_ids"], w) for i, (g, w) in enumerate(zip(got, want)) if g["token_ids"] != w]
assert not bad and len(got) == 4, f"{sys.argv[1]}: not the memorised sentences: {bad}"
tpf = sum(len(g["token_ids"]) for g in got) / sum(g["steps"] for g in got)
if "threshold" in sys.argv[1]:
    assert tpf > 1.0, f"threshold 0.9 committed {tpf} tokens per forward"
else:
    assert abs(tpf - 1.0) < 1e-12, tpf  # 8 steps for 8 tokens: one a forward
print(f"{sys.argv[1]}: the 4 memorised sentences, {tpf:.3f} tokens per decoding forward")
PYEOF
done

# Bad arguments: by flag, exit code 2, before any generation.
refuse() { refuses "$1" "$bin/generate_difflm" --prompts-jsonl prompts.jsonl --device cpu "${@:2}"; }
refuse "\`--gen-length 10\` is not a multiple of \`--block-length 4\`" --load ckpt --gen-length 10
refuse "\`--decode ar\` needs a model whose clean stream is causal" --load ckpt --decode ar --gen-length 8
refuse "is the full-sequence sampler's approximate cache" --load ckpt --kv-cache dual --gen-length 8
refuse "\`--kv-cache exact\` is block decoding's cache" --load ckpt --decode full --kv-cache exact --gen-length 8
refuse "\`--decode nope\`: invalid value; valid: block, ar, full" --load ckpt --decode nope
refuse "\`--cfg-scale\` is for the full-sequence sampler" --load ckpt --cfg-scale 1 --gen-length 8
refuse "\`--cuda-graphs\` captures CUDA work; the model runs on the CPU" --load ckpt --cuda-graphs --gen-length 8
tiny_checkpoint full_model
refuse "needs a block-diffusion checkpoint" --load full_model --decode block --gen-length 8
echo "PASS: $n block decoding configurations equal the NumPy reference (cached and uncached, batched and ragged); batch invariance, EOS, tokens per forward, errors"
