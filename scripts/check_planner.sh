#!/usr/bin/env bash
# The memory planner against the GPU (docs/planner.md): pretrain_difflm trains the
# MegaDLMs 1.7B model for a few iterations per configuration on one GPU, and the logged
# prediction (metrics row `predicted_peak_gb`, the planner's peak for the rank) is compared with
# the stream-ordered pool's measured peaks: in use (`peak_mem_gb`) and reserved from the driver
# (`peak_reserved_gb`, what the GPU actually gave up). A configuration passes when its reserved
# peak is within 10 % of the prediction. Writes OUT_DIR/check_planner.md and .json; exit 1 when
# any configuration misses (or fails to run).
#
#   scripts/check_planner.sh OUT_DIR [ITERS] [extra pretrain_difflm flags...]
#   MEGADLM_BIN=build-cuda/bin scripts/check_planner.sh out 3
# PLANNER_MICRO_BATCHES (default 2): micro-batches per iteration (1 halves the run time; the
# peak of a layout without pipelining does not depend on it). PLANNER_TIMEOUT (default 120):
# seconds per configuration.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-planner_out}; iters=${2:-3}; shift $(( $# < 2 ? $# : 2 )) || true
bin=${MEGADLM_BIN:-build/bin}
mkdir -p "$out"
common=(@configs/megadlms_1.7b.args --mock-data --device cuda --train-iters "$iters" --log-interval 1
        --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000 --eval-iters 0 "$@")
seq_flags() { echo "--seq-length $1 --max-position-embeddings $1"; }
recompute="--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"

m=${PLANNER_MICRO_BATCHES:-2}; limit=${PLANNER_TIMEOUT:-120}
mb() { echo "--micro-batch-size $1 --global-batch-size $(( $1 * m ))"; }
# name | flags (by default two micro-batches per iteration, so accumulation is part of the run)
configs=(
  "seq2k_mbs4|$(mb 4)"
  "seq2k_mbs1|$(mb 1)"
  "seq2k_mbs4_recompute|$(mb 4) $recompute"
  "seq8k_mbs1|$(mb 1) $(seq_flags 8192)"
  "seq32k_mbs1|$(mb 1) $(seq_flags 32768)"
  "seq32k_mbs1_recompute|$(mb 1) $(seq_flags 32768) $recompute"
  "seq2k_mbs4_gqa4|$(mb 4) --group-query-attention --num-query-groups 4"
  "seq2k_mbs4_fsdp|$(mb 4) --use-megatron-fsdp"
)

status=0
for entry in "${configs[@]}"; do
  name=${entry%%|*}; flags=${entry#*|}
  metrics="$out/$name.jsonl"
  rm -f "$metrics"
  # shellcheck disable=SC2086
  t0=$(date +%s)
  timeout "$limit" "$bin/pretrain_difflm" "${common[@]}" $flags --metrics-jsonl "$metrics" > "$out/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - t0 )) s; $(grep -m1 '> peak memory by step' "$out/$name.log")"
  [ $rc -eq 0 ] || status=1
done

python3 - "$out" "${configs[@]}" <<'EOF' || status=1
import json, os, sys
out, entries = sys.argv[1], sys.argv[2:]
rows, bad = [], False
for e in entries:
    name, flags = e.split("|", 1)
    path = os.path.join(out, name + ".jsonl")
    its = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    its = [r for r in its if "lm_loss" in r and "predicted_peak_gb" in r]
    if not its:
        rows.append(dict(config=name, flags=flags, error="no metrics (see the log)")); bad = True; continue
    pred = its[0]["predicted_peak_gb"]
    used = max(r["peak_mem_gb"] for r in its)
    reserved = max(r.get("peak_reserved_gb", 0) for r in its)
    ratio = reserved / pred if pred > 0 else float("inf")
    ok = abs(ratio - 1) <= 0.10
    bad |= not ok
    rows.append(dict(config=name, flags=flags, predicted_gb=pred, used_gb=used, reserved_gb=reserved,
                     reserved_over_predicted=ratio, used_over_predicted=used / pred, within_10pct=ok))
json.dump(rows, open(os.path.join(out, "check_planner.json"), "w"), indent=2)
lines = ["| config | predicted (GB) | measured in use (GB) | reserved (GB) | reserved / predicted | within 10 % |",
         "|---|---|---|---|---|---|"]
for r in rows:
    if "error" in r:
        lines.append(f"| {r['config']} | {r['error']} | | | | no |"); continue
    lines.append(f"| {r['config']} | {r['predicted_gb']:.2f} | {r['used_gb']:.2f} | {r['reserved_gb']:.2f} | "
                 f"{r['reserved_over_predicted']:.3f} | {'yes' if r['within_10pct'] else 'NO'} |")
open(os.path.join(out, "check_planner.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(1 if bad else 0)
EOF
exit $status
