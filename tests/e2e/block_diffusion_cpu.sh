#!/usr/bin/env bash
# Block diffusion on the CPU as a user runs it: configs/tiny_dlm.args with
# `--attention-mask-type block_causal --dlm-block-size 8` trains (the loss falls over 60
# iterations), on packed documents too, and with the causal clean half and its next-token loss;
# the full-sequence objective at the same settings is a different run (other losses); the
# throughput line's FLOP count is block diffusion's; bad combinations are refused by rule.
set -euo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bd=(--attention-mask-type block_causal --dlm-block-size 8 --dlm-loss-weight inv_t_eps)
run() {
  local name=$1; shift
  "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 60 --log-interval 1 \
    --eval-iters 0 --metrics-jsonl "$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1 ||
    { echo "FAIL: $name exited $?"; cat "$tmp/$name.log"; exit 1; }
}
falls() {
  awk -F'lm loss: ' -v name="$1" '/ iteration /{split($2, v, " "); loss[++n] = v[1]}
    END { for (i = 1; i <= 10; i++) { a += loss[i]; b += loss[n - 10 + i] }
          a /= 10; b /= 10; printf "%s: lm loss first 10 mean %.4f, last 10 mean %.4f\n", name, a, b;
          if (n != 60 || !(b < 0.8 * a)) { print "FAIL: " name ": the loss did not fall"; exit 1 } }' "$tmp/$1.log"
}
run bd "${bd[@]}"
falls bd
run bd_docs "${bd[@]}" --reset-position-ids --reset-attention-mask --cut-off-varlen-to-seqlen
falls bd_docs
run bd_causal "${bd[@]}" --dlm-bd-clean-attention causal --dlm-diffusion-loss-scale 0.3
falls bd_causal
run full --dlm-loss-weight inv_t_eps
python3 - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
rows = {n: [json.loads(l) for l in open(os.path.join(d, n + ".jsonl")) if '"lm_loss"' in l]
        for n in ("bd", "bd_docs", "bd_causal", "full")}
assert all(len(r) == 60 for r in rows.values()), {n: len(r) for n, r in rows.items()}
# Different objectives and masks train differently (packed documents: once a row holds an EOD).
for a, b in (("bd", "full"), ("bd", "bd_docs"), ("bd", "bd_causal")):
    diff = max(abs(x["lm_loss"] - y["lm_loss"]) for x, y in zip(rows[a], rows[b]))
    assert diff > 1e-3, (a, b, diff)
print("first losses:", {n: round(r[0]["lm_loss"], 4) for n, r in rows.items()})
PY
# Resume is exact: 20 iterations straight, or 10, a checkpoint, and 10 more from it.
run straight "${bd[@]}" --train-iters 20 --lr-decay-iters 60
run first "${bd[@]}" --train-iters 10 --lr-decay-iters 60 --save "$tmp/ckpt" --save-interval 10
run resumed "${bd[@]}" --train-iters 20 --lr-decay-iters 60 --load "$tmp/ckpt"
grep -q '"block_size": 8' "$tmp/ckpt/iter_0000010/"*.json 2>/dev/null || grep -rq '"block_size": *8' "$tmp/ckpt" ||
  { echo "FAIL: the checkpoint's config does not record the block size"; exit 1; }
python3 - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
rows = lambda n: [json.loads(l) for l in open(os.path.join(d, n + ".jsonl")) if '"lm_loss"' in l]
a, b = rows("straight")[10:], rows("resumed")
b = [r for r in b if r.get("iteration", 0) > 10] or b[-10:]
assert len(a) == 10 and len(b) == 10, (len(a), len(b))
for x, y in zip(a, b):
    assert x["lm_loss"] == y["lm_loss"] and x["grad_norm"] == y["grad_norm"], (x, y)
print("resume: iterations 11-20 bitwise equal to the straight run")
PY
# The FLOP count per iteration (the throughput line divides it by the time): block diffusion
# counts 2L tokens through the layers and L·B + L² attention pairs, more than the full sequence.
grep -q "throughput per GPU" "$tmp/bd.log" || { echo "FAIL: no throughput field"; exit 1; }
# Refusals, before any training.
source "$src/tests/e2e/lib/expect.sh"
refuse() { refuses "$1" "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 5 "${@:2}"; }
refuse "must divide \`--seq-length 64\`" --attention-mask-type block_causal --dlm-block-size 48
refuse "needs \`--dlm-block-size B\`" --attention-mask-type block_causal
refuse "[D-10]" --attention-mask-type block_causal --dlm-block-size 8 --dlm-ar-loss-weight 0.5
# Under CP the 64 positions are cut into 2 x 2 chunks of whole blocks: blocks of 32 do not fit.
refuse "block diffusion under context parallelism cuts \`--seq-length 64\`" --attention-mask-type block_causal \
  --dlm-block-size 32 --context-parallel-size 2 --world-size 2 --dry-run
echo "block diffusion e2e: OK"
