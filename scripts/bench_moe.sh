#!/usr/bin/env bash
# Issue 14's benchmark on one GPU: the fine-grained MoE of configs/fine_grained_moe.args
# (12 layers, hidden 2048, 16 heads, 64 experts top-8 of width 768, vocab 50304, seq 2048,
# micro-batch 4, bf16, dropless) on mock data, one log line per iteration, then the MoE ops'
# own rates (megadlm_bench ops: the grouped GEMMs at this shape, routing, permutation), then the
# PyTorch peer (shared/bench/peer_torch_dlm.py, eager, torch._grouped_mm) in the same call when
# PEER points at it. Writes OUT/bench_moe.{json,md}, OUT/moe_ops.jsonl, OUT/peer.json and a
# summary table.
#
#   PEER=path/to/peer_torch_dlm.py scripts/bench_moe.sh OUT_DIR [ITERS] [GLOBAL_BATCH] [extra flags...]
# GLOBAL_BATCH 4 (the default) is one micro-batch per optimizer step, the peer's step.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench_out}; iters=${2:-12}; gbs=${3:-4}; shift $(( $# < 3 ? $# : 3 )) || true
skip=$(( iters > 6 ? 3 : 1 ))
mkdir -p "$out"
bin=${MEGADLM_BIN:-build/bin}
metrics="$out/moe_metrics.jsonl"
rm -f "$metrics" "$out/moe_ops.jsonl" "$out/peer.json"
"$bin/pretrain_difflm" @configs/fine_grained_moe.args --mock-data --device cuda \
  --global-batch-size "$gbs" --train-iters "$iters" --log-interval 1 --eval-iters 0 \
  --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000 \
  --metrics-jsonl "$metrics" "$@" > "$out/moe_train_log.txt" 2>&1
echo "pretrain_difflm exit $?"
tail -n 3 "$out/moe_train_log.txt"
python3 scripts/summarize_metrics.py "$metrics" --skip "$skip" \
  --label "fine-grained MoE (64 experts top-8), 1 GPU, mbs 4, gbs $gbs, seq 2048, bf16" \
  --json "$out/bench_moe.json" --markdown "$out/bench_moe.md"
"$bin/megadlm_bench" ops --op grouped_gemm --out "$out/moe_ops.jsonl" | tail -n 9
"$bin/megadlm_bench" ops --op moe_ --out "$out/moe_ops.jsonl" | tail -n 5
if [ -n "${PEER:-}" ]; then
  PYTHONUNBUFFERED=1 python3 "$PEER" --layers 12 --experts 64 --topk 8 --expert-ffn 768 --compile 0 \
    --params amp --json "$out/peer.json" 2>&1 | tail -n 3
fi
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
m = json.load(open(os.path.join(out, "bench_moe.json")))
print(f"megadlm: {m['tokens_per_s_median']:,.0f} tokens/s, {m['tflops_per_gpu_median']:.1f} TFLOP/s, "
      f"{m['elapsed_ms_median']:.1f} ms/iter, peak {m['peak_mem_gb']:.1f} GB")
p = os.path.join(out, "peer.json")
if os.path.exists(p):
    q = [json.loads(l) for l in open(p) if l.strip()][-1]
    print(f"peer:    {q['tokens_per_s']:,.0f} tokens/s, MFU {100*q['mfu']:.1f}% of {q['cfg']['peak']} TFLOP/s, "
          f"{q['step_ms']:.1f} ms/step, peak {q['max_mem_gb']:.1f} GiB allocated ({q['max_reserved_gb']:.1f} reserved)")
    print(f"speed-up: {m['tokens_per_s_median'] / q['tokens_per_s']:.2f}x tokens/s")
PY
