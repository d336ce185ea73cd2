#!/usr/bin/env bash
# Training benchmark of the MegaDLMs 1.7B architecture on one GPU.
# Runs pretrain_difflm with configs/megadlms_1.7b.args on mock data (the schedule shortened so a
# few iterations are a valid run; it does not change the speed), one log line per iteration, no
# evaluation passes (--eval-iters 0: they would only add time), and writes tokens/s, TFLOP/s per
# GPU, MFU (against 811 TFLOP/s, the cuBLASLt bf16 GEMM rate measured on the H200, and against
# 989, the datasheet rate) and peak memory (in use and reserved) to OUT_DIR/bench_train.json and
# .md. The metrics rows are described in docs/metrics.md. MEGADLM_BIN: folder of pretrain_difflm.
#
#   scripts/bench_train.sh OUT_DIR [ITERS] [GLOBAL_BATCH] [extra pretrain_difflm flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench_out}; iters=${2:-10}; gbs=${3:-64}; shift $(( $# < 3 ? $# : 3 )) || true
skip=$(( iters > 4 ? 2 : 1 ))
mkdir -p "$out"
bin=${MEGADLM_BIN:-build/bin}
metrics="$out/train_metrics.jsonl"
rm -f "$metrics"
"$bin/pretrain_difflm" @configs/megadlms_1.7b.args --mock-data --device cuda --difflm-varilen-prob 0 \
  --global-batch-size "$gbs" --train-iters "$iters" --log-interval 1 --eval-iters 0 \
  --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000 \
  --metrics-jsonl "$metrics" "$@" 2>&1 | tee "$out/train_log.txt"
python3 scripts/summarize_metrics.py "$metrics" --skip "$skip" \
  --label "MegaDLMs 1.7B, 1 GPU, mbs 4, gbs $gbs, seq 2048, bf16" \
  --json "$out/bench_train.json" --markdown "$out/bench_train.md"
