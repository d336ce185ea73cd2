#!/usr/bin/env bash
# Pipeline-parallel benchmark and parity of the MegaDLMs 1.7B model on 2 GPUs of one host
# (the pipeline acceptance run):
#   pp1        1 GPU, global batch 16 (M = 4 micro-batches of 4 x 2048 tokens)
#   pp2        2 stages (14 layers each), global batch 16: same samples and masks as pp1
#   pp2_m8     2 stages, global batch 32 (M = 8): a smaller bubble
#   pp2_v2     2 stages x 2 virtual stages (7 layers per chunk), global batch 16
# Bubble: the ideal time of a stage is pp1's time x (its share of the work) / (pp1's batch /
# this run's batch); measured bubble = time / ideal - 1, against Megatron's (P-1)/(M*V).
# Peak memory per stage from the runs' "peak_mem_gb_per_stage".
#   scripts/bench_pp.sh OUT_DIR [ITERS]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench_pp_out}; iters=${2:-6}
mkdir -p "$out"
common=(@configs/megadlms_1.7b.args --mock-data --device cuda --difflm-varilen-prob 0 --log-interval 1
        --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000
        --distributed-timeout-minutes 1 --train-iters "$iters")
source "$(dirname "$0")/lib/bench_run.sh"
run() {  # name, ranks, global batch, extra flags...
  local name=$1 np=$2 gbs=$3; shift 3
  bench_run "$name" "$np" --global-batch-size "$gbs" "$@"
}
run pp1 1 16
run pp2 2 16 --pipeline-model-parallel-size 2
run pp2_m8 2 32 --pipeline-model-parallel-size 2
run pp2_v2 2 16 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 7
python3 - "$out" <<'PY'
import json, statistics, sys, os
out = sys.argv[1]
def rows(name):
    p = os.path.join(out, name + ".jsonl")
    r = [json.loads(l) for l in open(p)] if os.path.exists(p) else []
    return [x for x in r if x.get("kind", "train") == "train" and "elapsed_ms" in x], next((x["peak_mem_gb_per_stage"] for x in r if "peak_mem_gb_per_stage" in x), None)
ref, _ = rows("pp1")
t1 = statistics.median(x["elapsed_ms"] for x in ref[2:]) if len(ref) > 2 else None
res = {}
for name, world, m, v in [("pp1", 1, 4, 1), ("pp2", 2, 4, 1), ("pp2_m8", 2, 8, 1), ("pp2_v2", 2, 4, 2)]:
    r, mem = rows(name)
    if len(r) < 3: res[name] = {"error": "no metrics"}; continue
    steady = r[2:]
    ms = statistics.median(x["elapsed_ms"] for x in steady)
    v_ = {"ms_per_iteration": ms,
          "tokens_per_s_per_gpu": statistics.median(x["tokens_per_s"] for x in steady) / world,
          "tflops_per_gpu": statistics.median(x["tflops_per_gpu"] for x in steady),
          "mfu": statistics.median(x["mfu"] for x in steady),
          "peak_mem_gb_per_stage": mem or [max(x["peak_mem_gb"] for x in r)]}
    if world > 1 and t1:
        ideal = t1 * (m / 4) / world   # the same work spread evenly over the stages
        v_["bubble_measured"] = ms / ideal - 1
        v_["bubble_estimate"] = (world - 1) / (m * v)
    if name in ("pp2", "pp2_v2") and ref:
        v_["max_rel_loss_diff_vs_1gpu"] = max(abs(a["lm_loss"] - b["lm_loss"]) / b["lm_loss"] for a, b in zip(r, ref))
        v_["max_rel_grad_norm_diff_vs_1gpu"] = max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(r, ref))
    res[name] = v_
json.dump(res, open(os.path.join(out, "bench_pp.json"), "w"), indent=2)
lines = ["| run | ms/iter | tokens/s per GPU | MFU | bubble measured / estimate | peak mem per stage (GB) | max rel. loss / grad-norm diff vs 1 GPU |",
         "|---|---|---|---|---|---|---|"]
for n, v in res.items():
    if "error" in v: lines.append(f"| {n} | {v['error']} |"); continue
    b = f"{v['bubble_measured']:.3f} / {v['bubble_estimate']:.3f}" if "bubble_measured" in v else "-"
    d = f"{v['max_rel_loss_diff_vs_1gpu']:.2e} / {v['max_rel_grad_norm_diff_vs_1gpu']:.2e}" if "max_rel_loss_diff_vs_1gpu" in v else "-"
    lines.append(f"| {n} | {v['ms_per_iteration']:.0f} | {v['tokens_per_s_per_gpu']:.0f} | {100*v['mfu']:.1f}% | {b} | "
                 f"{', '.join(f'{g:.1f}' for g in v['peak_mem_gb_per_stage'])} | {d} |")
open(os.path.join(out, "bench_pp.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
