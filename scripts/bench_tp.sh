#!/usr/bin/env bash
# Tensor-parallel benchmark and parity of the MegaDLMs 1.7B model on 2 GPUs of one host
# (the tensor-parallel acceptance run). Global batch 16 (4 micro-batches of 4 x 2048 tokens):
#   tp1       1 GPU                                   (reference, same samples and masks)
#   tp2       2 GPUs, --tensor-model-parallel-size 2
#   tp2_sp    2 GPUs, --tensor-model-parallel-size 2 --sequence-parallel
#   tp2_sp_overlap  the same with --tp-comm-overlap (SP collectives overlapped with the GEMMs)
# Reports tokens/s per GPU, MFU and peak memory (compare with bench_dp.sh's DP=2 at the same
# per-GPU batch), and the largest relative loss difference against one GPU over the iterations.
#   scripts/bench_tp.sh OUT_DIR [ITERS]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench_tp_out}; iters=${2:-6}
mkdir -p "$out"
common=(@configs/megadlms_1.7b.args --mock-data --device cuda --difflm-varilen-prob 0 --log-interval 1
        --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000
        --distributed-timeout-minutes 1 --global-batch-size 16 --train-iters "$iters")
source "$(dirname "$0")/lib/bench_run.sh"
run() { bench_run "$@"; }
run tp1 1
run tp2 2 --tensor-model-parallel-size 2
run tp2_sp 2 --tensor-model-parallel-size 2 --sequence-parallel
run tp2_sp_overlap 2 --tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap
python3 - "$out" <<'PY'
import json, statistics, sys, os
out = sys.argv[1]
def rows(name):
    p = os.path.join(out, name + ".jsonl")
    r = [json.loads(l) for l in open(p)] if os.path.exists(p) else []
    return [x for x in r if x.get("kind", "train") == "train" and "elapsed_ms" in x]  # docs/metrics.md
ref, res = rows("tp1"), {}
for name, world in [("tp1", 1), ("tp2", 2), ("tp2_sp", 2), ("tp2_sp_overlap", 2)]:
    r = rows(name)
    if len(r) < 3: res[name] = {"error": "no metrics"}; continue
    steady = r[2:]
    res[name] = {"tokens_per_s_per_gpu": statistics.median(x["tokens_per_s"] for x in steady) / world,
                 "tflops_per_gpu": statistics.median(x["tflops_per_gpu"] for x in steady),
                 "mfu": statistics.median(x["mfu"] for x in steady),
                 "peak_mem_gb_rank0": max(x["peak_mem_gb"] for x in r),
                 "max_rel_loss_diff_vs_1gpu": max(abs(a["lm_loss"] - b["lm_loss"]) / b["lm_loss"] for a, b in zip(r, ref)),
                 "max_rel_grad_norm_diff_vs_1gpu": max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(r, ref))}
json.dump(res, open(os.path.join(out, "bench_tp.json"), "w"), indent=2)
lines = ["| run | tokens/s per GPU | TFLOP/s per GPU | MFU | peak mem rank 0 (GB) | max rel. loss / grad-norm diff vs 1 GPU |", "|---|---|---|---|---|---|"]
for n, v in res.items():
    if "error" in v: lines.append(f"| {n} | {v['error']} |"); continue
    lines.append(f"| {n} | {v['tokens_per_s_per_gpu']:.0f} | {v['tflops_per_gpu']:.1f} | {100*v['mfu']:.1f}% | {v['peak_mem_gb_rank0']:.1f} | {v['max_rel_loss_diff_vs_1gpu']:.2e} / {v['max_rel_grad_norm_diff_vs_1gpu']:.2e} |")
open(os.path.join(out, "bench_tp.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
