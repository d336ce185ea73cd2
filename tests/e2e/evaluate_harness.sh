#!/usr/bin/env bash
# evaluate_difflm --task harness: lm-evaluation-harness style requests in one JSONL file.
# On a full-sequence tiny model: loglikelihood results equal the NumPy reference of LLaDA's
# estimator (tests/golden/llada_reference.py) at the request's line, is_greedy is true exactly
# for the continuation the reference's greedy decoding produces, generate_until is the
# reference's greedy generation cut at the first `until` string; examples/harness/requests.jsonl
# runs through a byte-level tokenizer. On a block-diffusion model: loglikelihood equals the block
# reference, and generate_until runs block decoding with the exact cache: its tokens equal the
# NumPy block sampler's (tests/golden/block_reference.py) token for token, max_gen_toks that is
# not a whole number of blocks keeps the first tokens, and an `until` string ends decoding after
# the block where it appears (fewer tokens and forwards). Bad request types are named.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
source "$src/tests/e2e/lib/python_numpy.sh"
tiny_checkpoint ckpt
export_hf ckpt hf
# The greedy continuation of [5 17 33] (3 tokens), by the reference.
echo '{"prompt_ids": [5, 17, 33]}' > p.jsonl
"$PY" "$ref" generate --model hf --prompts-jsonl p.jsonl --gen-length 3 --steps 3 --block-length 3 --mask-id 127 \
  --output greedy.jsonl > /dev/null
greedy=$("$PY" -c "import json; print(' '.join(map(str, json.load(open('greedy.jsonl'))['token_ids'])))")
# Its greedy 4-token generation: generate_until below stops at the text of its second token.
"$PY" "$ref" generate --model hf --prompts-jsonl p.jsonl --gen-length 4 --steps 4 --block-length 4 --mask-id 127 \
  --output g4.jsonl > /dev/null
stop=$("$PY" -c "import json; print(json.load(open('g4.jsonl'))['token_ids'][1])")
wrong=$("$PY" -c "print(' '.join(str((int(t) + 1) % 120) for t in '$greedy'.split()))")
# NullTokenizer text: whitespace-separated ids; its EOD (127) is the mask id, so no EOS stop.
cat > harness.jsonl <<R
{"request_type": "loglikelihood", "doc_id": 7, "arguments": ["5 17 33", " $greedy"]}
{"request_type": "loglikelihood", "arguments": ["5 17 33", " $wrong"]}
{"request_type": "generate_until", "arguments": ["100 3 9", {"until": ["NEVER"], "max_gen_toks": 8}]}
{"request_type": "generate_until", "arguments": ["5 17 33", {"until": ["NEVER", "$stop"], "max_gen_toks": 4}]}
R
"$bin/evaluate_difflm" --load ckpt --task harness --requests-jsonl harness.jsonl --tokenizer-type NullTokenizer \
  --mc-num 8 --mc-batch-size 4 --device cpu --seed 99 --output out.jsonl --summary-json summary.json 2> eval.err \
  || { cat eval.err; exit 1; }
"$PY" -c "
import json
for t in ('$greedy', '$wrong'):
    print(json.dumps({'context_ids': [5, 17, 33], 'continuation_ids': [int(v) for v in t.split()]}))" > ll.jsonl
"$PY" "$ref" loglik --model hf --requests-jsonl ll.jsonl --mask-id 127 --seed 99 --mc-num 8 --mc-batch 4 \
  --output ll_py.jsonl > /dev/null
echo '{"prompt_ids": [100, 3, 9]}' > gp.jsonl
"$PY" "$ref" generate --model hf --prompts-jsonl gp.jsonl --gen-length 8 --steps 8 --block-length 8 --mask-id 127 \
  --output g8.jsonl > /dev/null
