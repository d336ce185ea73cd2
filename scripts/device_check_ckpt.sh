#!/usr/bin/env bash
# Checkpoint checks for the GPU machine, from a carried build folder (no compiling):
#   gpu        the CUDA checkpoint tests (gpu_parity --gtest_filter='CheckpointCuda*'): bitwise state
#              after a load, resumed steps vs the uninterrupted run, a CUDA checkpoint on the CPU
#   resume     the tiny model on CUDA through the command line: 12 iterations straight vs 6 + resume
#              (and, with 2 GPUs, 2-rank distributed-optimizer save -> 1-GPU resume)
#   export     the 1.7B model: 3 steps on CUDA, --save (with optimizer: reports the save time), then
#              Hugging Face exports in fp32 and bf16 (reports times and sizes)
#   verify     transformers vs megadlm logits, bidirectional, bf16 on CUDA, 8 x 128 random tokens
#              (mean |diff| <= 1e-2, loss diff <= 5e-3; also both against transformers in fp32, the
#              noise floor); prints the largest differences
#   verify32   the same in fp32: megadlm on the CPU, transformers on the GPU without TF32, 1 x 32
#              tokens (max |diff| <= 1e-4, loss diff <= 1e-5; capped at 5 min)
#   roundtrip  megadlm -> HF -> megadlm and HF -> megadlm -> HF: every tensor bitwise (fp32), and the
#              bf16 import against the fp32 original within bf16 rounding
#   scripts/device_check_ckpt.sh BUILD_DIR OUT_DIR [gpu|resume|export|verify|verify32|roundtrip|all]...
# Results: OUT_DIR/ckpt_*.log and a summary in OUT_DIR/ckpt_summary.txt. Needs python3 with torch
# and transformers for `verify` (scripts/hf_verify.py; it says why when they are missing).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?build dir}; out=${2:?out dir}; shift 2
what=${*:-all}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export LD_LIBRARY_PATH="$PWD/$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
bin="$PWD/$build/bin"
# Checkpoints are tens of GB: they stay out of OUT_DIR (which the device tool copies back).
work=${CKPT_WORK:-/tmp/megadlm_ckpt_work}
mkdir -p "$work"
summary="$out/ckpt_summary.txt"
has() { [[ " $what " == *" $1 "* || " $what " == *" all "* ]]; }
note() { echo "$*" | tee -a "$summary"; }
det() { sed -E 's/"(elapsed_ms|tokens_per_s|tflops_per_gpu|mfu|mfu_989|peak_mem_gb|peak_reserved_gb)":[^,}]*,?//g' "$1"; }
big=(@configs/megadlms_1.7b.args --mock-data --device cuda --global-batch-size 16 --lr-decay-style cosine
     --lr-warmup-iters 1 --lr-decay-iters 3 --train-iters 3 --log-interval 1 --eval-iters 0)

if has gpu; then
  "$bin/gpu_parity" --gtest_filter='CheckpointCuda*' --gtest_output=xml:"$out/ckpt_gpu.xml" > "$out/ckpt_gpu.log" 2>&1
  note "gpu checkpoint tests exit $?"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^  iteration|Failure' "$out/ckpt_gpu.log" | tee -a "$summary"
  grep -o 'cuda_training_bitwise_deterministic" value="[a-z]*' "$out/ckpt_gpu.xml" | tee -a "$summary"
fi

if has resume; then
  tiny=(@configs/tiny_dlm.args --device cuda --log-interval 1 --lr-warmup-iters 2 --lr-decay-iters 12 --train-iters 12)
  rm -rf "$work/tiny"
  "$bin/pretrain_difflm" "${tiny[@]}" --metrics-jsonl "$work/straight.jsonl" > "$out/ckpt_resume.log" 2>&1
  "$bin/pretrain_difflm" "${tiny[@]}" --metrics-jsonl "$work/straight2.jsonl" >> "$out/ckpt_resume.log" 2>&1
  "$bin/pretrain_difflm" "${tiny[@]}" --save "$work/tiny" --save-interval 3 --exit-interval 6 >> "$out/ckpt_resume.log" 2>&1
  "$bin/pretrain_difflm" "${tiny[@]}" --load "$work/tiny" --metrics-jsonl "$work/resumed.jsonl" >> "$out/ckpt_resume.log" 2>&1
  note "resume (tiny, CUDA): exit $?"
  if cmp -s <(det "$work/straight.jsonl") <(det "$work/straight2.jsonl"); then note "  two straight CUDA runs: bitwise identical"
  else note "  two straight CUDA runs differ (non-deterministic kernels): resume can only match to their spread"; fi
  # Iterations 7-12 plus the final validation and test lines.
  if cmp -s <(det "$work/straight.jsonl" | tail -8) <(det "$work/resumed.jsonl"); then note "  resumed iterations 7-12 and final validation/test: bitwise identical to the straight run"
  else note "  resumed iterations 7-12 differ from the straight run:"; paste -d'\n' <(det "$work/straight.jsonl" | tail -8) <(det "$work/resumed.jsonl") | cut -c1-160 | tee -a "$summary"; fi
  if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ] && command -v mpirun > /dev/null; then
    flags=(); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
    rm -rf "$work/tiny2"
    mpirun -np 2 "${flags[@]}" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$bin/pretrain_difflm" "${tiny[@]}" \
      --use-distributed-optimizer --save "$work/tiny2" --save-interval 3 --exit-interval 6 >> "$out/ckpt_resume.log" 2>&1
    "$bin/pretrain_difflm" "${tiny[@]}" --load "$work/tiny2" --metrics-jsonl "$work/resumed2.jsonl" >> "$out/ckpt_resume.log" 2>&1
    note "  2 GPUs + distributed optimizer -> 1 GPU: exit $?; losses (straight vs resumed):"
    paste <(grep -o '"lm_loss":[^,]*' "$work/straight.jsonl" | tail -6) <(grep -o '"lm_loss":[^,]*' "$work/resumed2.jsonl") | tee -a "$summary"
  fi
