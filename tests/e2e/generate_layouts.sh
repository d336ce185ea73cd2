#!/usr/bin/env bash
# generate_difflm and evaluate_difflm load a checkpoint saved under any parallel layout: the
# same initial weights (learning rate 0: the initialisation is keyed by global names and
# coordinates, so every layout starts from the same values) saved by one process, by 4 ranks
# under TP 2 x PP 2 (whose vocabulary is padded to 256 instead of 128) and by 2 ranks with the
# distributed optimizer give the same completions and log-likelihoods, and so does the Hugging
# Face export of the TP 2 x PP 2 checkpoint. The sampler sees only the real vocabulary: a padded
# row (random here) is never proposed, and a mask token may sit among the padded rows. Skips (77)
# without MPI.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
if ! { [ -x "$bin/comm_timeout_probe" ] && "$bin/comm_timeout_probe" --mpi-compiled && command -v mpirun > /dev/null; }; then
  echo "SKIP: needs megadlm built with MPI and mpirun"; exit 77
fi
flags=()
if grep -q "Open MPI" <<< "$(mpirun --version 2>&1 || true)"; then
  flags+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
fi
train=("$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 1 --lr 0 --min-lr 0
       --lr-warmup-iters 0 --init-method-std 0.3 --eval-iters 0 --save-interval 1)
"${train[@]}" --save one > one.log 2>&1 || { cat one.log; exit 1; }
mpirun -np 4 "${flags[@]}" "${train[@]}" --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
  --save tp2pp2 > tp2pp2.log 2>&1 || { tail -20 tp2pp2.log; exit 1; }
mpirun -np 2 "${flags[@]}" "${train[@]}" --use-distributed-optimizer --save dp2 > dp2.log 2>&1 \
  || { tail -20 dp2.log; exit 1; }
export_hf tp2pp2 hf
printf '{"prompt_ids": [5, 17, 33, 2, 90, 14, 61]}\n{"prompt_ids": [100, 3]}\n{"prompt_ids": [44, 45, 46, 47]}\n' > prompts.jsonl
printf '{"context_ids": [5, 6, 7, 8], "continuation_ids": [9, 10, 11]}\n{"context_ids": [40], "continuation_ids": [41, 42]}\n' > requests.jsonl
for opts in "--steps 16 --block-length 16" "--steps 8 --block-length 4 --cfg-scale 1.0 --remasking random --temperature 0.5"; do
  for source in "--load one" "--load tp2pp2" "--load dp2" "--hf-dir hf --mask-token-id 127"; do
    name=$(tr -c 'a-z0-9\n' _ <<< "${source%% --mask*}")
    # shellcheck disable=SC2086
    "$bin/generate_difflm" $source --prompts-jsonl prompts.jsonl --gen-length 16 $opts --batch-size 3 \
      --device cpu --output "gen_$name.jsonl" 2> "gen_$name.err" || { cat "gen_$name.err"; exit 1; }
    cmp -s <(grep -o '"token_ids":\[[^]]*\]' gen___load_one.jsonl) <(grep -o '"token_ids":\[[^]]*\]' "gen_$name.jsonl") \
      || { echo "FAIL: $source gives other tokens than --load one ($opts)"; cat gen___load_one.jsonl "gen_$name.jsonl"; exit 1; }
    if grep -o '"token_ids":\[[^]]*\]' "gen_$name.jsonl" | grep -Eq '[[,](12[89]|1[3-9][0-9]|2[0-9][0-9])[],]'; then
      echo "FAIL: $source proposed a padded vocabulary row (id >= 128)"; exit 1
    fi
  done
  echo "same completions from every layout and the Hugging Face export: $opts"
done
grep -q "saved under" gen___load_tp2pp2.err || { echo "FAIL: the model line does not say the layout"; cat gen___load_tp2pp2.err; exit 1; }
for source in one tp2pp2 dp2; do
  "$bin/evaluate_difflm" --load $source --task loglik --requests-jsonl requests.jsonl --mc-num 8 --mc-batch-size 4 \
    --device cpu --output "ll_$source.jsonl" 2> "ll_$source.err" || { cat "ll_$source.err"; exit 1; }
  cmp -s <(grep -o '"loglikelihood":[^,]*' ll_one.jsonl) <(grep -o '"loglikelihood":[^,]*' "ll_$source.jsonl") \
    || { echo "FAIL: log-likelihoods of --load $source differ from --load one"; cat ll_one.jsonl "ll_$source.jsonl"; exit 1; }
done
# A mask token among the padded rows (vocabulary 120 padded to 128, mask 125): accepted as the
# canvas's input, never proposed (no id >= 120), and the log-likelihood runs.
"${train[@]}" --vocab-size 120 --mask-token 125 --save padmask > padmask.log 2>&1 || { cat padmask.log; exit 1; }
"$bin/generate_difflm" --load padmask --prompts-jsonl prompts.jsonl --gen-length 16 --steps 16 --block-length 8 \
  --batch-size 3 --device cpu --kv-cache dual --output padmask.jsonl 2> padmask.err || { cat padmask.err; exit 1; }
if grep -o '"token_ids":\[[^]]*\]' padmask.jsonl | grep -Eq '[[,](12[0-9])[],]'; then
  echo "FAIL: a padded id (>= 120) was proposed"; cat padmask.jsonl; exit 1
fi
"$bin/evaluate_difflm" --load padmask --task loglik --requests-jsonl requests.jsonl --mc-num 4 --mc-batch-size 4 \
  --device cpu --output padmask_ll.jsonl 2> padmask_ll.err || { cat padmask_ll.err; exit 1; }
echo "a mask token in the padding (125 of 120 + 8): generation proposes only real ids, loglik runs"
echo "PASS: checkpoints of 1 process, TP 2 x PP 2 and DP 2 + distributed optimizer (and the HF export) generate and score alike ($(grep -o 'saved under[^)]*' gen___load_tp2pp2.err))"
