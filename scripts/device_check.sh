#!/usr/bin/env bash
# Runs the GPU ring on a machine with a GPU, from a carried build folder (no compiling there):
# the CUDA-vs-CPU parity suite, the ops benchmark and, when pretrain_difflm is present, a CUDA
# smoke run of the tiny model and the 1.7B training benchmark. Results go to OUT_DIR.
#   scripts/device_check.sh BUILD_DIR OUT_DIR [parity|bench|comm|train|bench_train|converge|dp|all]...
# `comm` needs 2 GPUs and mpirun: the NCCL suite (gpu_nccl) and the collective bandwidth benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?build dir}; out=${2:?out dir}; shift 2
what=${*:-all}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
has() { [[ " $what " == *" $1 "* || " $what " == *" all "* ]]; }
if has parity; then
  "$build/bin/gpu_parity" --gtest_output=xml:"$out/gpu_parity.xml" > "$out/gpu_parity.log" 2>&1
  echo "gpu_parity exit $?"; grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/gpu_parity.log" | head -40
fi
if has bench; then
  "$build/bin/megadlm_bench" ops --out "$out/bench_ops.jsonl" > "$out/bench_ops.log" 2>&1
  echo "megadlm_bench exit $?"; tail -40 "$out/bench_ops.log"
fi
if has comm; then
  mpirun_flags=()
  [ "$(id -u)" = 0 ] && mpirun_flags+=(--allow-run-as-root)
  mpirun -np 2 "${mpirun_flags[@]}" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$build/bin/gpu_nccl" \
    --gtest_output=xml:"$out/gpu_nccl.xml" > "$out/gpu_nccl.log" 2>&1
  echo "gpu_nccl exit $?"; grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[spmd\]' "$out/gpu_nccl.log" | head -40
  mpirun -np 2 "${mpirun_flags[@]}" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE "$build/bin/megadlm_bench" comm \
    --out "$out/bench_comm.jsonl" > "$out/bench_comm.log" 2>&1
  echo "megadlm_bench comm exit $?"; tail -10 "$out/bench_comm.log"
fi
if has train && [ -x "$build/bin/pretrain_difflm" ]; then
  "$build/bin/pretrain_difflm" @configs/tiny_dlm.args --device cuda --train-iters 50 \
    --metrics-jsonl "$out/tiny_cuda.jsonl" > "$out/tiny_cuda.log" 2>&1
  echo "tiny cuda exit $?"; tail -3 "$out/tiny_cuda.log"
fi
if has bench_train && [ -x "$build/bin/pretrain_difflm" ]; then
  MEGADLM_BIN="$build/bin" bash scripts/bench_train.sh "$out/train_gbs64" 10 64 > "$out/bench_train_gbs64.log" 2>&1
  echo "bench_train gbs 64 exit $?"; tail -4 "$out/bench_train_gbs64.log"
  MEGADLM_BIN="$build/bin" bash scripts/bench_train.sh "$out/train_gbs256" 4 256 > "$out/bench_train_gbs256.log" 2>&1
  echo "bench_train gbs 256 exit $?"; tail -4 "$out/bench_train_gbs256.log"
fi
if has converge && [ -x "$build/bin/pretrain_difflm" ]; then
  # The 1.7B model learning mock data: short warm-up so 40 iterations show the loss falling.
  "$build/bin/pretrain_difflm" @configs/megadlms_1.7b.args --mock-data --device cuda \
    --global-batch-size 16 --train-iters 40 --lr-warmup-iters 5 --lr-decay-style cosine \
    --lr-decay-iters 40 --log-interval 5 --metrics-jsonl "$out/converge_1.7b.jsonl" \
    > "$out/converge_1.7b.log" 2>&1
  echo "converge exit $?"; grep -o 'iteration .*lm loss: [^|]*' "$out/converge_1.7b.log" | cut -c1-60,150-
fi
if has dp && [ -x "$build/bin/pretrain_difflm" ]; then
  MEGADLM_BIN="$build/bin" bash scripts/bench_dp.sh "$out/dp" 8 > "$out/bench_dp.log" 2>&1
  echo "bench_dp exit $?"; tail -8 "$out/bench_dp.log"
fi