"$PY" - "$stop" <<'P' || { echo "FAIL: harness results differ from the reference"; cat out.jsonl summary.json; exit 1; }
import json, sys
out = [json.loads(l) for l in open("out.jsonl")]
ll = [json.loads(l) for l in open("ll_py.jsonl")]
g8 = [json.loads(l)["token_ids"] for l in open("g8.jsonl")]
g4 = json.load(open("g4.jsonl"))["token_ids"]
s = json.load(open("summary.json"))
assert [o["index"] for o in out] == [0, 1, 2, 3] and out[0]["doc_id"] == 7, out
assert [o["request_type"] for o in out] == ["loglikelihood"] * 2 + ["generate_until"] * 2
worst = max(abs(out[i]["loglikelihood"] - ll[i]["loglikelihood"]) for i in range(2))
assert worst <= 1e-5, worst
assert out[0]["is_greedy"] is True and out[1]["is_greedy"] is False, (out[0], out[1])
assert out[0]["result"] == [out[0]["loglikelihood"], True]
want2 = " ".join(map(str, g8[0]))
assert out[2]["generated_text"] == want2 == out[2]["result"], (out[2], want2)
text = " ".join(map(str, g4))  # cut at the first occurrence of the second token's text
want3 = text[:text.find(sys.argv[1])]
assert text.find(sys.argv[1]) > 0 and want3 != text
assert out[3]["generated_text"] == want3, (out[3]["generated_text"], want3)
assert s["requests"] == 4 and s["loglikelihood_requests"] == 2 and s["examples_per_second"] > 0, s
print(f"harness: loglikelihood within {worst:.1e} of the reference, is_greedy right, generate_until = the reference's"
      f" ({s['examples_per_second']:.1f} requests/s)")
P
# The shipped example, through a byte-level tokenizer whose 128 tokens are the ASCII bytes.
byte_tokenizer tokenizer.json 0
"$bin/evaluate_difflm" --load ckpt --task harness --requests-jsonl "$src/examples/harness/requests.jsonl" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json --mc-num 4 --mc-batch-size 4 --block-length 8 \
  --device cpu --output example.jsonl 2> eval.err || { cat eval.err; exit 1; }
"$PY" -c "
import json, sys
rows = [json.loads(l) for l in open('example.jsonl')]
ok = len(rows) == 5 and all('loglikelihood' in r for r in rows[:3]) and all('generated_text' in r for r in rows[3:])
ok = ok and all(u not in rows[3]['generated_text'] for u in ('\n', 'Question:')) and '.' not in rows[4]['generated_text']
sys.exit(0 if ok else 1)" || { echo "FAIL: examples/harness/requests.jsonl"; cat example.jsonl; exit 1; }
# Block diffusion: loglikelihood = the block reference.
tiny_checkpoint bd --attention-mask-type block_causal --dlm-block-size 8 --dlm-loss-weight inv_t_eps
export_hf bd hf_bd
head -2 harness.jsonl > bd_harness.jsonl
"$bin/evaluate_difflm" --load bd --task harness --requests-jsonl bd_harness.jsonl --tokenizer-type NullTokenizer \
  --mc-num 8 --mc-batch-size 4 --device cpu --seed 99 --output bd_out.jsonl 2> eval.err || { cat eval.err; exit 1; }
"$PY" "$src/tests/golden/block_likelihood_reference.py" loglik --model hf_bd --requests-jsonl ll.jsonl --mask-id 127 \
  --block-size 8 --seed 99 --mc-num 8 --mc-batch 4 --output bd_py.jsonl > /dev/null
"$PY" -c "
import json, sys
a = [json.loads(l)['loglikelihood'] for l in open('bd_out.jsonl')]
b = [json.loads(l)['loglikelihood'] for l in open('bd_py.jsonl')]
sys.exit(0 if len(a) == 2 and max(abs(x - y) for x, y in zip(a, b)) <= 2e-5 else 1)" \
  || { echo "FAIL: block-diffusion harness loglikelihood differs from the reference"; exit 1; }
# generate_until on the block model: the block reference's greedy generation (block 8, one
# token a step), the same prompts.
bref="$src/tests/golden/block_reference.py"
printf '{"prompt_ids": [100, 3, 9]}\n{"prompt_ids": [5, 17, 33]}\n' > bp.jsonl
"$PY" "$bref" generate --model hf_bd --prompts-jsonl bp.jsonl --gen-length 8 --steps 8 --block-length 8 --mask-id 127 \
  --seed 99 --output bd_g8.jsonl > /dev/null
"$PY" "$bref" generate --model hf_bd --prompts-jsonl bp.jsonl --gen-length 16 --steps 16 --block-length 8 --mask-id 127 \
  --seed 99 --output bd_g16.jsonl > /dev/null
# A stop string: the text of the second generated token of [5 17 33] (inside the first block).
bstop=$("$PY" -c "import json; print([json.loads(l) for l in open('bd_g16.jsonl')][1]['token_ids'][1])")
cat > bd_gen.jsonl <<R
{"request_type": "generate_until", "doc_id": 3, "arguments": ["100 3 9", {"until": ["NEVER"], "max_gen_toks": 8}]}
{"request_type": "generate_until", "arguments": ["5 17 33", {"until": [], "max_gen_toks": 5}]}
{"request_type": "generate_until", "arguments": ["5 17 33", {"until": [], "max_gen_toks": 16}]}
{"request_type": "generate_until", "arguments": ["5 17 33", {"until": ["NEVER", "$bstop"], "max_gen_toks": 16}]}
R
"$bin/evaluate_difflm" --load bd --task harness --requests-jsonl bd_gen.jsonl --tokenizer-type NullTokenizer \
  --mc-num 8 --mc-batch-size 4 --device cpu --seed 99 --output bd_gen_out.jsonl --summary-json bd_summary.json \
  2> eval.err || { cat eval.err; exit 1; }
