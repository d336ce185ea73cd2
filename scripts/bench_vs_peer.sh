#!/usr/bin/env bash
# megadlm against the PyTorch peer (peer_torch_dlm.py: torch.compile, cuDNN SDPA) on one GPU,
# both in the same run of this script, for these shapes (MegaDLMs 1.7B architecture):
#   s2048  seq 2048, micro-batch 4   (peer --params amp and --params bf16)
#   s8192  seq 8192, micro-batch 1   (peer --params amp)
#   gqa4   seq 2048, micro-batch 4, 4 query groups (peer --params amp)
#   bd2048 block diffusion, seq 2048, micro-batch 4, block 32 (peer --objective bd --params amp)
#   bd8192 block diffusion, seq 8192, micro-batch 1, block 32
#   bd2048b4 block diffusion, seq 2048, micro-batch 4, block 4
#   Block diffusion: both sides draw one t per block, weight 1/p with p = (1 - 1e-3) t + 1e-3,
#   run [x_t | x_0] through the layers and score the noisy half; tokens/s counts the useful
#   (noisy-half) tokens on both sides, as the peer prints them.
#   megadlm runs with --difflm-varilen-prob 0: the peer never truncates a micro-batch, and the
#   1.7B args' 0.01 cuts micro-batch 30 (iteration 4 at 8 a step, seed 1234) to 1516 of 2048
#   tokens (6065 of 8192 at s8192): less work for the same counted tokens.
# Writes OUT_DIR/bench_vs_peer.json and .md: tokens/s of both, the ratios, and the peak memory the
# allocators reserved (megadlm: the stream-ordered pool's reserved high-water mark; PyTorch:
# max_memory_reserved), both in GiB. Logs of every run beside them.
#
#   scripts/bench_vs_peer.sh OUT_DIR [SHAPES]        SHAPES: comma list (default s2048,s8192,gqa4)
# Environment (paths only; nothing here changes what megadlm computes):
#   MEGADLM_BIN   folder with pretrain_difflm (default build/bin)
#   PEER          the peer script peer_torch_dlm.py (not in this repository; needed unless
#                 PEER_SHAPES=none)
#   ITERS         megadlm iterations per shape (default 8; the first 2 are warm-up)
#   PEER_STEPS    timed peer steps (default 10, after 3 warm-up steps)
#   PEER_PARAMS   peer precision recipes for s2048 (default "amp bf16")
#   PEER_SHAPES   shapes the peer runs on (default: SHAPES; "none": megadlm only)
#   MEGADLM_FLAGS extra pretrain_difflm flags for every megadlm run
#   DEADLINE_S    skip runs that would start after this many seconds of the script (default none)
# Every megadlm shape runs first, then the peer's; the summary covers the runs that finished.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/bench_vs_peer.sh OUT_DIR [SHAPES]}
shapes=${2:-s2048,s8192,gqa4}
bin=${MEGADLM_BIN:-build/bin}
peer=${PEER:-}
iters=${ITERS:-8}
peer_steps=${PEER_STEPS:-10}
peer_params=${PEER_PARAMS:-amp bf16}
read -r -a extra <<< "${MEGADLM_FLAGS:-}"
mkdir -p "$out"
[ -x "$bin/pretrain_difflm" ] || { echo "bench_vs_peer.sh: $bin/pretrain_difflm not found (set MEGADLM_BIN)"; exit 2; }

