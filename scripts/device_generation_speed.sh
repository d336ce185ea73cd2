#!/usr/bin/env bash
# One device call on exact decoding's speed (the batch-16 goal: 2x the transformers reference,
# docs/benchmarks.md): the whole gpu_parity, the
# attention rows of megadlm_bench (the sampler's batch-16 canvas dense and with its left padding
# as documents, packed documents of ~256 and ~1024 tokens), exact and --kv-cache dual generation
# of the 1.7B architecture (random weights, gen 256, block 32, 256 steps, batch 1 and 16) with the
# heuristic's first GEMM algorithm and with MEGADLM_GEMM_AUTOTUNE=1, and a CUPTI trace of the
# exact batch-16 run (tools/cupti_trace, scripts/trace_gaps.py).
#   scripts/device_generation_speed.sh BUILD OUT
# Writes OUT/summary.txt, OUT/gen_exact_b16.gaps.md and OUT/results.tgz (logs, rows).
set -uo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:?usage: device_generation_speed.sh BUILD OUT}" && pwd); out=${2:?}
mkdir -p "$out"; out=$(cd "$out" && pwd)
export MEGADLM_BIN=$build/bin NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
work=$(mktemp -d)
# shellcheck source=lib/generation_inputs.sh
source scripts/lib/generation_inputs.sh
sum=$out/summary.txt
timeout 260 "$build/bin/gpu_parity" > "$work/parity.log" 2>&1
echo "parity: exit $? ($SECONDS s): $(grep -E '^\[  (PASSED|FAILED)' "$work/parity.log" | tr '\n' ' ')" >> "$sum"
timeout 150 "$build/bin/megadlm_bench" ops --op attention > "$work/attention_ops.txt" 2>&1
echo "attention ops: exit $? ($SECONDS s)" >> "$sum"
grep -E "^attention_(fwd|bwd)_(canvas|documents|s8192)|^attention_(fwd|bwd)_cudnn" "$work/attention_ops.txt" | grep -v " B=" >> "$sum"
save_random_checkpoint "$build/bin" "$work/ckpt" "$work/save.log"
echo "save: exit $? ($SECONDS s)" >> "$sum"
write_ragged_prompts "$work/prompts.jsonl"
gen() {  # gen TAG MODES [env...]
  local tag=$1 modes=$2; shift 2
  env "$@" timeout 150 "$build/bin/generate_bench" --load "$work/ckpt" --prompts-jsonl "$work/prompts.jsonl" \
    --gen-length 256 --steps 256 --block-length 32 --device cuda --batch-sizes 1,16 --batch1-prompts 2 \
    --modes "$modes" --output "$work/gen_$tag.jsonl" > "$work/gen_$tag.log" 2>&1
  echo "generation $tag: exit $? ($SECONDS s)" >> "$sum"
  grep -h tokens_per_s "$work/gen_$tag.jsonl" >> "$sum"
}
gen default exact,dual
gen autotune exact MEGADLM_GEMM_AUTOTUNE=1
MEGADLM_PROFILE_GENERATION=1 MEGADLM_TRACE_RANGE=1 CUDA_INJECTION64_PATH="$build/lib/libmegadlm_cupti_trace.so" \
  MEGADLM_TRACE_FILE="$work/gen_exact_b16.trace.jsonl" \
  timeout 150 "$build/bin/generate_bench" --load "$work/ckpt" --prompts-jsonl "$work/prompts.jsonl" \
  --gen-length 256 --steps 256 --block-length 32 --device cuda --batch-sizes 16 --modes exact \
  --output "$work/gen_trace.jsonl" > "$work/gen_trace.log" 2>&1
echo "trace: exit $? ($SECONDS s)" >> "$sum"
python3 scripts/trace_gaps.py "$work/gen_exact_b16.trace.jsonl" --kernels 25 \
  --title "generate_bench exact batch 16 (gen 256, 256 steps, block 32; the timed run only)" > "$out/gen_exact_b16.gaps.md"
tar czf "$out/results.tgz" -C "$work" --exclude=ckpt --exclude='*.trace.jsonl' .
cat "$sum"
