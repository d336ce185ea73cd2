#!/usr/bin/env bash
# FP8 training speed on one GPU (docs/fp8.md): the MegaDLMs 1.7B architecture
# (configs/megadlms_1.7b.args, mock data), seq 2048, micro-batch 4, global batch 32, ITERS
# iterations (default 8; the first 2 are warm-up and left out of the medians), in bf16, FP8
# hybrid delayed and FP8 hybrid tensorwise, one after another in the same call. Writes
# OUT_DIR/bench_fp8.md and .json: tokens/s, ms per iteration, the ratio to bf16, the peak
# memory the stream-ordered pool reserved (GiB), and the last loss; the run logs beside them.
#
#   scripts/bench_fp8.sh OUT_DIR
# Environment: MEGADLM_BIN (default build/bin), ITERS (default 8), RECIPES (default
# "bf16 delayed tensorwise"), MEGADLM_FLAGS (extra flags for every run).
# About 3 x (start-up + 8 iterations) of device time: well under 5 minutes on an H100/H200.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/bench_fp8.sh OUT_DIR}
bin=${MEGADLM_BIN:-build/bin}
iters=${ITERS:-8}
recipes=${RECIPES:-bf16 delayed tensorwise}
read -r -a extra <<< "${MEGADLM_FLAGS:-}"
mkdir -p "$out"
[ -x "$bin/pretrain_difflm" ] || { echo "bench_fp8.sh: $bin/pretrain_difflm not found (set MEGADLM_BIN)"; exit 2; }
for r in $recipes; do
  case $r in
    bf16) flags=() ;;
    delayed|tensorwise) flags=(--fp8-format hybrid --fp8-recipe "$r") ;;
    *) echo "bench_fp8.sh: unknown recipe $r (bf16, delayed, tensorwise)"; exit 2 ;;
  esac
  rm -f "$out/$r.jsonl"
  "$bin/pretrain_difflm" @configs/megadlms_1.7b.args --mock-data --device cuda \
    --micro-batch-size 4 --global-batch-size 32 --train-iters "$iters" --log-interval 1 --eval-iters 0 \
    --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000 \
    --metrics-jsonl "$out/$r.jsonl" "${flags[@]}" "${extra[@]}" > "$out/$r.log" 2>&1
  echo "$r: exit $? ($SECONDS s)"
done
python3 - "$out" "$recipes" <<'PY'
import json, os, statistics, sys
out, recipes = sys.argv[1], sys.argv[2].split()
GIB = 1024 ** 3
res = {}
for r in recipes:
    p = os.path.join(out, f"{r}.jsonl")
    if not os.path.exists(p):
        continue
    rows = [json.loads(l) for l in open(p) if l.strip()]
    train = [x for x in rows if x.get("kind") == "train" and "tokens_per_s" in x]
    timed = train[2:] or train
    if not timed:
        continue
    res[r] = {"tokens_per_s": statistics.median(x["tokens_per_s"] for x in timed),
              "ms_per_iteration": statistics.median(x["elapsed_ms"] for x in timed),
              "peak_reserved_gib": max(x.get("peak_reserved_gb", 0) for x in train) * 1e9 / GIB,
              "last_loss": train[-1]["lm_loss"], "iterations_timed": len(timed)}
base = res.get("bf16")
for r, m in res.items():
    m["ratio_to_bf16"] = m["tokens_per_s"] / base["tokens_per_s"] if base else None
json.dump(res, open(os.path.join(out, "bench_fp8.json"), "w"), indent=1)
lines = ["# FP8 vs bf16, MegaDLMs 1.7B, seq 2048, micro-batch 4, global batch 32, one GPU", "",
         "| recipe | tokens/s | ms/iteration | ratio to bf16 | peak reserved (GiB) | last loss |",
         "|---|---:|---:|---:|---:|---:|"]
for r in recipes:
    m = res.get(r)
    if not m:
        lines.append(f"| {r} | (failed: see {r}.log) | | | | |")
        continue
    ratio = "%.3f" % m["ratio_to_bf16"] if m["ratio_to_bf16"] else "-"
    name = r if r == "bf16" else f"FP8 hybrid {r}"
    lines.append(f"| {name} | {m['tokens_per_s']:.0f} | {m['ms_per_iteration']:.1f} | {ratio} | "
                 f"{m['peak_reserved_gib']:.1f} | {m['last_loss']:.4f} |")
lines += ["", "Medians over the iterations after the first two (warm-up); memory is the pool's reserved high-water mark."]
open(os.path.join(out, "bench_fp8.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
