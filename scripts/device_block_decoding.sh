#!/usr/bin/env bash
# Block decoding proven on a GPU, from a carried build folder (bin/ and lib/; nothing compiled):
#   parity  gpu_parity BlockDecodingParity.*: the exact cache's windows against the CPU, whole CUDA
#           decodings checked at every call against the CPU and the GPU's uncached forward, and
#           --batch-invariant's checks (with GemmParity.BatchInvariant*: rows bit for bit across M)
#   cuda    tiny block-diffusion checkpoints (both clean-half variants, trained 2 steps on the
#           CPU): generate_difflm --decode block (and ar) on CUDA with --kv-cache exact and none
#           against the CPU, and exact against none on CUDA; agreement reported (bf16 vs fp32
#           may flip near-ties), exit codes checked
#   bench   scripts/bench_block_decoding.sh: the 1.7B architecture (random weights), gen 256,
#           block 32, 32 steps a block, batch 1 and 16: block exact / none / full-sequence exact,
#           and the transformers reference when torch + transformers are installed; block exact
#           under --batch-invariant (its cost, and the same tokens at batch 1 and 16)
#   scripts/device_block_decoding.sh BUILD OUT [parity] [cuda] [bench]     (default: all three)
# Results: OUT/summary.txt (one line per stage), OUT/bench_block_decoding.md, OUT/logs.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:?usage: scripts/device_block_decoding.sh BUILD OUT [parity cuda bench]}
out=${2:?usage: scripts/device_block_decoding.sh BUILD OUT [parity cuda bench]}
shift 2
what=" ${*:-parity cuda bench} "
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$(cd "$build" && pwd)/bin
export LD_LIBRARY_PATH="$(cd "$build" && pwd)/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
work=$(mktemp -d)
summary=$out/summary.txt
logs=$out/logs.txt
: > "$summary"
: > "$logs"
note() { echo "$*" | tee -a "$summary"; }
keep() { { echo "==== $1"; tail -n "${2:-40}" "$1"; } >> "$logs" 2>/dev/null; }
note "device_block_decoding: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), build $build"

if [[ $what == *" parity "* ]]; then
  t0=$SECONDS
  "$bin/gpu_parity" --gtest_filter='BlockDecodingParity.*:GemmParity.BatchInvariant*' > "$work/parity.log" 2>&1
  note "parity: exit $? ($((SECONDS - t0)) s): $(grep -cE '^\[       OK \]' "$work/parity.log") ok, $(grep -cE '^\[  FAILED  \].* ms\)' "$work/parity.log") failed; $(grep -E '^\[parity\] block decoding' "$work/parity.log" | sed 's/.*whole decodings: //' | tr '\n' ';')"
  keep "$work/parity.log" 40
fi

if [[ $what == *" cuda "* ]]; then
  t0=$SECONDS
  (
    set -e
    cd "$work"
    bd=(--attention-mask-type block_causal --dlm-block-size 4)
    "$bin/pretrain_difflm" @"$root/configs/tiny_dlm.args" "${bd[@]}" --device cpu --train-iters 2 --lr-warmup-iters 0 \
      --init-method-std 0.3 --eval-iters 0 --save bd --save-interval 2 > train_bd.log 2>&1
    "$bin/pretrain_difflm" @"$root/configs/tiny_dlm.args" "${bd[@]}" --dlm-bd-clean-attention causal \
      --dlm-ar-loss-weight 1.0 --device cpu --train-iters 2 --lr-warmup-iters 0 --init-method-std 0.3 --eval-iters 0 \
      --save sbd --save-interval 2 > train_sbd.log 2>&1
    printf '{"prompt_ids": [5, 17, 33, 2, 90, 14, 61]}\n{"prompt_ids": [100, 3]}\n{"prompt_ids": [44, 45, 46, 47]}\n{"prompt_ids": [9]}\n' > p.jsonl
    for dev in cpu cuda; do
      for cache in exact none; do
        "$bin/generate_difflm" --load bd --prompts-jsonl p.jsonl --gen-length 16 --steps 16 --batch-size 4 \
          --device $dev --kv-cache $cache --no-stop-at-eos --output bd_${dev}_$cache.jsonl 2> bd_${dev}_$cache.err
        "$bin/generate_difflm" --load sbd --prompts-jsonl p.jsonl --gen-length 16 --steps 16 --batch-size 4 \
          --device $dev --kv-cache $cache --no-stop-at-eos --output sbd_${dev}_$cache.jsonl 2> sbd_${dev}_$cache.err
        "$bin/generate_difflm" --load sbd --decode ar --prompts-jsonl p.jsonl --gen-length 16 --batch-size 4 \
          --device $dev --kv-cache $cache --no-stop-at-eos --output ar_${dev}_$cache.jsonl 2> ar_${dev}_$cache.err
      done
    done
    python3 - <<'P'
import json
def toks(f): return [json.loads(l)["token_ids"] for l in open(f)]
for m in ("bd", "sbd", "ar"):
    for cache in ("exact", "none"):
        a, b = toks(f"{m}_cpu_{cache}.jsonl"), toks(f"{m}_cuda_{cache}.jsonl")
        print(f"{m} kv {cache}: CUDA vs CPU {sum(x == y for x, y in zip(a, b))}/{len(a)} prompts identical")
    a, b = toks(f"{m}_cuda_exact.jsonl"), toks(f"{m}_cuda_none.jsonl")
    print(f"{m}: CUDA exact vs none {sum(x == y for x, y in zip(a, b))}/{len(a)} prompts identical")
P
  ) > "$work/cuda.log" 2>&1
  note "cuda: exit $? ($((SECONDS - t0)) s): $(grep -E 'identical' "$work/cuda.log" | tr '\n' ';')"
  keep "$work/cuda.log" 30
  for f in "$work"/*_cuda_*.err; do keep "$f" 4; done
fi

if [[ $what == *" bench "* ]]; then
  t0=$SECONDS
  "$root/scripts/bench_block_decoding.sh" "$bin" "$out/bench" > "$work/bench.log" 2>&1
  rc=$?
  cp "$out/bench/bench_block_decoding.md" "$out/" 2>/dev/null
  note "bench: exit $rc ($((SECONDS - t0)) s): see bench_block_decoding.md"
  keep "$work/bench.log" 40
fi
rm -rf "$work"
