#!/usr/bin/env bash
# Everything issue 14 measures on one GPU, for one device call: the GPU parity of the MoE
# kernels and of a whole MoE training step (gpu_parity MoeParity.*), the MoE ops' own rates
# (megadlm_bench ops: the grouped GEMMs at the benchmark's shape, routing, permutation), and the
# fine-grained MoE training benchmark against the PyTorch peer in the same call
# (scripts/bench_moe.sh). Logs go to a work folder packed into OUT/results.tgz after every stage;
# OUT/summary.txt holds the short tables.
#
#   scripts/bench_issue14_device.sh OUT [STAGES...]      STAGES: parity ops train (default: all)
# Environment: MEGADLM_BIN (folder of the binaries; its ../lib holds libmegadlm), PEER (the peer
# script), ITERS (default 12), GBS (default 4: one micro-batch per step, the peer's step; a list
# such as "4 32" runs each).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
final=${1:?usage: scripts/bench_issue14_device.sh OUT [parity] [ops] [train]}
shift
stages=${*:-parity ops train}
bin=$(cd "${MEGADLM_BIN:-$root/build/bin}" && pwd)
mkdir -p "$final"
out=${WORK_DIR:-/tmp/issue14_work}
mkdir -p "$out"
pack() { tar czf "$final/results.tgz" -C "$out" . 2>/dev/null; }
export LD_LIBRARY_PATH="$bin/../lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MEGADLM_BIN=$bin
[ -z "${PEER:-}" ] && [ -f "$root/peer_torch_dlm.py" ] && export PEER=$root/peer_torch_dlm.py
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > "$out/machine.txt" 2>&1
cat "$out/machine.txt"
for stage in $stages; do
  case $stage in
    parity)
      "$bin/gpu_parity" --gtest_filter='MoeParity.*:GemmParity.*' > "$out/parity.log" 2>&1
      echo "parity: exit $? ($SECONDS s)"
      grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran|\[parity moe\]" "$out/parity.log" | head -30
      ;;
    ops)
      rm -f "$out/moe_ops.jsonl"
      for filter in grouped_gemm moe_ gemm_fc1_fwd; do
        "$bin/megadlm_bench" ops --op "$filter" --out "$out/moe_ops.jsonl" > "$out/ops_$filter.log" 2>&1
        echo "ops $filter: exit $? ($SECONDS s)"
      done
      ;;
    train)
      peer=${PEER:-}  # the peer runs once, with the first global batch (its own step is one micro-batch)
      for gbs in ${GBS:-4}; do
        PEER=$peer bash "$root/scripts/bench_moe.sh" "$out/train_gbs$gbs" "${ITERS:-12}" "$gbs" > "$out/train_gbs$gbs.log" 2>&1
        echo "train gbs $gbs: exit $? ($SECONDS s)"
        peer=
        tail -n 4 "$out/train_gbs$gbs.log"
      done
      ;;
    *) echo "unknown stage $stage (parity, ops, train)"; exit 2 ;;
  esac
  pack
done
{
  if [ -f "$out/moe_ops.jsonl" ]; then
    python3 - "$out/moe_ops.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    rate = f"{r['tflops']:7.1f} TF/s" if "tflops" in r else f"{r.get('gbps', float('nan')):7.0f} GB/s"
    print(f"{r['op']:26s} {r['check']:5s} {r['median_ms']:9.4f} ms {rate}  {r['shape']} {r.get('note', '')[:60]}")
PY
  fi
  for f in "$out"/train_gbs*/bench_moe.md; do [ -f "$f" ] && cat "$f"; done
  for f in "$out"/train_gbs*.log; do [ -f "$f" ] && grep -E "^(megadlm|peer|speed-up):" "$f"; done
} | tee "$final/summary.txt"
pack
exit 0
