#!/usr/bin/env bash
# Hugging Face conversion as a user runs it (docs/checkpoints.md, "Hugging Face"):
#   1. Qwen3-style tiny model (QK-layernorm, untied): train, export, --verify against
#      scripts/qwen_reference.py (a dependency-free Qwen forward pass written from the
#      architecture's definition; transformers itself runs on the GPU machine), import back:
#      every tensor bitwise equal; Hugging Face -> megadlm -> Hugging Face: bitwise equal too;
#      an import into a training run's folder (it would repoint "latest" to release) is refused;
#   2. Qwen2-style (q/k/v biases, grouped-query attention, tied embeddings), sharded export;
#   3. the imported checkpoint trains with --use-checkpoint-args (resume and --finetune);
#   4. bf16 export, tokenizer files copied, --verify says why it skipped without transformers.
set -uo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
conv() { "$bin/convert_checkpoint" "$@"; }
ref=(--verify --hf-verify-script "$src/scripts/qwen_reference.py" --verify-device cpu --verify-seq 16)

# ---- 1. Qwen3 style
"$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 4 --lr-warmup-iters 1 \
  --save "$tmp/q3" --save-interval 4 > "$tmp/q3.log" 2>&1 || fail "training: $(tail -3 "$tmp/q3.log")"
mkdir "$tmp/tok"; echo '{"version": "1.0"}' > "$tmp/tok/tokenizer.json"; echo '{}' > "$tmp/tok/tokenizer_config.json"
conv --to-hf --load "$tmp/q3" --out "$tmp/q3_hf" --tokenizer-dir "$tmp/tok" "${ref[@]}" > "$tmp/v.log" 2>&1 ||
  fail "export + verify: $(cat "$tmp/v.log")"
grep -q "verify: PASSED" "$tmp/v.log" || fail "verify did not pass: $(cat "$tmp/v.log")"
grep -q '"model_type": "qwen3"' "$tmp/q3_hf/config.json" || fail "not exported as qwen3"
[ -f "$tmp/q3_hf/tokenizer.json" ] && [ -f "$tmp/q3_hf/tokenizer_config.json" ] || fail "tokenizer files not copied"
echo "PASS 1a: $(grep -o 'verify: PASSED.*logit difference| [^ ]*' "$tmp/v.log")"
conv --from-hf "$tmp/q3_hf" --save "$tmp/q3_back" > /dev/null || fail "import"
conv --compare "$tmp/q3" "$tmp/q3_back" > "$tmp/c.log" || fail "megadlm -> HF -> megadlm differs: $(cat "$tmp/c.log")"
conv --to-hf --load "$tmp/q3_back" --out "$tmp/q3_hf2" > /dev/null || fail "re-export"
conv --compare "$tmp/q3_hf" "$tmp/q3_hf2" > "$tmp/c2.log" || fail "HF -> megadlm -> HF differs: $(cat "$tmp/c2.log")"
cmp -s "$tmp/q3_hf/model.safetensors" "$tmp/q3_hf2/model.safetensors" || fail "the re-exported file is not byte-identical"
echo "PASS 1b: round trips bitwise: $(tail -1 "$tmp/c.log")"
# An import into a training run's folder would repoint its latest to release: refused.
conv --from-hf "$tmp/q3_hf" --save "$tmp/q3" > "$tmp/into.log" 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "import into a training folder: exit $rc, expected 2: $(cat "$tmp/into.log")"
grep -q "error: --save $tmp/q3 holds 1 checkpoint(s) of a training run (newest: iter_0000004; latest_checkpointed_iteration.txt names 4): writing the import there would point" "$tmp/into.log" ||
  fail "import into a training folder: $(cat "$tmp/into.log")"
[ "$(cat "$tmp/q3/latest_checkpointed_iteration.txt")" = 4 ] && [ ! -e "$tmp/q3/release" ] ||
  fail "the refused import changed $tmp/q3"
echo "PASS 1c: an import into a training folder is refused: $(grep -o 'writing the import.*resuming' "$tmp/into.log")"

# ---- 2. Qwen2 style, sharded
q2=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2
    --ffn-hidden-size 96 --swiglu --normalization RMSNorm --norm-epsilon 1e-6 --disable-bias-linear --add-qkv-bias
    --position-embedding-type rope --rotary-base 1000000 --vocab-size 100 --make-vocab-size-divisible-by 8
    --mask-token 99 --seq-length 32 --max-position-embeddings 64 --attention-dropout 0 --hidden-dropout 0
    --micro-batch-size 2 --global-batch-size 4 --lr 3e-3 --lr-warmup-iters 1 --mock-data --device cpu)