fi

if has export; then
  rm -rf "$work/big" "$work/big_hf32" "$work/big_hf16"
  "$bin/pretrain_difflm" "${big[@]}" --save "$work/big" --save-interval 3 > "$out/ckpt_export.log" 2>&1
  note "1.7B: 3 steps + save: exit $?; $(grep -o 'successfully saved checkpoint.*' "$out/ckpt_export.log" | tail -1)"
  note "  checkpoint size: $(du -sh "$work/big" | cut -f1)"
  start=$(date +%s)
  "$bin/convert_checkpoint" --to-hf --load "$work/big" --out "$work/big_hf32" >> "$out/ckpt_export.log" 2>&1
  note "  export fp32: exit $? in $(( $(date +%s) - start )) s, $(du -sh "$work/big_hf32" | cut -f1), $(ls "$work/big_hf32" | tr '\n' ' ')"
  start=$(date +%s)
  "$bin/convert_checkpoint" --to-hf --load "$work/big" --out "$work/big_hf16" --dtype bf16 >> "$out/ckpt_export.log" 2>&1
  note "  export bf16: exit $? in $(( $(date +%s) - start )) s, $(du -sh "$work/big_hf16" | cut -f1)"
  start=$(date +%s)
  "$bin/convert_checkpoint" --check "$work/big" >> "$out/ckpt_export.log" 2>&1
  note "  --check (SHA-256 of every file): exit $? in $(( $(date +%s) - start )) s"
fi

if has verify; then
  [ -d "$work/big_hf16" ] || note "verify needs the export section first"
  # bf16 on the GPU, both sides; the export is re-run with --verify on the existing checkpoint.
  "$bin/convert_checkpoint" --to-hf --load "$work/big" --out "$work/big_hf16" --dtype bf16 --verify \
    --verify-device cuda --verify-batch 8 --verify-seq 128 > "$out/ckpt_verify_bf16.log" 2>&1
  note "verify bf16 (CUDA, 8 x 128): exit $?"; grep -E 'verify:|hf_verify.py' "$out/ckpt_verify_bf16.log" | tee -a "$summary"
fi

if has verify32; then
  [ -d "$work/big_hf32" ] || note "verify32 needs the export section first"
  start=$(date +%s)
  timeout 300 "$bin/convert_checkpoint" --to-hf --load "$work/big" --out "$work/big_hf32" --verify \
    --verify-device cpu --hf-device cuda --verify-batch 1 --verify-seq 32 > "$out/ckpt_verify_fp32.log" 2>&1
  note "verify fp32 (megadlm CPU, transformers GPU, 1 x 32): exit $? in $(( $(date +%s) - start )) s"
  grep -E 'verify:|hf_verify.py' "$out/ckpt_verify_fp32.log" | tee -a "$summary"
fi

if has roundtrip; then
  rm -rf "$work/back32" "$work/back16" "$work/again_hf"
  "$bin/convert_checkpoint" --from-hf "$work/big_hf32" --save "$work/back32" > "$out/ckpt_roundtrip.log" 2>&1
  "$bin/convert_checkpoint" --compare "$work/big" "$work/back32" >> "$out/ckpt_roundtrip.log" 2>&1
  note "megadlm -> HF fp32 -> megadlm: exit $? ($(grep '^compare:' "$out/ckpt_roundtrip.log" | tail -1))"
  "$bin/convert_checkpoint" --to-hf --load "$work/back32" --out "$work/again_hf" >> "$out/ckpt_roundtrip.log" 2>&1
  "$bin/convert_checkpoint" --compare "$work/big_hf32" "$work/again_hf" >> "$out/ckpt_roundtrip.log" 2>&1
  note "HF -> megadlm -> HF: exit $? ($(grep '^compare:' "$out/ckpt_roundtrip.log" | tail -1))"
  "$bin/convert_checkpoint" --from-hf "$work/big_hf16" --save "$work/back16" >> "$out/ckpt_roundtrip.log" 2>&1
  "$bin/convert_checkpoint" --compare "$work/big" "$work/back16" --tolerance 0.01 >> "$out/ckpt_roundtrip.log" 2>&1
  note "megadlm -> HF bf16 -> megadlm (tolerance: bf16 rounding): exit $? ($(grep '^compare:' "$out/ckpt_roundtrip.log" | tail -1))"
fi
echo "summary: $summary"
