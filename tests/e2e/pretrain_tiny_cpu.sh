#!/usr/bin/env bash
# The issue's acceptance run on the CPU, as a user runs it: the tiny diffusion LM
# (configs/tiny_dlm.args: 2 layers, hidden 64, 4 heads, seq 64) for 100 iterations on mock data
# lowers its loss clearly, and the same run twice gives identical losses and grad norms.
set -euo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run() {
  "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 100 \
    --log-interval 1 --metrics-jsonl "$tmp/$1.jsonl" > "$tmp/$1.log" 2> "$tmp/$1.err"
}
run a
run b
# Per-iteration "lm loss" and "grad norm" columns of the Megatron log lines.
cols() { grep -o 'lm loss: [^|]*| loss scale: [^|]*| grad norm: [^|]*' "$tmp/$1.log"; }
cols a > "$tmp/a.cols"
cols b > "$tmp/b.cols"
[ "$(wc -l < "$tmp/a.cols")" -eq 100 ] || { echo "expected 100 iteration lines"; cat "$tmp/a.log"; exit 1; }
if ! cmp -s "$tmp/a.cols" "$tmp/b.cols"; then
  echo "FAIL: two identical runs logged different losses"; diff "$tmp/a.cols" "$tmp/b.cols" | head; exit 1
fi
[ "$(grep -c "\"lm_loss\"" "$tmp/a.jsonl")" -eq 100 ] || { echo "FAIL: expected 100 metrics lines"; exit 1; }
for key in kind iteration lm_loss grad_norm lr consumed_samples elapsed_ms tokens_per_s tflops_per_gpu mfu mfu_989 peak_mem_gb; do
  grep -q "\"$key\":" "$tmp/a.jsonl" || { echo "FAIL: metrics lack $key"; exit 1; }
done
# Every training row says what it is (docs/metrics.md).
[ "$(grep -c '"kind":"train"' "$tmp/a.jsonl")" -eq 100 ] || { echo "FAIL: expected 100 rows of kind train"; exit 1; }
# Mean of the first and last 10 losses (diffusion losses are noisy per iteration).
awk -F'lm loss: ' '{split($2, v, " "); loss[++n] = v[1]}
  END { for (i = 1; i <= 10; i++) { a += loss[i]; b += loss[n - 10 + i] }
        a /= 10; b /= 10; printf "loss: first 10 mean %.4f, last 10 mean %.4f\n", a, b;
        if (!(b < 0.7 * a)) { print "FAIL: the loss did not fall clearly"; exit 1 } }' "$tmp/a.cols"
echo "PASS: loss falls and two runs are identical"