"$bin/pretrain_difflm" "${q2[@]}" --train-iters 3 --save "$tmp/q2" --save-interval 3 > "$tmp/q2.log" 2>&1 ||
  fail "Qwen2-style training: $(tail -3 "$tmp/q2.log")"
conv --to-hf --load "$tmp/q2" --out "$tmp/q2_hf" --max-shard-size-gb 0.00005 "${ref[@]}" > "$tmp/v2.log" 2>&1 ||
  fail "Qwen2 export + verify: $(cat "$tmp/v2.log")"
grep -q '"model_type": "qwen2"' "$tmp/q2_hf/config.json" || fail "not exported as qwen2"
grep -q '"tie_word_embeddings": true' "$tmp/q2_hf/config.json" || fail "tied embeddings not declared"
[ -f "$tmp/q2_hf/model.safetensors.index.json" ] && ls "$tmp"/q2_hf/model-00002-of-*.safetensors > /dev/null ||
  fail "no sharded export"
grep -q "verify: PASSED" "$tmp/v2.log" || fail "Qwen2 verify did not pass: $(cat "$tmp/v2.log")"
conv --to-hf --load "$tmp/q2" --out "$tmp/q2_hf1" > /dev/null || fail "single-file export"
conv --from-hf "$tmp/q2_hf" --save "$tmp/q2_back" > /dev/null || fail "import of the sharded folder"
conv --compare "$tmp/q2" "$tmp/q2_back" > "$tmp/c.log" || fail "Qwen2 round trip differs: $(cat "$tmp/c.log")"
conv --compare "$tmp/q2_hf" "$tmp/q2_hf1" > /dev/null || fail "sharded and single-file exports differ"
echo "PASS 2: Qwen2 style (biases, GQA, tied, $(ls "$tmp"/q2_hf/model-*.safetensors | wc -l) shards): $(grep -o 'logit difference| [^ ]*' "$tmp/v2.log"); round trip bitwise"

# ---- 3. training from an imported checkpoint
"$bin/pretrain_difflm" --load "$tmp/q3_back" --use-checkpoint-args --micro-batch-size 4 --global-batch-size 8 \
  --train-iters 2 --lr 1e-3 --mock-data --device cpu --attention-dropout 0 --hidden-dropout 0 --log-interval 1 \
  > "$tmp/t.log" 2>&1 || fail "training from the import: $(tail -3 "$tmp/t.log")"
grep -q "successfully loaded checkpoint from $tmp/q3_back/release" "$tmp/t.log" || fail "no load message"
"$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 12 --load "$tmp/q3" --finetune \
  > "$tmp/ft.log" 2>&1 || fail "--finetune: $(tail -3 "$tmp/ft.log")"
echo "PASS 3: the imported checkpoint trains (--use-checkpoint-args), --finetune from a training checkpoint"

# ---- 4. bf16, skip message
conv --to-hf --load "$tmp/q3" --out "$tmp/bf16" --dtype bf16 > /dev/null || fail "bf16 export"
grep -q '"torch_dtype": "bfloat16"' "$tmp/bf16/config.json" || fail "bf16 export not declared"
conv --from-hf "$tmp/bf16" --save "$tmp/bf16_back" > /dev/null || fail "bf16 import"
conv --compare "$tmp/q3" "$tmp/bf16_back" --tolerance 0.01 > /dev/null || fail "bf16 round trip beyond rounding"
conv --to-hf --load "$tmp/q3" --out "$tmp/skip" --verify --python /bin/false > "$tmp/s.log" 2>&1 || fail "skip path exited non-zero"
grep -q "verify: SKIPPED" "$tmp/s.log" || fail "no SKIPPED message: $(cat "$tmp/s.log")"
rc=0; conv --to-hf --load "$tmp/q3" --out "$tmp/skip" "${ref[@]}" --hf-device gpu > "$tmp/d.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q '`--hf-device gpu`: invalid value; valid: cpu, cuda' "$tmp/d.log" || fail "bad --hf-device not named (exit $rc): $(cat "$tmp/d.log")"
echo "PASS 4: bf16 export/import; --hf-device checked; without transformers: $(cut -c1-90 "$tmp/s.log" | grep SKIPPED)..."
echo "PASS: hf_conversion"
