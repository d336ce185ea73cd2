#!/usr/bin/env bash
# generate_difflm on inputs a user gets wrong, or that the model makes awkward:
#   - prompt + --gen-length longer than the model's positions: refused, the limit named
#   - an absurd --gen-length (100000000): refused before anything runs
#   - a prompt holding the mask token id: refused up front, naming the prompt and position
#   - byte-level BPE output that is not UTF-8 (a cut multi-byte character): every row written,
#     the text with U+FFFD where bytes form no character, the token ids exact
#   - --batch-invariant: logged, and the same CPU tokens in a batch of 3 as each prompt alone
# The model: configs/tiny_dlm.args (64 positions, RoPE, vocabulary 128, mask 127), two steps.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
source "$src/tests/e2e/lib/python_numpy.sh"
tiny_checkpoint ckpt

# refused NAME TEXT... -- ARGS: `generate_difflm --load ckpt --device cpu ARGS` exits 2, its
# stderr says every TEXT, nothing was sampled and no row was written.
refused() {
  local name=$1
  shift
  local expect=()
  while [ "$1" != "--" ]; do expect+=("$1"); shift; done
  shift
  set +e
  "$bin/generate_difflm" --load ckpt --device cpu --output "$name.jsonl" "$@" > "$name.out" 2> "$name.err"
  local rc=$?
  set -e
  [ $rc -eq 2 ] || { echo "FAIL: $name: exit $rc, not 2 (refused)"; cat "$name.err"; exit 1; }
  for e in "${expect[@]}"; do
    grep -qF -- "$e" "$name.err" || { echo "FAIL: $name: the error does not say: $e"; cat "$name.err"; exit 1; }
  done
  if grep -q "sampler:" "$name.err"; then echo "FAIL: $name: refused only once sampling had started"; cat "$name.err"; exit 1; fi
  [ ! -s "$name.jsonl" ] || { echo "FAIL: $name: rows written although refused"; exit 1; }
  echo "refused ($name): $(grep -F -- "${expect[0]}" "$name.err" | head -1 | sed 's/^ *//')"
}

"$PY" - <<'P'
import json
with open("p13.jsonl", "w") as f:  # 13 tokens
    f.write(json.dumps({"prompt_ids": list(range(1, 14))}) + "\n")
with open("p56.jsonl", "w") as f:  # 2 and 56 tokens
    f.write(json.dumps({"prompt_ids": [4, 5]}) + "\n")
    f.write(json.dumps({"prompt_ids": list(range(2, 58))}) + "\n")
