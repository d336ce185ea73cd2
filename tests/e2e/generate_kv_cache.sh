#!/usr/bin/env bash
# The approximate key/value cache of Fast-dLLM (--kv-cache prefix|dual, docs/generation.md)
# against an independent NumPy implementation (tests/golden/llada_reference.py --kv-cache: the
# float64 forward of the exported Hugging Face folder keeping each layer's keys and values):
# the same tokens for both cache modes, low_confidence and random remasking, several block
# lengths, guidance on and off, one left-padded batch against each prompt alone. On a one-layer
# model the cache is exact (a layer's keys and values depend only on its own tokens, which do
# not change outside the recomputed columns within a block), so there megadlm's cached run must
# equal its exact sampler; on two layers the approximation shows, and how often it changes the
# result is printed.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
source "$src/tests/e2e/lib/python_numpy.sh"
tiny_checkpoint ckpt1 --num-layers 1
tiny_checkpoint ckpt2 --num-layers 2
export_hf ckpt2 hf2
cat > prompts.jsonl <<'P'
{"prompt_ids": [5, 17, 33, 2, 90, 14, 61]}
{"prompt_ids": [100, 3]}
{"prompt_ids": [44, 45, 46, 47]}
P
differ() {  # differ A B: the number of prompts whose tokens differ
  "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
a = [json.loads(l)["token_ids"] for l in open(sys.argv[1])]
b = [json.loads(l)["token_ids"] for l in open(sys.argv[2])]
assert len(a) == len(b), (len(a), len(b))
bad = [i for i in range(len(a)) if a[i] != b[i]]
for i in bad:
    print(f"  prompt {i}: {a[i]}\n        vs {b[i]}", file=sys.stderr)
print(len(bad))
PYEOF
}
n=0
while read -r opts; do
  [ -z "$opts" ] && continue
  n=$((n + 1))
  "$bin/generate_difflm" --load ckpt2 --prompts-jsonl prompts.jsonl --gen-length 16 $opts --batch-size 3 \
    --device cpu --seed 5 --output cpp.jsonl 2> gen.err || { cat gen.err; exit 1; }
  "$PY" "$ref" generate --model hf2 --prompts-jsonl prompts.jsonl --gen-length 16 $opts --mask-id 127 --seed 5 \
    --output py.jsonl > /dev/null
  [ "$(differ cpp.jsonl py.jsonl)" = 0 ] || { echo "FAIL: megadlm and the NumPy cache differ with $opts"; exit 1; }
  "$bin/generate_difflm" --load ckpt2 --prompts-jsonl prompts.jsonl --gen-length 16 \
    $(sed 's/--kv-cache [a-z]*//' <<< "$opts") --batch-size 3 --device cpu --seed 5 --output exact.jsonl 2> gen.err
  echo "same tokens as the NumPy cache: $opts (vs the exact sampler: $(differ cpp.jsonl exact.jsonl 2>/dev/null)/3 prompts changed)"
done <<'CASES'
--kv-cache dual --steps 16 --block-length 4 --remasking low_confidence
--kv-cache prefix --steps 16 --block-length 4 --remasking low_confidence
--kv-cache dual --steps 8 --block-length 8 --remasking random
--kv-cache prefix --steps 8 --block-length 2 --remasking low_confidence --cfg-scale 1.5
--kv-cache dual --steps 16 --block-length 8 --remasking low_confidence --cfg-scale 0.5 --temperature 0.7
CASES

# One layer: the cache is exact, so megadlm's cached runs equal its exact sampler.
for opts in "--steps 16 --block-length 4" "--steps 8 --block-length 8 --cfg-scale 1.0" "--steps 16 --block-length 2 --remasking random"; do
  # shellcheck disable=SC2086
  "$bin/generate_difflm" --load ckpt1 --prompts-jsonl prompts.jsonl --gen-length 16 $opts --batch-size 3 \
    --device cpu --output exact1.jsonl 2> gen.err || { cat gen.err; exit 1; }
  for mode in dual prefix; do
    # shellcheck disable=SC2086
    "$bin/generate_difflm" --load ckpt1 --prompts-jsonl prompts.jsonl --gen-length 16 $opts --batch-size 3 \
      --device cpu --kv-cache $mode --output cached1.jsonl 2> gen.err || { cat gen.err; exit 1; }
    [ "$(differ cached1.jsonl exact1.jsonl)" = 0 ] || { echo "FAIL: one layer, --kv-cache $mode $opts is not exact"; exit 1; }
  done
done
# The cache and the threshold together (Fast-dLLM's fastest setting) run, and use fewer steps.
"$bin/generate_difflm" --load ckpt2 --prompts-jsonl prompts.jsonl --gen-length 16 --steps 16 --block-length 4 \
  --batch-size 3 --device cpu --kv-cache dual --confidence-threshold 0.05 --output both.jsonl 2> both.err \
  || { cat both.err; exit 1; }
grep -q "kv cache dual" both.err || { echo "FAIL: the sampler line does not name the cache"; cat both.err; exit 1; }
steps=$("$PY" -c "import json; print(min(json.loads(l)['steps'] for l in open('both.jsonl')))")
[ "$steps" -lt 16 ] || { echo "FAIL: with the threshold every prompt still took 16 steps"; exit 1; }
echo "cache + threshold: the fastest prompt took $steps of 16 steps"
set +e
"$bin/generate_difflm" --load ckpt2 --prompts-jsonl prompts.jsonl --kv-cache full --device cpu > bad.out 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "\`--kv-cache full\`: valid: none, prefix, dual" bad.out || { echo "FAIL: bad --kv-cache"; cat bad.out; exit 1; }
echo "PASS: $n cached configurations equal the NumPy cache; one layer: the cache is exact; errors by flag"
