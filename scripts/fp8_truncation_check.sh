#!/usr/bin/env bash
# FP8 training over varilen-truncated micro-batches on the GPU (docs/fp8.md, "Token counts"):
# the convergence model's shape (scripts/fp8_convergence.sh: 12 layers, hidden 768, ffn 3072,
# seq 1024, micro-batch 8, global batch 32) on mock tokens with --difflm-varilen-prob 1, so that
# every micro-batch is cut to a drawn length: token counts that are no multiple of 16 or 128 in
# every GEMM, each recipe ITERS iterations (default 20: 80 drawn lengths). CUDA_LAUNCH_BLOCKING=1,
# so a kernel fault is reported at the launch that made it; SANITIZER=1 runs each recipe under
# compute-sanitizer instead (3 iterations: slow). VARILEN=0.01 ITERS=120 gives the cuts of the
# convergence run instead (the draws depend on the seed and the micro-batch index, not on the
# tokens): micro-batch 455 (iteration 114) is 8 x 723 tokens, where session 23's blockwise run
# stopped. Prints one line a recipe and the tail of a failed run's log; exit 1 when any run failed.
#
#   scripts/fp8_truncation_check.sh OUT_DIR
# Environment: MEGADLM_BIN (default build/bin), RECIPES (default "blockwise delayed tensorwise"),
# ITERS, SANITIZER, VARILEN (default 1).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/fp8_truncation_check.sh OUT_DIR}
bin=${MEGADLM_BIN:-build/bin}
iters=${ITERS:-20}
[ "${SANITIZER:-0}" = 1 ] && iters=${ITERS:-3}
mkdir -p "$out"
[ -x "$bin/pretrain_difflm" ] || { echo "fp8_truncation_check.sh: $bin/pretrain_difflm not found (set MEGADLM_BIN)"; exit 2; }
model=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --ffn-hidden-size 3072 --swiglu
       --normalization RMSNorm --norm-epsilon 1e-6 --qk-layernorm --disable-bias-linear
       --untie-embeddings-and-output-weights --position-embedding-type rope --seq-length 1024
       --max-position-embeddings 1024 --attention-dropout 0 --hidden-dropout 0 --vocab-size 50304
       --mask-token 50257 --model-running-mode difflm-noshift --attention-mask-type no_mask)
train=(--mock-data --micro-batch-size 8 --global-batch-size 32 --train-iters "$iters" --lr 6e-4
       --bf16 --seed 1234 --log-interval 1 --eval-iters 0 --difflm-varilen-prob "${VARILEN:-1}" --device cuda)
failed=0
for r in ${RECIPES:-blockwise delayed tensorwise}; do
  run=("$bin/pretrain_difflm" "${model[@]}" "${train[@]}" --fp8-format hybrid --fp8-recipe "$r")
  if [ "${SANITIZER:-0}" = 1 ]; then
    compute-sanitizer --print-limit 5 "${run[@]}" > "$out/$r.log" 2>&1
  else
    CUDA_LAUNCH_BLOCKING=1 "${run[@]}" > "$out/$r.log" 2>&1
  fi
  rc=$?
  done_iters=$(grep -c "iteration .*/" "$out/$r.log")
  echo "$r: exit $rc, $done_iters of $iters iterations logged"
  if [ $rc != 0 ]; then failed=1; grep -v '\.\.\.\.' "$out/$r.log" | tail -8; fi
done
exit $failed
