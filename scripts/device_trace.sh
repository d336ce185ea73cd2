#!/usr/bin/env bash
# One device call that says where GPU time is lost (idle gaps, with what the host was doing):
# CUPTI traces (scripts/trace_iteration.sh) of one training iteration for the 1.7B model at
# seq 8192 and seq 2048 and for the fine-grained MoE, and of a short generation run (exact and
# --kv-cache dual, batch 1 and 16) of the 1.7B architecture with random weights.
#   scripts/device_trace.sh BUILD OUT [train] [generation]
# Writes OUT/*.gaps.md (small) and OUT/traces.tgz (the raw traces).
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:?usage: device_trace.sh BUILD OUT}" && pwd); out=${2:?}; shift 2
what=" ${*:-train generation} "
mkdir -p "$out"; out=$(cd "$out" && pwd)
export MEGADLM_BIN=$build/bin NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
work=$(mktemp -d)
# shellcheck source=lib/generation_inputs.sh
source scripts/lib/generation_inputs.sh
if [[ $what == *" train "* ]]; then
  bash scripts/trace_iteration.sh "$work" s8192 3 @configs/megadlms_1.7b.args --seq-length 8192 \
    --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 4
  bash scripts/trace_iteration.sh "$work" s2048 3 @configs/megadlms_1.7b.args --micro-batch-size 4 --global-batch-size 8
  bash scripts/trace_iteration.sh "$work" moe 4 @configs/fine_grained_moe.args --global-batch-size 4
fi
if [[ $what == *" generation "* ]]; then
  save_random_checkpoint "$build/bin" "$work/ckpt" "$work/save.log"
  echo "save: exit $? ($SECONDS s)"
  write_ragged_prompts "$work/prompts.jsonl"
  # The tracer keeps the last profiled range: the timed run of the last mode listed.
  for b in 1 16; do
    for modes in exact exact,dual; do
      tag=${modes##*,}
      MEGADLM_PROFILE_GENERATION=1 MEGADLM_TRACE_RANGE=1 CUDA_INJECTION64_PATH="$build/lib/libmegadlm_cupti_trace.so" \
        MEGADLM_TRACE_FILE="$work/gen_${tag}_b$b.trace.jsonl" \
        timeout 150 "$build/bin/generate_bench" --load "$work/ckpt" --prompts-jsonl "$work/prompts.jsonl" \
        --gen-length 256 --steps 256 --block-length 32 --device cuda --batch-sizes $b --batch1-prompts 1 \
        --modes $modes --output "$work/gen_${tag}_b$b.jsonl" > "$work/gen_${tag}_b$b.log" 2>&1
      echo "generation $modes batch $b: exit $? ($SECONDS s)"
      python3 scripts/trace_gaps.py "$work/gen_${tag}_b$b.trace.jsonl" --kernels 25 \
        --title "generate_bench $tag batch $b (gen 256, 256 steps, block 32; the timed run only)" > "$work/gen_${tag}_b$b.gaps.md"
      head -12 "$work/gen_${tag}_b$b.gaps.md"
    done
  done
fi
cp "$work"/*.gaps.md "$out/" 2>/dev/null
cat "$work"/*.log > "$out/logs.txt" 2>/dev/null
tar czf "$out/traces.tgz" -C "$work" $(cd "$work" && ls *.trace.jsonl *.jsonl 2>/dev/null | sort -u) 2>/dev/null
ls -la "$out"