bd_flags="--attention-mask-type block_causal --dlm-loss-weight inv_t_eps --attention-dropout 0"
# shape -> megadlm flags, global batch (8 micro-batches an iteration), peer flags.
shape_flags() {
  case $1 in
    s2048) echo "--micro-batch-size 4 --global-batch-size 32" ;;
    s8192) echo "--seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 8" ;;
    gqa4) echo "--group-query-attention --num-query-groups 4 --micro-batch-size 4 --global-batch-size 32" ;;
    bd2048) echo "--micro-batch-size 4 --global-batch-size 32 $bd_flags --dlm-block-size 32" ;;
    bd8192) echo "--seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 8 $bd_flags --dlm-block-size 32" ;;
    bd2048b4) echo "--micro-batch-size 4 --global-batch-size 32 $bd_flags --dlm-block-size 4" ;;
    *) echo "bench_vs_peer.sh: unknown shape $1 (s2048, s8192, gqa4, bd2048, bd8192, bd2048b4)" >&2; return 1 ;;
  esac
}
peer_flags() {
  case $1 in
    s2048) echo "--seq 2048 --mbs 4" ;;
    s8192) echo "--seq 8192 --mbs 1" ;;
    gqa4) echo "--seq 2048 --mbs 4 --kv-heads 4" ;;
    bd2048) echo "--seq 2048 --mbs 4 --objective bd --block-size 32" ;;
    bd8192) echo "--seq 8192 --mbs 1 --objective bd --block-size 32" ;;
    bd2048b4) echo "--seq 2048 --mbs 4 --objective bd --block-size 4" ;;
  esac
}

deadline=${DEADLINE_S:-0}
in_time() { [ "$deadline" = 0 ] || [ "$SECONDS" -lt "$deadline" ] || { echo "skipped $1: past DEADLINE_S"; return 1; }; }
IFS=, read -r -a shape_list <<< "$shapes"
for shape in "${shape_list[@]}"; do
  flags=$(shape_flags "$shape") || exit 2
  in_time "megadlm $shape" || continue
  rm -f "$out/megadlm_$shape.jsonl"
  # shellcheck disable=SC2086
  "$bin/pretrain_difflm" @configs/megadlms_1.7b.args --mock-data --device cuda --difflm-varilen-prob 0 $flags \
    --train-iters "$iters" --log-interval 1 --eval-iters 0 \
    --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000 \
    --metrics-jsonl "$out/megadlm_$shape.jsonl" "${extra[@]}" > "$out/megadlm_$shape.log" 2>&1
  echo "megadlm $shape: exit $? ($SECONDS s)"
