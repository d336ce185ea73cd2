#!/usr/bin/env bash
# Everything generation, evaluation and TensorBoard need proven on a GPU, from a carried
# build folder (bin/ and lib/; nothing is compiled here), in about 90 s of GPU time on one H200:
#   parity  gpu_parity SamplingParity.*, KvCacheParity.*: sample_proposals (bf16/f32, Gumbel,
#           guidance, random confidence), the cache update copy_row_block, and a 2-layer
#           model's refresh and cached windows (CUDA key-block attention) against the CPU  (~5 s)
#   cuda    a tiny model (trained 2 steps on the CPU): generate_difflm on CUDA (bf16), exact and
#           with --kv-cache dual (the cached steps run the key-block attention), against the
#           CPU (fp32); agreement reported (bf16 vs fp32 may flip near-ties), exit codes checked;
#           evaluate_difflm loglik on CUDA within 5e-2 of the CPU                         (~10 s)
#   tb      TensorBoard event files of a CPU run read back by tensorboard's own
#           EventAccumulator (scripts/check_tensorboard.py --reader tensorboard), every scalar at
#           every logged step                                                              (~5 s)
#   bench   scripts/bench_generate.sh on the 1.7B architecture (random weights): gen 256, block 32,
#           256 steps; megadlm exact and --kv-cache dual at batch 1 (BATCH1_PROMPTS=2 prompts)
#           and 16 (16 prompts), transformers + LLaDA's sampler on the exported model     (~70 s)
#           (the threshold is not timed: on random weights it never fires; prefix is the slower
#           cache; MODES=exact,threshold,prefix,dual,dual+threshold times them all)
#   scripts/device_generation.sh BUILD OUT [parity] [cuda] [tb] [bench]     (default: all four)
# Results: OUT/summary.txt (one line per stage), OUT/bench_generate.md and .json, OUT/logs.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:?usage: scripts/device_generation.sh BUILD OUT [parity cuda tb bench]}
out=${2:?usage: scripts/device_generation.sh BUILD OUT [parity cuda tb bench]}
shift 2
what=" ${*:-parity cuda tb bench} "
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$(cd "$build" && pwd)/bin
export LD_LIBRARY_PATH="$(cd "$build" && pwd)/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
work=$(mktemp -d)
summary=$out/summary.txt
logs=$out/logs.txt
: > "$summary"
: > "$logs"
note() { echo "$*" | tee -a "$summary"; }
keep() { { echo "==== $1"; tail -n "${2:-40}" "$1"; } >> "$logs" 2>/dev/null; }
counts() {
  echo "$(grep -cE '^\[       OK \].* ms\)' "$1") ok, $(grep -cE '^\[  FAILED  \].* ms\)' "$1") failed, $(grep -cE '^\[  SKIPPED \].* ms\)' "$1") skipped"
}
note "device_generation: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), build $build"

if [[ $what == *" parity "* ]]; then
  t0=$SECONDS
  "$bin/gpu_parity" --gtest_filter='SamplingParity.*:KvCacheParity.*' > "$work/parity.log" 2>&1
  note "parity: exit $? ($((SECONDS - t0)) s): $(counts "$work/parity.log")"
  keep "$work/parity.log" 30
fi

