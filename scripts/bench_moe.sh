#!/usr/bin/env bash
# The MoE benchmark on one GPU: the fine-grained MoE of configs/fine_grained_moe.args
# (12 layers, hidden 2048, 16 heads, 64 experts top-8 of width 768, vocab 50304, seq 2048,
# micro-batch 4, bf16, dropless) on mock data, one log line per iteration, then the PyTorch peer
# (peer_torch_dlm.py, eager, torch._grouped_mm) in the same call when PEER points at it.
# Writes OUT/moe_metrics.jsonl, OUT/moe_train_log.txt, OUT/peer.json, OUT/peer.log, and through
# scripts/moe_bench_report.py OUT/bench_moe.{json,md} (tokens/s of both, the ratio, TFLOP/s,
# peak memory of both, and the grouped GEMM rows of OUT/moe_ops.jsonl if megadlm_bench wrote it).
#
#   PEER=path/to/peer_torch_dlm.py scripts/bench_moe.sh OUT_DIR [ITERS] [GLOBAL_BATCH] [extra flags...]
# GLOBAL_BATCH (default: MBS) of MBS, one micro-batch per optimizer step by default: the peer's step.
# Environment: MBS (micro-batch size of both sides, default 4 as in the config; on an 80 GB H100 the
# peer needs MBS 2), MEGADLM_BIN (default build/bin), PEER_STEPS (timed peer steps, default 8),
# PEER_WARMUP (default 3), FORCE_BALANCE (default 1: both sides route by random logits,
# --moe-router-force-load-balancing and the peer's --force-balance 1, so both run the same
# expert load, about T·k/E rows an expert; 0: learned routing, which collapses at initialisation).
# The two token sources differ (megadlm's mock dataset, the peer's uniform random ids); under
# forced balance the routing does not depend on them. megadlm runs with --difflm-varilen-prob 0:
# no micro-batch truncated, as on the peer's side.
set -uo pipefail
cd "$(dirname "$0")/.."
mbs=${MBS:-4}
out=${1:-bench_out}; iters=${2:-20}; gbs=${3:-$mbs}; shift $(( $# < 3 ? $# : 3 )) || true
mkdir -p "$out"
bin=${MEGADLM_BIN:-build/bin}
force=${FORCE_BALANCE:-1}
balance_flags=(); [ "$force" = 1 ] && balance_flags=(--moe-router-force-load-balancing)
rm -f "$out/moe_metrics.jsonl" "$out/peer.json"
timeout 150 "$bin/pretrain_difflm" @configs/fine_grained_moe.args --mock-data --device cuda --difflm-varilen-prob 0 \
  --micro-batch-size "$mbs" --global-batch-size "$gbs" --train-iters "$iters" --log-interval 1 --eval-iters 0 \
  --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000 \
  --metrics-jsonl "$out/moe_metrics.jsonl" "${balance_flags[@]}" "$@" > "$out/moe_train_log.txt" 2>&1
echo "pretrain_difflm exit $? ($SECONDS s)"
tail -n 2 "$out/moe_train_log.txt"
if [ -n "${PEER:-}" ]; then
  # The issue's peer command; fewer timed steps than its default 20 (the same computation).
  PYTHONUNBUFFERED=1 timeout 180 python3 "$PEER" --layers 12 --experts 64 --topk 8 --expert-ffn 768 --compile 0 --mbs "$mbs" \
    --force-balance "$force" --params amp --steps "${PEER_STEPS:-8}" --warmup "${PEER_WARMUP:-3}" --json "$out/peer.json" > "$out/peer.log" 2>&1
  echo "peer exit $? ($SECONDS s)"
  tail -n 2 "$out/peer.log"
fi
python3 scripts/moe_bench_report.py "$out" --mbs "$mbs" --skip $(( iters >= 20 ? 6 : iters > 10 ? 4 : 1 ))
