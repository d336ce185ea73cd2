#!/usr/bin/env bash
# Where one training iteration's GPU time goes: Nsight Compute times every kernel of one
# iteration (--profile brackets it with cudaProfilerStart/Stop), and a plain run
# of the same flags gives the iteration's wall time; scripts/kernel_summary.py tables both.
#
#   scripts/profile_kernels.sh OUT_DIR NAME ITERATION pretrain_difflm-flags...
# Writes OUT_DIR/NAME.ncu.csv, NAME.plain.jsonl, NAME.md (families and top kernels). Environment:
# MEGADLM_BIN (default build/bin), NCU (default ncu). ncu runs with --clock-control none
# (the device's clocks are left alone: /work/.library/device/METHOD.md).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: profile_kernels.sh OUT NAME ITERATION flags...}; name=${2:?}; iteration=${3:?}
shift 3
bin=${MEGADLM_BIN:-build/bin}
ncu=${NCU:-ncu}
mkdir -p "$out"
common=(--mock-data --device cuda --log-interval 1 --eval-iters 0 --lr-warmup-iters 1
        --lr-decay-style cosine --lr-decay-iters 1000)
rm -f "$out/$name.plain.jsonl"
timeout 200 "$bin/pretrain_difflm" "$@" "${common[@]}" --train-iters $((iteration + 2)) \
  --metrics-jsonl "$out/$name.plain.jsonl" > "$out/$name.plain.log" 2>&1
echo "$name plain: exit $? ($SECONDS s)"
wall=$(python3 - "$out/$name.plain.jsonl" "$iteration" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t = [r["elapsed_ms"] for r in rows if r.get("kind", "train") == "train" and "elapsed_ms" in r]
print(statistics.median(t[int(sys.argv[2]) - 1:]) if len(t) >= int(sys.argv[2]) else 0)
PY
)
timeout 300 "$ncu" --profile-from-start off --clock-control none \
  --metrics gpu__time_duration.sum --csv --page raw --print-units base \
  --log-file "$out/$name.ncu.csv" "$bin/pretrain_difflm" "$@" "${common[@]}" \
  --train-iters "$iteration" --profile --profile-step-start $((iteration - 1)) --profile-step-end "$iteration" > "$out/$name.ncu.log" 2>&1
echo "$name ncu: exit $? ($SECONDS s)"
python3 scripts/kernel_summary.py "$out/$name.ncu.csv" --wall-ms "${wall:-0}" --title "$name" \
  --json "$out/$name.kernels.json" > "$out/$name.md"
cat "$out/$name.md" | head -30
