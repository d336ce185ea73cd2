#!/usr/bin/env bash
# One device call that checks a build on one GPU: the whole gpu_parity suite, the multi-rank GPU
# suite gpu_nccl with 2, 4 and 8 ranks sharing the GPU (scripts/shared_gpu_rank.sh), and
# megadlm against the PyTorch peer at seq 2048 (scripts/bench_vs_peer.sh s2048). Nothing is
# built: BUILD is a carried build folder (bin/ and lib/). Each stage runs under its own limit;
# OUT/summary.txt has one line per stage, OUT/checks.tgz every log (one archive: the device
# returns a limited number of files per call).
#
#   scripts/device_checks.sh BUILD OUT [STAGE ...]     STAGE: parity nccl2 nccl4 nccl8 bench
#                                                      fp8 fp8trunc conv:R1+R2 fp8s8192 bdtrace
# FP8 stages (docs/fp8.md): fp8 the FP8, MoE and SwiGLU parity tests; fp8trunc
# scripts/fp8_truncation_check.sh (every micro-batch cut, then the convergence run's cuts with
# blockwise); conv:R1+R2 scripts/fp8_convergence.sh with those recipes side by side (CONV_N
# iterations, default 2000; CONV_CORPUS a JSONL corpus, default the docs corpus of this machine;
# CONV_MODEL 125m or 1.7b; needs the GPT-2 encoder of scripts/install_deps.sh); fp8s8192
# scripts/bench_fp8.sh at seq 8192 (bf16, delayed, tensorwise; with PEER the peer too).
# bdtrace: one traced iteration each of the 1.7B's full-sequence and block-diffusion (block 32)
# steps at seq 2048, micro-batch 4 (scripts/trace_iteration.sh; the kernel tables say where block
# diffusion's step loses efficiency against the full-sequence one; docs/training_objectives.md).
# Environment: PEER (the PyTorch peer script, for the bench stages), PEER_PARAMS (default "amp bf16").
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: scripts/device_checks.sh BUILD OUT [STAGE ...]}" && pwd)
final=${2:?usage: scripts/device_checks.sh BUILD OUT [STAGE ...]}
shift 2
stages=${*:-parity nccl2 nccl4 nccl8 bench}
work=${WORK_DIR:-/tmp/device_checks}
rm -rf "$work" && mkdir -p "$work" "$final"
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
mpi_flags=(--oversubscribe)
[ "$(id -u)" = 0 ] && mpi_flags+=(--allow-run-as-root)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv > "$work/machine.txt" 2>&1
: > "$work/summary.txt"
for stage in $stages; do
  start=$SECONDS
  case $stage in
    parity)
      # 102 tests took ~230 s on an H100 (2026-12-06): the limit leaves room for a slower card.
      timeout 330 "$build/bin/gpu_parity" > "$work/gpu_parity.log" 2>&1
      rc=$?
      result=$(grep -E "^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]|tests? ran" "$work/gpu_parity.log" | tr '\n' ' ')
      ;;
    nccl[0-9]*)
      n=${stage#nccl}
      timeout 240 mpirun -np "$n" "${mpi_flags[@]}" "$root/scripts/shared_gpu_rank.sh" "$build/bin/gpu_nccl" \
        > "$work/gpu_nccl_np$n.log" 2>&1
      rc=$?
      result=$(grep -E "^\[spmd\] (ran|[0-9]+ rank)|^\[  FAILED  \]" "$work/gpu_nccl_np$n.log" | sort -u | tr '\n' ' ')
      ;;
    bench)
      (cd "$root" && MEGADLM_BIN="$build/bin" PEER_PARAMS="${PEER_PARAMS:-amp bf16}" timeout 330 \
        bash scripts/bench_vs_peer.sh "$work/bench" s2048) > "$work/bench.log" 2>&1
      rc=$?
      result=$(grep -E "^\| seq" "$work/bench/bench_vs_peer.md" 2>/dev/null | tr '\n' ' ')
      ;;
    fp8)
      timeout 150 "$build/bin/gpu_parity" --gtest_filter='Fp8Parity.*:Fp8TrainingParity.*:MoeParity.*:SwigluParity.*' \
        > "$work/gpu_parity_fp8.log" 2>&1
      rc=$?
      result=$(grep -E "^\[  PASSED  \]|^\[  FAILED  \]" "$work/gpu_parity_fp8.log" | tr '\n' ' ')
      ;;
    fp8trunc)
      # Both runs whatever the first gives: a failure there is when the convergence run's cuts matter.
      (cd "$root" && MEGADLM_BIN="$build/bin" timeout 150 bash scripts/fp8_truncation_check.sh "$work/fp8trunc"
        first=$?
        MEGADLM_BIN="$build/bin" RECIPES=blockwise VARILEN=0.01 ITERS=120 timeout 120 \
          bash scripts/fp8_truncation_check.sh "$work/fp8trunc_convergence_cuts" && exit $first) > "$work/fp8trunc.log" 2>&1
      rc=$?
      result=$(grep -E "exit [0-9]+, " "$work/fp8trunc.log" | tr '\n' ' ')
      ;;
    conv:*)
      recipes=${stage#conv:}
      recipes=${recipes//+/ }
      (cd "$root" && MEGADLM_BIN="$build/bin" PARALLEL=1 RECIPES="$recipes" CORPUS="${CONV_CORPUS:-docs}" \
        MODEL="${CONV_MODEL:-125m}" timeout "${CONV_LIMIT:-480}" \
        bash scripts/fp8_convergence.sh "$work/conv" "${CONV_N:-2000}") > "$work/conv_${recipes// /_}.log" 2>&1
      rc=$?
      rm -rf "$work/conv/cache" "$work/conv/corpus"*
      result=$(grep -E "^\| (bf16|delayed|tensorwise|blockwise) \|" "$work/conv/fp8_convergence.md" 2>/dev/null | tr '\n' ' ')
      ;;
    fp8s8192)
      (cd "$root" && MEGADLM_BIN="$build/bin" SEQ=8192 ITERS=5 RECIPES="bf16 delayed tensorwise" \
        timeout 330 bash scripts/bench_fp8.sh "$work/fp8s8192") > "$work/fp8s8192.log" 2>&1
      rc=$?
      result=$(grep -E "^\| (bf16|FP8|peer)" "$work/fp8s8192/bench_fp8.md" 2>/dev/null | tr '\n' ' ')
      ;;
    bdtrace)
      rc=0
      for objective in full bd; do
        extra=()
        [ $objective = bd ] && extra=(--attention-mask-type block_causal --dlm-loss-weight inv_t_eps --dlm-block-size 32)
        (cd "$root" && MEGADLM_BIN="$build/bin" timeout 150 bash scripts/trace_iteration.sh "$work/bdtrace" "$objective" 3 \
          @configs/megadlms_1.7b.args --micro-batch-size 4 --global-batch-size 16 "${extra[@]}") \
          > "$work/bdtrace_$objective.log" 2>&1
        grep -q "GPU operations over" "$work/bdtrace/$objective.gaps.md" 2>/dev/null || rc=1
        rm -f "$work/bdtrace/$objective.trace.jsonl"  # hundreds of MB; the gaps table keeps what matters
      done
      result=$(grep -h -E "GPU operations over" "$work/bdtrace/"*.gaps.md 2>/dev/null | tr '\n' ' ')
      ;;
    *) rc=2; result="unknown stage (parity, nccl2, nccl4, nccl8, bench, fp8, fp8trunc, conv:R1+R2, fp8s8192, bdtrace)" ;;
  esac
  echo "$stage: rc=$rc $((SECONDS - start)) s: $result" | tee -a "$work/summary.txt"
  tar czf "$final/checks.tgz" -C "$work" . 2>/dev/null
  cp "$work/summary.txt" "$final/"
done
