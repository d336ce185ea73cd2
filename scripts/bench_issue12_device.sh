#!/usr/bin/env bash
# Everything the speed work against the PyTorch peer measures, for one device call: the GPU parity
# tests of the new kernels
# (cuDNN attention, deterministic backward, fused ops), the op benchmarks (both attention
# backends, the fused ops next to the sequences they replace) and the training benchmark against
# the PyTorch peer (scripts/bench_vs_peer.sh). Logs and results go to OUT; a short table last.
#
#   scripts/bench_issue12_device.sh OUT [STAGES...]     STAGES: ops parity train (default: all)
# The logs are written to a work folder and packed into OUT/results.tgz after every stage (a
# device call returns few files, and a stage cut off by the call's time limit keeps the earlier
# stages' results); OUT/summary.txt holds the short tables.
# Environment: MEGADLM_BIN (folder of the binaries; its ../lib holds libmegadlm), PEER, SHAPES,
# PEER_SHAPES, ITERS, PEER_STEPS, DEADLINE_S (passed to bench_vs_peer.sh).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: scripts/bench_issue12_device.sh OUT [parity] [ops] [train]}
shift
stages=${*:-ops parity train}
bin=$(cd "${MEGADLM_BIN:-$root/build/bin}" && pwd)
final=$out
mkdir -p "$final"
out=${WORK_DIR:-/tmp/issue12_work}
mkdir -p "$out"
pack() { tar czf "$final/results.tgz" -C "$out" . 2>/dev/null; }
export LD_LIBRARY_PATH="$bin/../lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MEGADLM_BIN=$bin
[ -z "${PEER:-}" ] && [ -f "$root/peer_torch_dlm.py" ] && export PEER=$root/peer_torch_dlm.py
mkdir -p "$out"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  ldd "$bin/../lib/libmegadlm.so" | grep -E "cudnn|cublas|nccl|cudart"
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

for stage in $stages; do
  case $stage in
    parity)
      # cuDNN reports why a graph is refused on stderr (its own logging switch, read by cuDNN only).
      CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr "$bin/gpu_parity" \
        --gtest_filter='AttentionParity.Cudnn*:AttentionParity.Auto*:AttentionParity.Deterministic*:FusedParity.*:AttentionParity.FlashAndSimpleMatchCpuOnShortSequences:AttentionParity.PackedDocumentsOnFlashAndSimpleMatchCpu' \
        > "$out/parity.log" 2>&1
      echo "parity: exit $? ($SECONDS s)"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran" "$out/parity.log" | head -20
      ;;
    ops)
      rm -f "$out/bench_ops.jsonl"
      for filter in attention lm_head add_rms_norm rms_norm_bwd_add qk_ swiglu_bwd_recompute adamw; do
        "$bin/megadlm_bench" ops --op "$filter" --out "$out/bench_ops.jsonl" > "$out/bench_ops_$filter.log" 2>&1
        echo "ops $filter: exit $? ($SECONDS s)"
      done
      ;;
    train)
      bash "$root/scripts/bench_vs_peer.sh" "$out/peer" "${SHAPES:-s2048,s8192,gqa4}"
      ;;
    *) echo "unknown stage $stage (parity, ops, train)"; exit 2 ;;
  esac
  pack
done

# Short table: op rows and the training comparison.
{
if [ -f "$out/bench_ops.jsonl" ]; then
  python3 - "$out/bench_ops.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    rate = f"{r['tflops']:7.1f} TF/s" if "tflops" in r else f"{r.get('gbps', float('nan')):7.0f} GB/s"
    print(f"{r['op']:30s} {r['check']:5s} {r['median_ms']:9.4f} ms {rate} {r.get('note', '')[:60]}")
PY
fi
[ -f "$out/peer/bench_vs_peer.md" ] && cat "$out/peer/bench_vs_peer.md"
} | tee "$final/summary.txt"
pack
exit 0
