#!/usr/bin/env bash
# generate_difflm against an independent NumPy implementation of LLaDA's generate
# (tests/golden/llada_reference.py, written from LLaDA's algorithm, float64 forward of the
# exported Hugging Face folder): the same tokens for low_confidence and random remasking,
# several block lengths, guidance on and off, temperature 0 and > 0. megadlm runs the prompts
# as one left-padded batch, the reference runs each alone: padded batches equal single runs.
# Also: stopping at EOS gives the reference's prefix, --hf-dir loads the same model, bad
# arguments are reported by flag.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
source "$src/tests/e2e/lib/python_numpy.sh"
# A tiny Qwen3-style model with spread-out logits (init std 0.3), two steps of training.
tiny_checkpoint ckpt
export_hf ckpt hf
cat > prompts.jsonl <<'P'
{"prompt_ids": [5, 17, 33, 2, 90, 14, 61]}
{"prompt_ids": [100, 3]}
{"prompt_ids": [44, 45, 46, 47]}
{"prompt_ids": [9]}
P
compare() {  # compare.py A B [EOS]: token lists equal (B cut after its first EOS when given)
  "$PY" - "$@" <<'PYEOF'
import json, sys
a = [json.loads(l)["token_ids"] for l in open(sys.argv[1])]
b = [json.loads(l)["token_ids"] for l in open(sys.argv[2])]
if len(sys.argv) > 3:
    eos = int(sys.argv[3])
    b = [t[:t.index(eos) + 1] if eos in t else t for t in b]
bad = [i for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or a[i] != b[i]]
for i in bad:
    print(f"  prompt {i}: megadlm {a[i] if i < len(a) else None}\n            reference {b[i] if i < len(b) else None}")
sys.exit(1 if bad else 0)
PYEOF
}
n=0
while read -r opts; do
  [ -z "$opts" ] && continue
  n=$((n + 1))
  "$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 16 $opts --batch-size 4 \
    --device cpu --seed 77 --output cpp.jsonl 2> gen.err || { cat gen.err; exit 1; }
  "$PY" "$ref" generate --model hf --prompts-jsonl prompts.jsonl --gen-length 16 $opts --mask-id 127 \
    --seed 77 --output py.jsonl > /dev/null
  compare cpp.jsonl py.jsonl || { echo "FAIL: megadlm and the reference differ with $opts"; exit 1; }
  echo "same tokens: $opts"
done <<'CASES'
--steps 16 --block-length 16 --remasking low_confidence
--steps 8 --block-length 4 --remasking low_confidence
--steps 16 --block-length 2 --remasking low_confidence
--steps 8 --block-length 8 --remasking random
--steps 12 --block-length 4 --remasking random
--steps 16 --block-length 8 --remasking low_confidence --cfg-scale 1.5
--steps 8 --block-length 4 --remasking random --cfg-scale 0.5
--steps 12 --block-length 4 --remasking low_confidence --temperature 0.7
--steps 4 --block-length 8 --remasking random --temperature 1.0 --cfg-scale 0.5
--steps 16 --block-length 4 --remasking low_confidence --temperature 0.5 --cfg-scale 2.0
CASES

# EOS: a token the reference generates early in prompt 0 becomes the EOS id.
"$PY" "$ref" generate --model hf --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 --block-length 4 \
  --mask-id 127 --output full.jsonl > /dev/null
eos=$("$PY" -c "import json; print(json.loads(open('full.jsonl').readline())['token_ids'][2])")
"$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 --block-length 4 \
  --batch-size 4 --device cpu --eos-token-id "$eos" --output stop.jsonl 2> gen.err || { cat gen.err; exit 1; }
compare stop.jsonl full.jsonl "$eos" || { echo "FAIL: stopping at EOS $eos is not the reference's prefix"; exit 1; }
grep -q '"stopped_at_eos":true' stop.jsonl || { echo "FAIL: no row stopped at EOS $eos"; exit 1; }
first_steps=$("$PY" -c "import json; print(json.loads(open('stop.jsonl').readline())['steps'])")
[ "$first_steps" -lt 8 ] || { echo "FAIL: prompt 0 stopped at EOS yet used all $first_steps steps"; exit 1; }
echo "stopping at EOS $eos: the reference's prefix, prompt 0 in $first_steps of 8 steps"
"$PY" "$ref" generate --model hf --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 --block-length 4 \
  --mask-id 127 --eos-id "$eos" --logits-eos-inf --output noeos_ref.jsonl > /dev/null
"$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 --block-length 4 \
  --batch-size 2 --device cpu --eos-token-id "$eos" --logits-eos-inf --no-stop-at-eos --output noeos.jsonl 2> gen.err
compare noeos.jsonl noeos_ref.jsonl || { echo "FAIL: --logits-eos-inf differs from the reference"; exit 1; }
if grep -q "[^0-9]$eos[],]" <("$PY" -c "import json; [print(json.loads(l)['token_ids']) for l in open('noeos.jsonl')]"); then
  echo "FAIL: --logits-eos-inf proposed EOS $eos"; exit 1
fi

# The Hugging Face folder gives the same completions as the checkpoint.
"$bin/generate_difflm" --hf-dir hf --mask-token 127 --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 \
  --block-length 4 --device cpu --output hfrun.jsonl 2> gen.err || { cat gen.err; exit 1; }
"$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 16 --steps 8 \
  --block-length 4 --device cpu --output ckrun.jsonl 2> gen.err
compare hfrun.jsonl ckrun.jsonl || { echo "FAIL: --hf-dir and --load differ"; exit 1; }

# Bad arguments: every problem, by flag, exit code 2.
set +e
"$bin/generate_difflm" --load ckpt --prompt-ids 1 --gen-length 10 --block-length 4 --device cpu > bad.out 2>&1
rc1=$?
"$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --gen-length 16 --block-length 4 --steps 6 \
  --batch-size 0 --device cpu > bad2.out 2>&1
rc2=$?
# A value outside the table's choices is a command-line error, reported before the sampler's checks.
"$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl --remasking lowest --device cpu > bad3.out 2>&1
rc3=$?
set -e
[ $rc1 -eq 2 ] && grep -q "unknown flag \`--prompt-ids\`" bad.out || { echo "FAIL: unknown flag"; cat bad.out; exit 1; }
[ $rc2 -eq 2 ] && grep -q "\`--steps 6\` is not a multiple of the number of blocks 4" bad2.out \
  && grep -q "\`--batch-size\` must be >= 1" bad2.out || { echo "FAIL: bad flags"; cat bad2.out; exit 1; }
[ $rc3 -eq 2 ] && grep -q "\`--remasking lowest\`: invalid value; valid: low_confidence, random" bad3.out ||
  { echo "FAIL: bad --remasking"; cat bad3.out; exit 1; }
echo "PASS: $n sampler configurations equal the NumPy reference; EOS stopping, --hf-dir and errors"