done
peer_shapes=${PEER_SHAPES:-$shapes}
[ "$peer_shapes" = none ] && peer_shapes=
IFS=, read -r -a peer_list <<< "$peer_shapes"
[ ${#peer_list[@]} = 0 ] || [ -f "$peer" ] || { echo "bench_vs_peer.sh: peer script '$peer' not found: set PEER to peer_torch_dlm.py, or PEER_SHAPES=none for megadlm only"; exit 2; }
for shape in "${peer_list[@]}"; do
  recipes=amp
  [ "$shape" = s2048 ] && recipes=$peer_params
  for params in $recipes; do
    in_time "peer $shape $params" || continue
    rm -f "$out/peer_${shape}_$params.json"
    # shellcheck disable=SC2046
    python3 "$peer" --layers 28 --hidden 2048 --heads 16 --ffn 6144 --vocab 50304 \
      $(peer_flags "$shape") --steps "$peer_steps" --warmup 3 --compile 1 --sdpa cudnn \
      --params "$params" --json "$out/peer_${shape}_$params.json" > "$out/peer_${shape}_$params.log" 2>&1
    echo "peer $shape $params: exit $? ($SECONDS s)"
  done
done

python3 - "$out" "$shapes" <<'PY'
import json, os, statistics, sys
out, shapes = sys.argv[1], sys.argv[2].split(",")
GIB = 2 ** 30
def megadlm(shape):
    p = os.path.join(out, f"megadlm_{shape}.jsonl")
    rows = [json.loads(l) for l in open(p) if l.strip()] if os.path.exists(p) else []
    train = [r for r in rows if r.get("kind", "train") == "train" and "elapsed_ms" in r]
    if len(train) < 3:
        return None
    steady = train[2:]
    med = lambda k: statistics.median(r[k] for r in steady)
    return {"tokens_per_s": med("tokens_per_s"), "ms_per_iteration": med("elapsed_ms"),
            "mfu_811": med("mfu"), "mfu_989": med("mfu_989"),
            "peak_reserved_gib": max(r.get("peak_reserved_gb", 0) for r in train) * 1e9 / GIB,
            "peak_in_use_gib": max(r["peak_mem_gb"] for r in train) * 1e9 / GIB,
            "iterations_measured": len(steady), "last_lm_loss": train[-1]["lm_loss"],
            # Megatron's model FLOPs per counted token (block diffusion: per useful token, the
            # visible pairs of its mask), the same for every iteration of a shape.
            "model_flops_per_token": med("tflops_per_gpu") * 1e12 / med("tokens_per_s")}
def peer(shape, params):
    p = os.path.join(out, f"peer_{shape}_{params}.json")
    if not os.path.exists(p):
        return None
    r = json.loads(open(p).read().strip().splitlines()[-1])
    return {"tokens_per_s": r["tokens_per_s"], "step_ms": r["step_ms"],
            "peak_reserved_gib": r["max_reserved_gb"], "peak_in_use_gib": r["max_mem_gb"], "loss": r["loss"]}
res = {}
for s in shapes:
    m = megadlm(s)
    row = {"megadlm": m}
    for params in ("amp", "bf16"):
        q = peer(s, params)
        if q is None:
            continue
        row[f"peer_{params}"] = q
        if m:
            row[f"ratio_vs_{params}"] = m["tokens_per_s"] / q["tokens_per_s"]
            row[f"memory_vs_{params}"] = m["peak_reserved_gib"] / q["peak_reserved_gib"]
    res[s] = row
json.dump(res, open(os.path.join(out, "bench_vs_peer.json"), "w"), indent=2)
names = {"s2048": "seq 2048, micro-batch 4", "s8192": "seq 8192, micro-batch 1", "gqa4": "seq 2048, GQA 4 query groups",
         "bd2048": "block diffusion, seq 2048, mb 4, block 32", "bd8192": "block diffusion, seq 8192, mb 1, block 32",
         "bd2048b4": "block diffusion, seq 2048, mb 4, block 4"}
f = lambda v, fmt: (fmt % v) if v is not None else "–"
lines = ["| shape (MegaDLMs 1.7B) | megadlm tokens/s | peer amp | ratio | peer bf16 params | ratio | MFU 811 / 989 | reserved GiB megadlm / amp / bf16 |",
         "|---|---|---|---|---|---|---|---|"]
for s, row in res.items():
    m, a, b = row.get("megadlm"), row.get("peer_amp"), row.get("peer_bf16")
    lines.append("| %s | %s | %s | %s | %s | %s | %s | %s / %s / %s |" % (
        names.get(s, s), f(m and m["tokens_per_s"], "%.0f"), f(a and a["tokens_per_s"], "%.0f"),
        f(row.get("ratio_vs_amp"), "%.3f"), f(b and b["tokens_per_s"], "%.0f"), f(row.get("ratio_vs_bf16"), "%.3f"),
        ("%.1f%% / %.1f%%" % (100 * m["mfu_811"], 100 * m["mfu_989"])) if m else "–",
        f(m and m["peak_reserved_gib"], "%.1f"), f(a and a["peak_reserved_gib"], "%.1f"), f(b and b["peak_reserved_gib"], "%.1f")))
# Block diffusion's cost per useful token against the full-sequence objective at the same shape.
for bd, full in (("bd2048", "s2048"), ("bd8192", "s8192")):
    if res.get(bd, {}).get("megadlm") and res.get(full, {}).get("megadlm"):
        c = res[full]["megadlm"]["tokens_per_s"] / res[bd]["megadlm"]["tokens_per_s"]
        res[bd]["megadlm_cost_vs_full_sequence"] = c
        lines.append("")
        # The objective's own work ratio: the cost ratio it would have at equal kernel efficiency.
        w = res[bd]["megadlm"]["model_flops_per_token"] / res[full]["megadlm"]["model_flops_per_token"]
        res[bd]["model_flops_vs_full_sequence"] = w
        lines.append("megadlm %s / %s cost per useful token: %.2fx; model FLOPs per useful token: %.2fx "
                     "(the cost at equal efficiency); efficiency %s / %s: %.3f" % (bd, full, c, w, bd, full, w / c))
json.dump(res, open(os.path.join(out, "bench_vs_peer.json"), "w"), indent=2)
md = "\n".join(lines) + "\n"
open(os.path.join(out, "bench_vs_peer.md"), "w").write(md)
print(md)
PY