"$PY" - "$bstop" <<'P' || { echo "FAIL: block-diffusion generate_until differs from the block reference"; cat bd_gen_out.jsonl; exit 1; }
import json, sys
out = [json.loads(l) for l in open("bd_gen_out.jsonl")]
g8 = [json.loads(l)["token_ids"] for l in open("bd_g8.jsonl")]
g16 = [json.loads(l)["token_ids"] for l in open("bd_g16.jsonl")]
s = json.load(open("bd_summary.json"))
text = lambda ids: " ".join(map(str, ids))
assert [o["request_type"] for o in out] == ["generate_until"] * 4 and out[0]["doc_id"] == 3
# Token for token: the C++ block decoder (exact cache) = the NumPy block sampler (no cache).
assert out[0]["generated_ids"] == g8[0] and len(g8[0]) == 8, (out[0], g8[0])
assert out[0]["generated_text"] == text(g8[0]) == out[0]["result"], out[0]
assert out[1]["generated_ids"] == g8[1][:5], (out[1], g8[1])  # max_gen_toks 5: 8 decoded, 5 kept
assert out[2]["generated_ids"] == g16[1] and len(g16[1]) == 16, (out[2], g16[1])
full = text(g16[1])
at = full.find(sys.argv[1])
assert at > 0, (full, sys.argv[1])
assert out[3]["generated_text"] == full[:at] and out[3]["stopped_at_until"] is True, (out[3], full[:at])
# The stop string is in the first block (prompt 3 + 5 generated): decoding ended there.
assert out[3]["generated_ids"] == g16[1][:5], out[3]
assert out[3]["forwards"] < out[2]["forwards"], (out[2], out[3])
assert out[2]["stopped_at_until"] is False
assert s["decode"] == "block" and s["generate_until_requests"] == 4 and s["examples_per_second"] > 0, s
print(f"block-diffusion generate_until = the block reference token for token; until stopped after "
      f"{out[3]['forwards']} of {out[2]['forwards']} forwards")
P
refuse() {  # refuse FILE TEXT: exit 2 and TEXT in the message, no result rows
  set +e
  "$bin/evaluate_difflm" --load "$3" --task harness --requests-jsonl "$1" --tokenizer-type NullTokenizer --device cpu \
    --mc-num 4 --mc-batch-size 4 --output refused.jsonl > bad.out 2>&1
  local rc=$?
  set -e
  [ $rc -eq 2 ] && grep -qF -- "$2" bad.out && [ ! -s refused.jsonl ] \
    || { echo "FAIL: $1 was not refused with '$2'"; cat bad.out; exit 1; }
}
echo '{"request_type": "generate_until", "arguments": ["5 17 33", {"until": [], "max_gen_toks": 58}]}' > bd_long.jsonl
refuse bd_long.jsonl '"max_gen_toks": 58 rounded up to whole blocks of 8' bd
echo '{"request_type": "loglikelihood_rolling", "arguments": ["5"]}' > bad.jsonl
refuse bad.jsonl '"request_type": "loglikelihood_rolling": valid: loglikelihood, generate_until' ckpt
echo '{"request_type": "generate_until", "arguments": ["5", {"until": [], "max_gen_toks": 6}]}' > bad2.jsonl
"$bin/evaluate_difflm" --load ckpt --task harness --requests-jsonl bad2.jsonl --tokenizer-type NullTokenizer \
  --block-length 4 --device cpu > bad.out 2>&1 && { echo "FAIL: max_gen_toks 6 with --block-length 4 accepted"; exit 1; }
grep -qF '"max_gen_toks": 6 is not a multiple of `--block-length 4`' bad.out || { cat bad.out; exit 1; }
echo '{"request_type": "generate_until", "arguments": ["5 17 33", {"until": [], "max_gen_toks": 64}]}' > long.jsonl
refuse long.jsonl 'request 0: prompt 0 (3 tokens) plus `max_gen_toks 64` needs 67 positions; the model has 64' ckpt
echo "PASS: harness requests equal the references (block-diffusion generate_until too); bad requests refused"