if [[ $what == *" cuda "* ]]; then
  t0=$SECONDS
  (
    set -e
    cd "$work"
    "$bin/pretrain_difflm" @"$root/configs/tiny_dlm.args" --device cpu --train-iters 2 --lr-warmup-iters 0 \
      --init-method-std 0.3 --eval-iters 0 --save ckpt --save-interval 2 > train.log 2>&1
    printf '{"prompt_ids": [5, 17, 33, 2, 90, 14, 61]}\n{"prompt_ids": [100, 3]}\n{"prompt_ids": [44, 45, 46, 47]}\n' > p.jsonl
    printf '{"context_ids": [5, 6, 7, 8], "continuation_ids": [9, 10, 11]}\n' > r.jsonl
    for dev in cpu cuda; do
      for cache in none dual prefix; do
        "$bin/generate_difflm" --load ckpt --prompts-jsonl p.jsonl --gen-length 32 --steps 32 --block-length 8 \
          --batch-size 3 --device $dev --kv-cache $cache --output gen_${dev}_$cache.jsonl 2> gen_${dev}_$cache.err
      done
      "$bin/evaluate_difflm" --load ckpt --task loglik --requests-jsonl r.jsonl --mc-num 16 --mc-batch-size 8 \
        --device $dev --output ll_$dev.jsonl 2> ll_$dev.err
    done
    python3 - <<'P'
import json
def toks(f): return [json.loads(l)["token_ids"] for l in open(f)]
for cache in ("none", "dual", "prefix"):
    a, b = toks(f"gen_cpu_{cache}.jsonl"), toks(f"gen_cuda_{cache}.jsonl")
    same = sum(x == y for x, y in zip(a, b))
    tok = sum(u == v for x, y in zip(a, b) for u, v in zip(x, y))
    print(f"kv cache {cache}: CUDA bf16 vs CPU fp32: {same}/{len(a)} prompts identical, {tok}/{sum(map(len, a))} tokens equal")
c = json.loads(open("ll_cpu.jsonl").readline())["loglikelihood"]
g = json.loads(open("ll_cuda.jsonl").readline())["loglikelihood"]
print(f"loglik CPU {c:.6f} CUDA {g:.6f} (|diff| {abs(c - g):.2e}, bound 5e-2 relative)")
assert abs(c - g) <= 5e-2 * abs(c), "loglik on CUDA too far from the CPU"
P
  ) > "$work/cuda.log" 2>&1
  note "cuda: exit $? ($((SECONDS - t0)) s): $(grep -E '^kv cache|^loglik' "$work/cuda.log" | tr '\n' ';')"
  keep "$work/cuda.log" 30
  for f in "$work"/gen_cuda_*.err; do keep "$f" 5; done
fi

if [[ $what == *" tb "* ]]; then
  t0=$SECONDS
  (
    set -e
    cd "$work"
    "$bin/pretrain_difflm" @"$root/configs/tiny_dlm.args" --device cpu --train-iters 20 --log-interval 5 \
      --eval-interval 10 --eval-iters 2 --tensorboard-dir tb --log-timers-to-tensorboard --log-throughput \
      --log-memory-to-tensorboard --log-validation-ppl-to-tensorboard > tb_train.log 2>&1
    python3 "$root/scripts/check_tensorboard.py" tb --reader tensorboard \
      --expect "lm loss=1:20" --expect "learning-rate=1:20" --expect "grad-norm=1:20" --expect "batch-size=1:20" \
      --expect "loss-scale=1:20" --expect "lm loss vs samples=$(seq -s, 8 8 160)" \
      --expect "iteration-time=5,10,15,20" --expect "throughput=5,10,15,20" --expect "mem-max-allocated-bytes=5,10,15,20" \
      --expect "lm loss validation=10,20" --expect "lm loss validation vs samples=80,160" \
      --expect "lm loss validation ppl=10,20"
  ) > "$work/tb.log" 2>&1
  note "tb (tensorboard's EventAccumulator): exit $? ($((SECONDS - t0)) s): $(tail -1 "$work/tb.log")"
  keep "$work/tb.log" 30
fi

if [[ $what == *" bench "* ]]; then
  t0=$SECONDS
  PROMPTS=${PROMPTS:-16} BATCH1_PROMPTS=${BATCH1_PROMPTS:-2} MODES=${MODES:-exact,dual} \
    bash scripts/bench_generate.sh "$bin" "$work/bench" > "$work/bench.log" 2>&1
  note "bench: exit $? ($((SECONDS - t0)) s)"
  cp "$work/bench/bench_generate.md" "$work/bench/bench_generate.json" "$out/" 2>/dev/null
  cat "$out/bench_generate.md" >> "$summary" 2>/dev/null
  keep "$work/bench.log" 40
  keep "$work/bench/generate_bench.log" 20
  for f in "$work"/bench/*.err "$work"/bench/save.log "$work"/bench/convert.log; do [ -f "$f" ] && keep "$f" 15; done
fi
rm -rf "$work"