with open("pmask.jsonl", "w") as f:  # the mask id 127 at position 2 of prompt 1
    f.write(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")
    f.write(json.dumps({"prompt_ids": [5, 9, 127, 10]}) + "\n")
P
# 13 + 64 = 77 and 56 + 32 = 88 positions on a 64-position model (the longest prompt named).
refused positions77 "prompt 0 (13 tokens) plus \`--gen-length 64\` needs 77 positions" \
  "the model has 64 (its --max-position-embeddings)" "\`--gen-length\` at most 51 with this prompt" -- \
  --prompts-jsonl p13.jsonl --gen-length 64 --steps 64
refused positions88 "prompt 1 (56 tokens) plus \`--gen-length 32\` needs 88 positions" \
  "\`--gen-length\` at most 8 with this prompt, or prompts of at most 32 tokens" -- \
  --prompts-jsonl p56.jsonl --gen-length 32 --steps 32 --block-length 8
# The generation alone is longer than the model (56 + 192 = 248; 100000000).
refused positions248 "\`--gen-length 192\` is more than the model's 64 positions" -- \
  --prompts-jsonl p56.jsonl --gen-length 192 --steps 192 --block-length 64
refused gen_length "\`--gen-length 100000000\` is more than the model's 64 positions" -- \
  --prompts-jsonl p13.jsonl --gen-length 100000000 --steps 100000000
# The mask id in a prompt (the sampler would fill it and leave a generated position masked).
refused mask_in_prompt "prompt 1 holds the mask token 127 at position 2" -- \
  --prompts-jsonl pmask.jsonl --gen-length 8 --steps 8
# Within the limit: 13 + 48 = 61 positions run.
"$bin/generate_difflm" --load ckpt --device cpu --prompts-jsonl p13.jsonl --gen-length 48 --steps 48 \
  --block-length 16 --output fits.jsonl 2> fits.err || { cat fits.err; echo "FAIL: 61 positions refused"; exit 1; }
[ "$(wc -l < fits.jsonl)" -eq 1 ] || { echo "FAIL: no row for 61 positions"; exit 1; }

# A byte-level BPE tokenizer.json whose 128 tokens are the single bytes 0x80-0xFF
# (continuation and lead bytes): generated text is mostly not UTF-8.
byte_tokenizer tokenizer.json 0x80
"$PY" - <<'P'
import json
with open("p4.jsonl", "w") as f:
    for p in ([5, 17, 33], [100, 3], [44, 45, 46, 47], [9]):
        f.write(json.dumps({"prompt_ids": p}) + "\n")
P
check_utf8_rows() {  # FILE: 4 rows in order, text = the lossy UTF-8 of the ids' bytes, some U+FFFD
  "$PY" - "$1" <<'P'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
assert [r["index"] for r in rows] == [0, 1, 2, 3], [r["index"] for r in rows]
for r in rows:
    want = bytes(0x80 + t for t in r["token_ids"]).decode("utf-8", errors="replace")
    assert r["text"] == want, (r["token_ids"], r["text"], want)
    assert len(r["token_ids"]) == 8 and all(0 <= t < 128 for t in r["token_ids"]), r["token_ids"]
assert any("\ufffd" in r["text"] for r in rows), "no row needed a replacement character"
print(sum(r["text"].count("\ufffd") for r in rows), "replacement characters in", len(rows), "rows")
P
}
for bs in 1 3; do
  "$bin/generate_difflm" --load ckpt --device cpu --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model tokenizer.json --prompts-jsonl p4.jsonl --gen-length 8 --steps 8 --batch-size $bs \
    --output utf8_$bs.jsonl 2> utf8.err || { cat utf8.err; echo "FAIL: output that is not UTF-8 stopped the run (batch $bs)"; exit 1; }
  check_utf8_rows utf8_$bs.jsonl || { echo "FAIL: rows of batch size $bs"; exit 1; }
done
# The same rows to stdout, and the same token ids as without the tokenizer.
"$bin/generate_difflm" --load ckpt --device cpu --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json \
  --prompts-jsonl p4.jsonl --gen-length 8 --steps 8 > utf8_stdout.jsonl 2> utf8.err || { cat utf8.err; exit 1; }
cmp -s utf8_stdout.jsonl utf8_1.jsonl || { echo "FAIL: stdout differs from --output"; exit 1; }
"$bin/generate_difflm" --load ckpt --device cpu --prompts-jsonl p4.jsonl --gen-length 8 --steps 8 \
  --output ids.jsonl 2> ids.err || { cat ids.err; exit 1; }
"$PY" -c "
import json
a = [json.loads(l)['token_ids'] for l in open('ids.jsonl')]
b = [json.loads(l)['token_ids'] for l in open('utf8_1.jsonl')]
assert a == b, (a, b)" || { echo "FAIL: decoding changed the token ids"; exit 1; }
# --batch-invariant (CUDA kernels whose rows ignore the batch): parsed, said in the run header, and
# on the CPU (rows batch-invariant already) the same tokens as each prompt alone without it.
"$bin/generate_difflm" --load ckpt --device cpu --prompts-jsonl p4.jsonl --gen-length 8 --steps 8 --batch-size 3 \
  --batch-invariant --output invariant.jsonl 2> invariant.err || { cat invariant.err; echo "FAIL: --batch-invariant"; exit 1; }
grep -q "^ > decode: .*batch-invariant kernels" invariant.err || { cat invariant.err; echo "FAIL: the header does not say batch-invariant"; exit 1; }
if grep -q "batch-invariant" ids.err; then echo "FAIL: batch-invariant without the flag"; exit 1; fi
"$PY" -c "
import json
a = [json.loads(l)['token_ids'] for l in open('ids.jsonl')]
b = [json.loads(l)['token_ids'] for l in open('invariant.jsonl')]
assert a == b, (a, b)" || { echo "FAIL: --batch-invariant changed CPU tokens"; exit 1; }
echo "PASS: positions and the mask id refused up front; text that is not UTF-8 written with U+FFFD, ids exact; --batch-invariant"
