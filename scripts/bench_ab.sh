#!/usr/bin/env bash
# A/B training benchmark of two builds on one GPU (e.g. before and after a refactor that must
# not change speed): alternates the 1.7B training benchmark of scripts/bench_train.sh between
# the two builds ROUNDS times (so clock and thermal drift hit both alike), then writes the
# median tokens/s of each, their ratio and the per-iteration losses of both (which must agree:
# same function, same noise) to OUT_DIR/ab.json and prints a table.
#   scripts/bench_ab.sh OLD_BUILD NEW_BUILD OUT_DIR [ROUNDS] [ITERS] [GLOBAL_BATCH]
# A build folder holds bin/pretrain_difflm and lib/libmegadlm.so.
set -euo pipefail
cd "$(dirname "$0")/.."
old=${1:?old build}; new=${2:?new build}; out=${3:?out dir}
rounds=${4:-2}; iters=${5:-10}; gbs=${6:-64}
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    build=$old; [ "$side" = new ] && build=$new
    LD_LIBRARY_PATH="$PWD/$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" \
      MEGADLM_BIN="$build/bin" bash scripts/bench_train.sh "$out/${side}_$r" "$iters" "$gbs" \
      --eval-iters 0 > "$out/${side}_$r.log" 2>&1 || { echo "$side round $r failed"; tail -5 "$out/${side}_$r.log"; }
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for side in ("old", "new"):
    tps, peak, losses = [], [], None
    for r in range(1, rounds + 1):
        try:
            s = json.load(open(f"{out}/{side}_{r}/bench_train.json"))
        except OSError:
            continue
        tps.append(s["tokens_per_s_median"]); peak.append(s["peak_mem_gb"])
        rows = [json.loads(l) for l in open(f"{out}/{side}_{r}/train_metrics.jsonl") if l.strip()]
        losses = [row["lm_loss"] for row in rows if "elapsed_ms" in row]
    res[side] = {"tokens_per_s": tps, "median_tokens_per_s": statistics.median(tps) if tps else None,
                 "peak_mem_gb": max(peak) if peak else None, "lm_loss": losses}
o, n = res["old"], res["new"]
res["ratio_new_over_old"] = (n["median_tokens_per_s"] / o["median_tokens_per_s"]
                             if o["median_tokens_per_s"] and n["median_tokens_per_s"] else None)
if o["lm_loss"] and n["lm_loss"]:
    res["max_abs_loss_diff"] = max(abs(a - b) for a, b in zip(o["lm_loss"], n["lm_loss"]))
json.dump(res, open(f"{out}/ab.json", "w"), indent=2)
print("| build | tokens/s per round | median | peak GB |")
print("|---|---|---|---|")
for side in ("old", "new"):
    s = res[side]
    print(f"| {side} | {', '.join(f'{t:.0f}' for t in s['tokens_per_s'])} | {s['median_tokens_per_s']} | {s['peak_mem_gb']} |")
print("ratio new/old:", res["ratio_new_over_old"], " max |loss diff|:", res.get("max_abs_loss_diff"))
PY
