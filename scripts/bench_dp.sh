#!/usr/bin/env bash
# Data-parallel benchmark and parity of the MegaDLMs 1.7B model on 2 GPUs of one host
# (the data-parallel acceptance run). Same per-GPU work in every throughput run (4 micro-batches of
# 4 x 2048 tokens per GPU per iteration):
#   dp1       1 GPU, global batch 16                      (the scaling reference)
#   dp2       2 GPUs, global batch 32, reduction after backward
#   dp2_ovl   2 GPUs, --overlap-grad-reduce
#   dp2_dopt  2 GPUs, --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
# and for parity, dp1_gbs32: 1 GPU with the DP runs' global batch (same samples, same masks):
# its per-iteration losses must match the DP runs' within bf16 tolerance.
# Writes OUT_DIR/bench_dp.json and .md (tokens/s per GPU, scaling efficiency, peak memory).
#   scripts/bench_dp.sh OUT_DIR [ITERS]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench_dp_out}; iters=${2:-8}
mkdir -p "$out"
common=(@configs/megadlms_1.7b.args --mock-data --device cuda --difflm-varilen-prob 0 --log-interval 1
        --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000
        --distributed-timeout-minutes 1)
source "$(dirname "$0")/lib/bench_run.sh"
run() {  # name, ranks, global batch, iterations, extra flags...
  local name=$1 np=$2 gbs=$3 n=$4; shift 4
  bench_run "$name" "$np" --global-batch-size "$gbs" --train-iters "$n" "$@"
}
run dp1 1 16 "$iters"
run dp1_gbs32 1 32 4
run dp2 2 32 "$iters"
run dp2_ovl 2 32 "$iters" --overlap-grad-reduce
run dp2_dopt 2 32 "$iters" --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
python3 - "$out" <<'PY'
import json, statistics, sys, os
out = sys.argv[1]
def rows(name):
    p = os.path.join(out, name + ".jsonl")
    r = [json.loads(l) for l in open(p)] if os.path.exists(p) else []
    return [x for x in r if x.get("kind", "train") == "train" and "elapsed_ms" in x]  # docs/metrics.md
res, ref = {}, rows("dp1_gbs32")
for name in ["dp1", "dp2", "dp2_ovl", "dp2_dopt"]:
    r = rows(name)
    if len(r) < 3: res[name] = {"error": "no metrics"}; continue
    steady = r[2:]
    world = 1 if name == "dp1" else 2
    tps = statistics.median(x["tokens_per_s"] for x in steady) / world
    res[name] = {"tokens_per_s_per_gpu": tps,
                 "tflops_per_gpu": statistics.median(x["tflops_per_gpu"] for x in steady),
                 "mfu": statistics.median(x["mfu"] for x in steady),
                 "ms_per_iteration": statistics.median(x["elapsed_ms"] for x in steady),
                 "peak_mem_gb_rank0": max(x["peak_mem_gb"] for x in r)}
    if name != "dp1" and ref:
        d = [abs(a["lm_loss"] - b["lm_loss"]) / b["lm_loss"] for a, b in zip(r, ref)]
        res[name]["max_rel_loss_diff_vs_1gpu_first4"] = max(d)
base = res.get("dp1", {}).get("tokens_per_s_per_gpu")
for name, v in res.items():
    if base and "tokens_per_s_per_gpu" in v: v["scaling_efficiency"] = v["tokens_per_s_per_gpu"] / base
json.dump(res, open(os.path.join(out, "bench_dp.json"), "w"), indent=2)
lines = ["| run | tokens/s per GPU | TFLOP/s per GPU | MFU | scaling | peak mem rank 0 (GB) | max rel. loss diff vs 1 GPU |",
         "|---|---|---|---|---|---|---|"]
for name, v in res.items():
    if "error" in v: lines.append(f"| {name} | {v['error']} |"); continue
    lines.append(f"| {name} | {v['tokens_per_s_per_gpu']:.0f} | {v['tflops_per_gpu']:.1f} | {100*v['mfu']:.1f}% | "
                 f"{100*v.get('scaling_efficiency', 1):.1f}% | {v['peak_mem_gb_rank0']:.1f} | "
                 f"{v.get('max_rel_loss_diff_vs_1gpu_first4', 0):.2e} |")
open(os.path.join(out, "bench_dp.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
