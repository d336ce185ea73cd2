#!/usr/bin/env bash
# The expert load over training with learned routing: the fine-grained MoE of
# configs/fine_grained_moe.args (no forced balance, the Switch aux loss at 1e-2) trained on real
# text for ITERS iterations of one micro-batch, then the load max/mean (tokens the busiest expert
# took over the mean, averaged over the 12 MoE layers; 8 = every token to the same 8 of 64
# experts) every 10 iterations, into OUT/moe_load_curve.md. Does the router leave the collapsed
# start of a freshly initialised diffusion MoE?
#
#   scripts/moe_load_curve.sh OUT DATA_PREFIX [ITERS] [extra flags...]
# DATA_PREFIX: a Megatron .bin/.idx of ids below 50277 (e.g. GPT-2 tokens from preprocess_data).
# Environment: MEGADLM_BIN (default build/bin).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?OUT}; data=${2:?DATA_PREFIX}; iters=${3:-200}; shift $(( $# < 3 ? $# : 3 )) || true
mkdir -p "$out"
bin=${MEGADLM_BIN:-build/bin}
rm -f "$out/moe_load_metrics.jsonl"
"$bin/pretrain_difflm" @configs/fine_grained_moe.args --data-path "$data" --tokenizer-type NullTokenizer \
  --split 100,0,0 --device cuda --global-batch-size 4 --train-iters "$iters" --log-interval 10 --eval-iters 0 \
  --lr-warmup-iters 20 --lr-decay-style cosine --lr-decay-iters "$iters" \
  --metrics-jsonl "$out/moe_load_metrics.jsonl" "$@" > "$out/moe_load_log.txt" 2>&1
echo "pretrain_difflm exit $? ($SECONDS s)"
python3 - "$out" <<'PY'
import json, os, sys
d = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(d, "moe_load_metrics.jsonl")) if l.strip()]
rows = [r for r in rows if r.get("kind", "train") == "train" and "moe_load_max_over_mean" in r]
if not rows:
    sys.exit("no training rows with moe_load_max_over_mean")
md = ["| iteration | lm loss | load-balancing loss | expert load max/mean (mean of layers) | busiest layer |",
      "|---|---|---|---|---|"]
for r in rows:
    per = r.get("moe_load_max_over_mean_per_layer") or []
    md.append("| %d | %.3f | %.3f | %.2f | %s |" % (r["iteration"], r["lm_loss"], r.get("moe_load_balancing_loss", float("nan")),
              r["moe_load_max_over_mean"], ("%.2f (layer %d)" % (max(per), per.index(max(per)))) if per else "–"))
text = "\n".join(md) + "\n"
open(os.path.join(d, "moe_load_curve.md"), "w").write(text)
print(text)
PY
