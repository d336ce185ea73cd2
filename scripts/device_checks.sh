#!/usr/bin/env bash
# One device call that checks a build on one GPU: the whole gpu_parity suite, the multi-rank GPU
# suite gpu_nccl with 2, 4 and 8 ranks sharing the GPU (scripts/shared_gpu_rank.sh), and
# megadlm against the PyTorch peer at seq 2048 (scripts/bench_vs_peer.sh s2048). Nothing is
# built: BUILD is a carried build folder (bin/ and lib/). Each stage runs under its own limit;
# OUT/summary.txt has one line per stage, OUT/checks.tgz every log.
#
#   scripts/device_checks.sh BUILD OUT [STAGE ...]     STAGE: parity nccl2 nccl4 nccl8 bench
# Environment: PEER (the PyTorch peer script, for the bench stage), PEER_PARAMS (default "amp bf16").
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
    *) rc=2; result="unknown stage (parity, nccl2, nccl4, nccl8, bench)" ;;
  esac
  echo "$stage: rc=$rc $((SECONDS - start)) s: $result" | tee -a "$work/summary.txt"
  tar czf "$final/checks.tgz" -C "$work" . 2>/dev/null
  cp "$work/summary.txt" "$final/"
done
