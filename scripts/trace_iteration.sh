#!/usr/bin/env bash
# The GPU's idle time during one training iteration and what the host did meanwhile: runs
# pretrain_difflm with the CUPTI tracer (tools/cupti_trace, injected by CUDA_INJECTION64_PATH)
# recording only inside the --profile range, then scripts/trace_gaps.py.
#
#   scripts/trace_iteration.sh OUT_DIR NAME ITERATION pretrain_difflm-flags...
# Writes OUT_DIR/NAME.trace.jsonl, NAME.trace.log, NAME.gaps.md. Environment: MEGADLM_BIN
# (default build/bin; the tracer is ../lib/libmegadlm_cupti_trace.so next to it, and libcupti
# is looked for there, then in the CUDA toolkit).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: trace_iteration.sh OUT NAME ITERATION flags...}; name=${2:?}; iteration=${3:?}
shift 3
bin=${MEGADLM_BIN:-build/bin}
lib=$(cd "$bin/../lib" && pwd)
mkdir -p "$out"
[ -f "$lib/libmegadlm_cupti_trace.so" ] || { echo "trace_iteration.sh: $lib/libmegadlm_cupti_trace.so not built"; exit 2; }
export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64"
CUDA_INJECTION64_PATH="$lib/libmegadlm_cupti_trace.so" MEGADLM_TRACE_RANGE=1 \
  MEGADLM_TRACE_FILE="$out/$name.trace.jsonl" \
  timeout 200 "$bin/pretrain_difflm" "$@" --mock-data --device cuda --difflm-varilen-prob 0 --log-interval 1 --eval-iters 0 \
  --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000 --train-iters "$iteration" --profile --profile-step-start $((iteration - 1)) --profile-step-end "$iteration" \
  > "$out/$name.trace.log" 2>&1
echo "$name trace: exit $? ($SECONDS s)"
python3 scripts/trace_gaps.py "$out/$name.trace.jsonl" --kernels 25 --title "$name (iteration $iteration)" > "$out/$name.gaps.md"
head -30 "$out/$name.gaps.md"
