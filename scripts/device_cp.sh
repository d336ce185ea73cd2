#!/usr/bin/env bash
# Everything context parallelism needs proven on a GPU, from a carried build folder
# (bin/ and lib/; nothing is compiled here), in about a minute of GPU time:
#   parity  (1 GPU)  gpu_parity: the CUDA attention calls CP makes (ring blocks with chunk maps,
#                    key documents, causal by global position, empty rows; the all-gather block
#                    with kv_seq = S; the own block on the flash/cuDNN entry), the LSE merge
#                    kernel, a ring of 4 shards on one GPU, gather_rows, dropout chunk maps
#   bench   (1 GPU)  megadlm_bench ops --op attention_merge (the merge's bandwidth)
#   nccl    (2 GPUs) mpirun -np 2 gpu_nccl ContextParallelNccl.*: every comm type over NCCL, the
#                    p2p ring's transfers on the side stream (double-buffered), against the CPU
#   train   (2 GPUs) pretrain_difflm, tiny model, 20 iterations on CUDA: CP 2 (p2p, a2a) on two
#                    GPUs against CP 1 on one; bf16, so the bound is loose (2e-2 relative)
# Stages needing 2 GPUs are skipped (and say so) on a 1-GPU machine.
#   scripts/device_cp.sh BUILD OUT [parity] [bench] [nccl] [train]      (default: all four)
# Results: OUT/*.log, OUT/*.xml, OUT/*.jsonl and OUT/summary.txt (one line per stage).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: scripts/device_cp.sh BUILD OUT [parity bench nccl train]}
out=${2:?usage: scripts/device_cp.sh BUILD OUT [parity bench nccl train]}
shift 2
what=" ${*:-parity bench nccl train} "
mkdir -p "$out"
build=$(cd "$build" && pwd) || exit 2  # relative to the repository root, or absolute
bin=$build/bin
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
summary=$out/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
# counts LOG: "N ok, N failed, N skipped" from gtest's per-test lines (those that end in "ms)").
counts() {
  echo "$(grep -cE '^\[       OK \].* ms\)' "$1") ok, $(grep -cE '^\[  FAILED  \].* ms\)' "$1") failed, $(grep -cE '^\[  SKIPPED \].* ms\)' "$1") skipped"
}
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
note "device_cp: $gpus GPU(s), build $build"
mpirun_flags=(-np 2 -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE)
[ "$(id -u)" = 0 ] && mpirun_flags+=(--allow-run-as-root)
two_gpus() { [ "$gpus" -ge 2 ] && command -v mpirun > /dev/null; }

if [[ $what == *" parity "* ]]; then
  t0=$SECONDS
  "$bin/gpu_parity" --gtest_filter='ContextParallelParity.*:DropoutParity.ContextParallelChunkMapsMatchCpuBitForBit' \
    --gtest_output=xml:"$out/gpu_parity_cp.xml" > "$out/gpu_parity_cp.log" 2>&1
  rc=$?
  note "parity: exit $rc ($((SECONDS - t0)) s): $(counts "$out/gpu_parity_cp.log")"
  grep -E '^\[  FAILED  \] [A-Z]|^\[cp parity\].*(e-01|e\+)' "$out/gpu_parity_cp.log" | head -20
fi

if [[ $what == *" bench "* ]]; then
  t0=$SECONDS
  "$bin/megadlm_bench" ops --op attention_merge --out "$out/bench_cp.jsonl" > "$out/bench_cp.log" 2>&1
  note "bench attention_merge: exit $? ($((SECONDS - t0)) s)"
  tail -3 "$out/bench_cp.log" | tee -a "$summary"
fi

if [[ $what == *" nccl "* ]]; then
  if two_gpus; then
    t0=$SECONDS
    timeout 120 mpirun "${mpirun_flags[@]}" "$bin/gpu_nccl" --gtest_filter='ContextParallelNccl.*' \
      --gtest_output=xml:"$out/gpu_nccl_cp.xml" > "$out/gpu_nccl_cp.log" 2>&1
    rc=$?
    note "nccl: exit $rc ($((SECONDS - t0)) s): $(counts "$out/gpu_nccl_cp.log")"
    grep -E '^\[  FAILED  \] [A-Z]|^\[spmd\]' "$out/gpu_nccl_cp.log" | head -20
  else
    note "nccl: skipped (needs 2 GPUs and mpirun; $gpus GPU(s))"
  fi
fi

# metrics FILE: "iteration lm_loss grad_norm" per training row of a --metrics-jsonl file.
metrics() {
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    if "lm_loss" in row and "grad_norm" in row:
        print(row["iteration"], repr(row["lm_loss"]), repr(row["grad_norm"]))
PY
}

if [[ $what == *" train "* ]]; then
  if two_gpus && [ -x "$bin/pretrain_difflm" ]; then
    common=(@configs/tiny_dlm.args --device cuda --train-iters 20 --lr-warmup-iters 2 --eval-iters 0
            --log-interval 1 --attention-dropout 0.1 --hidden-dropout 0.1)
    t0=$SECONDS
    CUDA_VISIBLE_DEVICES=0 "$bin/pretrain_difflm" "${common[@]}" --metrics-jsonl "$out/train_cp1.jsonl" \
      > "$out/train_cp1.log" 2>&1
    note "train cp1 (1 GPU): exit $? ($((SECONDS - t0)) s)"
    metrics "$out/train_cp1.jsonl" > "$out/train_cp1.txt" 2>/dev/null
    for comm in p2p a2a; do
      t0=$SECONDS
      timeout 180 mpirun "${mpirun_flags[@]}" "$bin/pretrain_difflm" "${common[@]}" --context-parallel-size 2 \
        --cp-comm-type "$comm" --metrics-jsonl "$out/train_cp2_$comm.jsonl" > "$out/train_cp2_$comm.log" 2>&1
      rc=$?
      metrics "$out/train_cp2_$comm.jsonl" > "$out/train_cp2_$comm.txt" 2>/dev/null
      verdict=$(python3 - "$out/train_cp1.txt" "$out/train_cp2_$comm.txt" <<'PY'
import sys
ref = [l.split() for l in open(sys.argv[1])]
got = [l.split() for l in open(sys.argv[2])]
if not ref or len(got) != len(ref):
    print(f"FAIL: {len(got)} iterations, {len(ref)} at cp 1"); sys.exit()
loss = max(abs(float(g[1]) - float(r[1])) / abs(float(r[1])) for r, g in zip(ref, got))
norm = max(abs(float(g[2]) - float(r[2])) / abs(float(r[2])) for r, g in zip(ref, got))
print(("PASS" if loss < 2e-2 and norm < 2e-2 else "FAIL") +
      f": {len(got)} iterations, largest relative difference lm loss {loss:.2e}, grad norm {norm:.2e}"
      f" (final loss {float(got[-1][1]):.4f} vs {float(ref[-1][1]):.4f})")
PY
)
      note "train cp2 $comm (2 GPUs) vs cp1: exit $rc ($((SECONDS - t0)) s): $verdict"
      [ $rc -ne 0 ] && tail -15 "$out/train_cp2_$comm.log"
    done
  else
    note "train: skipped (needs 2 GPUs, mpirun and pretrain_difflm; $gpus GPU(s))"
  fi
fi
echo "---- summary"; cat "$summary"
