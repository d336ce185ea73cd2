#!/usr/bin/env bash
# FP8 training speed on one GPU (docs/fp8.md): the MegaDLMs 1.7B architecture
# (configs/megadlms_1.7b.args, mock data), seq 2048, micro-batch 4, global batch 32 (or SEQ below), ITERS
# iterations (default 8; the first 2 are warm-up and left out of the medians), in bf16, FP8
# hybrid delayed and FP8 hybrid tensorwise (RECIPES may add blockwise: hidden 2048, ffn 6144 and
# seq 2048 meet its 128-multiple rule), one after another in the same call. Writes
# OUT_DIR/bench_fp8.md and .json: tokens/s, ms per iteration, the ratio to bf16, the peak
# memory the stream-ordered pool reserved (GiB), the peak in use against the memory plan's
# prediction, and the last loss; the run logs beside them.
# Every run has --difflm-varilen-prob 0 (no micro-batch truncated: the counted tokens are the
# tokens computed, as on the peer's side).
#
#   scripts/bench_fp8.sh OUT_DIR
# Environment: MEGADLM_BIN (default build/bin), ITERS (default 8), RECIPES (default
# "bf16 delayed tensorwise"), MEGADLM_FLAGS (extra flags for every run), PEER (the PyTorch peer
# peer_torch_dlm.py; when set it runs the same shape with --params amp after megadlm's runs and
# every row gets its ratio to the peer: the peer has no FP8, so FP8 rows compare against its bf16),
# SEQ (2048, or 8192: micro-batch 1 and global batch 8, the same 8 micro-batches an iteration, as
# scripts/bench_vs_peer.sh's s8192; the FP8 goal there is 1.2x bf16).
# About 3 x (start-up + 8 iterations) of device time: well under 5 minutes on an H100/H200.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/bench_fp8.sh OUT_DIR}
bin=${MEGADLM_BIN:-build/bin}
iters=${ITERS:-8}
recipes=${RECIPES:-bf16 delayed tensorwise}
seq=${SEQ:-2048}
case $seq in
  2048) shape=(--micro-batch-size 4 --global-batch-size 32); mbs=4 ;;
  8192) shape=(--seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 8); mbs=1 ;;
  *) echo "bench_fp8.sh: SEQ must be 2048 or 8192, got $seq"; exit 2 ;;
esac
read -r -a extra <<< "${MEGADLM_FLAGS:-}"
mkdir -p "$out"
[ -x "$bin/pretrain_difflm" ] || { echo "bench_fp8.sh: $bin/pretrain_difflm not found (set MEGADLM_BIN)"; exit 2; }
for r in $recipes; do
  case $r in
    bf16) flags=() ;;
    delayed|tensorwise|blockwise) flags=(--fp8-format hybrid --fp8-recipe "$r") ;;
    *) echo "bench_fp8.sh: unknown recipe $r (bf16, delayed, tensorwise, blockwise)"; exit 2 ;;
  esac
  rm -f "$out/$r.jsonl"
  "$bin/pretrain_difflm" @configs/megadlms_1.7b.args --mock-data --device cuda --difflm-varilen-prob 0 \
    "${shape[@]}" --train-iters "$iters" --log-interval 1 --eval-iters 0 \
    --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000 \
    --metrics-jsonl "$out/$r.jsonl" "${flags[@]}" "${extra[@]}" > "$out/$r.log" 2>&1
  echo "$r: exit $? ($SECONDS s)"
done
if [ -n "${PEER:-}" ]; then
  rm -f "$out/peer_amp.json"
  python3 "$PEER" --layers 28 --hidden 2048 --heads 16 --ffn 6144 --vocab 50304 --seq "$seq" --mbs "$mbs" \
    --steps 10 --warmup 3 --compile 1 --sdpa cudnn --params amp --json "$out/peer_amp.json" > "$out/peer_amp.log" 2>&1
  echo "peer amp: exit $? ($SECONDS s)"
fi
python3 - "$out" "$recipes" "$seq" "$mbs" <<'PY'
import json, os, statistics, sys
out, recipes, seq, mbs = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
peer = None
if os.path.exists(os.path.join(out, "peer_amp.json")):
    peer = json.loads(open(os.path.join(out, "peer_amp.json")).read().strip().splitlines()[-1])
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
              # In use at the high-water mark and the memory plan's prediction: reserved minus used
              # is the pool's fragmentation, used minus predicted what the plan does not count.
              "peak_used_gib": max(x.get("peak_mem_gb", 0) for x in train) * 1e9 / GIB,
              "predicted_gib": max(x.get("predicted_peak_gb", 0) for x in train) * 1e9 / GIB,
              "last_loss": train[-1]["lm_loss"], "iterations_timed": len(timed)}
base = res.get("bf16")
for r, m in res.items():
    m["ratio_to_bf16"] = m["tokens_per_s"] / base["tokens_per_s"] if base else None
    m["ratio_to_peer_amp"] = m["tokens_per_s"] / peer["tokens_per_s"] if peer else None
if peer:
    res["peer_amp"] = {"tokens_per_s": peer["tokens_per_s"], "step_ms": peer["step_ms"],
                       "peak_reserved_gib": peer["max_reserved_gb"], "loss": peer["loss"]}
json.dump(res, open(os.path.join(out, "bench_fp8.json"), "w"), indent=1)
lines = [f"# FP8 vs bf16, MegaDLMs 1.7B, seq {seq}, micro-batch {mbs}, global batch {8 * int(mbs)}, one GPU", "",
         "| recipe | tokens/s | ms/iteration | ratio to bf16 | ratio to peer amp | peak reserved (GiB) | peak in use / planned (GiB) | last loss |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
for r in recipes:
    m = res.get(r)
    if not m:
        lines.append(f"| {r} | (failed: see {r}.log) | | | | | | |")
        continue
    ratio = "%.3f" % m["ratio_to_bf16"] if m["ratio_to_bf16"] else "-"
    vs_peer = "%.3f" % m["ratio_to_peer_amp"] if m["ratio_to_peer_amp"] else "-"
    name = r if r == "bf16" else f"FP8 hybrid {r}"
    lines.append(f"| {name} | {m['tokens_per_s']:.0f} | {m['ms_per_iteration']:.1f} | {ratio} | {vs_peer} | "
                 f"{m['peak_reserved_gib']:.1f} | {m['peak_used_gib']:.1f} / {m['predicted_gib']:.1f} | {m['last_loss']:.4f} |")
if peer:
    lines.append(f"| peer, --params amp (bf16 autocast, no FP8) | {peer['tokens_per_s']:.0f} | {peer['step_ms'] * 8:.1f} | | 1.000 | "
                 f"{peer['max_reserved_gb']:.1f} | | {peer['loss']:.4f} |")
lines += ["", "Medians over the iterations after the first two (warm-up); memory is the pool's reserved high-water mark.",
          f"Both sides: the same architecture, seq {seq}, micro-batch {mbs}, mock tokens; the peer's ms column is its step time x 8",
          f"micro-batches (megadlm's iteration is 8 micro-batches of global batch {8 * int(mbs)})."]
open(os.path.join(out, "bench_fp8.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
