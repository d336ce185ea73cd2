#!/usr/bin/env bash
# The Hugging Face formats of the block-diffusion families (convert_checkpoint --hf-format;
# docs/checkpoints.md "Block-diffusion formats"). For SDAR, Fast-dLLM v2 and LLaDA, an independent
# NumPy script (tests/golden/block_formats_reference.py: safetensors written by hand, the family's
# names and config keys, no megadlm section) writes a tiny folder; megadlm imports it and its
# logits equal the script's NumPy forward (--verify, fp32, max |diff| <= 1e-4); the import records
# the family's block size and mask id (Fast-dLLM v2: from added_tokens.json); exporting back in the
# same format gives the script's tensors bitwise. A reference with gate and up swapped fails
# --verify; a folder imported as another format, or a model exported as a format it is not, is
# refused naming the file, key or flag.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
source "$src/tests/e2e/lib/python_numpy.sh"
source "$src/tests/e2e/lib/expect.sh"
R="$src/tests/golden/block_formats_reference.py"
conv() { "$bin/convert_checkpoint" "$@"; }
ver=(--verify --python "$PY" --hf-verify-script "$R" --verify-device cpu --verify-seq 16)
while read -r fam block mask; do
  "$PY" "$R" make "$fam" "$fam"
  conv --from-hf "$fam" --save "ck_$fam" --hf-format "$fam" "${ver[@]}" > "v_$fam.log" 2>&1 ||
    { cat "v_$fam.log"; echo "FAIL: $fam import + verify"; exit 1; }
  grep -q "verify: PASSED" "v_$fam.log" || { cat "v_$fam.log"; echo "FAIL: $fam logits differ from NumPy"; exit 1; }
  conv --to-hf --load "ck_$fam" --out "out_$fam" --hf-format "$fam" > /dev/null || { echo "FAIL: $fam export"; exit 1; }
  conv --compare "$fam" "out_$fam" > "c_$fam.log" || { cat "c_$fam.log"; echo "FAIL: $fam -> megadlm -> $fam differs"; exit 1; }
  "$PY" - "$fam" "$block" "$mask" <<'P' || { echo "FAIL: $1 config keys"; exit 1; }
import json, sys
fam, block, mask = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
a, b = json.load(open(fam + "/config.json")), json.load(open("out_" + fam + "/config.json"))
assert a["model_type"] == b["model_type"] and a["architectures"] == b["architectures"], (a, b)
m = b["megadlm"]
assert m["mask_token_id"] == mask, m
assert m["attention"] == ("bidirectional" if block == 0 else "block_causal"), m
key = {"sdar": "block_size", "fast_dllm_v2": "bd_size"}.get(fam)
assert key is None or b[key] == block, (key, b)
P
  echo "$fam: $(grep -o 'largest |logit difference| [^ ]*' "v_$fam.log") against NumPy; back bitwise: $(tail -1 "c_$fam.log" | cut -c1-60)"
done <<'F'
sdar 4 63
fast_dllm_v2 8 63
llada 0 63
F
# The check can fail: the reference with gate and up swapped.
expect 1 env BFR_SWAP_GATE_UP=1 "$bin/convert_checkpoint" --from-hf llada --save ck_swap "${ver[@]}"
has "verify: FAILED"
refuse() { refuses "$1" conv "${@:2}"; }  # refuse TEXT ARGS...: exit 2 with TEXT in the message
refuse "llada/config.json: model_type 'llada' is the llada format, not \`--hf-format sdar\`" \
  --from-hf llada --save ck_x --hf-format sdar
refuse "\`--hf-format sdar\` is a block-diffusion format" --to-hf --load ck_llada --out x --hf-format sdar
refuse "\`--hf-format llada\` is a full-attention (bidirectional) model" --to-hf --load ck_sdar --out x --hf-format llada
refuse "\`--hf-format qwen3\`: invalid value; valid: qwen, sdar, fast_dllm_v2, llada" --to-hf --load ck_sdar --out x --hf-format qwen3
# LLaDA's names under a qwen config: named as missing.
mkdir mixed && cp llada/model.safetensors mixed/ && cp out_sdar/config.json mixed/
refuse "missing tensor model.embed_tokens.weight" --from-hf mixed --save ck_y
echo "PASS: SDAR, Fast-dLLM v2 and LLaDA folders import with NumPy-equal logits and export back bitwise; mismatches refused"
