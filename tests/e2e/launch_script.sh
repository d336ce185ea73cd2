#!/usr/bin/env bash
# scripts/launch.sh as a user runs it: --help, the mpirun and srun command lines it builds for
# one rank per GPU (checked with --dry-run: no GPU or Slurm needed), and a real 2-rank mpirun
# launch of the MPI layout suite when this build has MPI.
set -euo pipefail
bin=$1; src=$2
launch="$src/scripts/launch.sh"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Outputs are captured before grepping: `prog | grep -q` can SIGPIPE the program under pipefail.
help=$(bash "$launch" --help)
grep -q "one rank per GPU" <<< "$help" || fail "--help does not explain the script"

out=$(NCCL_DEBUG=WARN bash "$launch" --dry-run --launcher mpirun --gpus 8 --hosts node-a,node-b \
      -- prog @flags.args --train-iters 3)
echo "$out"
for want in "mpirun -np 16 --map-by ppr:8:node" "--hostfile" "node-a slots=8,node-b slots=8" \
            "-x NCCL_NVLS_ENABLE" "-x NCCL_DEBUG" "-x MEGADLM_RENDEZVOUS_TOKEN" "MASTER_ADDR=node-a" "NCCL_NVLS_ENABLE=0" \
            "prog @flags.args --train-iters 3"; do
  grep -qF -- "$want" <<< "$out" || fail "mpirun dry run lacks '$want'"
done

out=$(MASTER_ADDR=head bash "$launch" --dry-run --launcher srun --gpus 4 --nodes 2 prog --x "a b")
echo "$out"
for want in "srun --nodes 2 --ntasks-per-node 4 --ntasks 8 --mpi pmix --kill-on-bad-exit=1" \
            "MASTER_ADDR=head" 'prog --x a\ b'; do
  grep -qF -- "$want" <<< "$out" || fail "srun dry run lacks '$want'"
done

# A user's own setting wins over the default.
out=$(NCCL_NVLS_ENABLE=1 bash "$launch" --dry-run --gpus 1 prog)
grep -q "NCCL_NVLS_ENABLE=1" <<< "$out" || fail "an explicit NCCL_NVLS_ENABLE was overridden"
! bash "$launch" --gpus 0 prog 2>/dev/null || fail "--gpus 0 was accepted"

if [ -x "$bin/layout_comm" ] && [ -x "$bin/comm_timeout_probe" ] && "$bin/comm_timeout_probe" --mpi-compiled \
   && command -v mpirun >/dev/null; then
  SLURM_JOB_ID= bash "$launch" --launcher mpirun --gpus 2 "$bin/layout_comm" \
    --gtest_filter='MpiWorld.KnowsItsRankSizeAndNames:MpiWorld.AllReduce*' > "$log" 2>&1 \
    || { cat "$log"; fail "the 2-rank launch failed"; }
  grep -q "2 rank(s): all tests passed on every rank" "$log" \
    || { cat "$log"; fail "the 2-rank launch did not run 2 ranks"; }
  echo "a real 2-rank launch passed"
  # A flag that differs on one rank stops the job before training, naming the rank and the flag.
  wrapper=$(mktemp)
  printf '#!/usr/bin/env bash\nextra=(); [ "${OMPI_COMM_WORLD_RANK:-0}" = 1 ] && extra=(--lr 0.5)\nexec "%s" "$@" "${extra[@]}"\n' \
    "$bin/pretrain_difflm" > "$wrapper"
  chmod +x "$wrapper"
  if SLURM_JOB_ID= bash "$launch" --launcher mpirun --gpus 2 "$wrapper" @"$src/configs/tiny_dlm.args" \
       --device cpu --train-iters 12 > "$log" 2>&1; then
    rm -f "$wrapper"; cat "$log"; fail "ranks with different --lr trained"
  fi
  rm -f "$wrapper"
  grep -q "lr: 0.5 on rank 1, 0.003 on rank 0" "$log" || { cat "$log"; fail "the differing flag was not named"; }
  grep -qE " iteration +[0-9]+/" "$log" && { cat "$log"; fail "training started despite the difference"; }
  echo "a flag differing on rank 1 stopped the job, naming it"
fi
echo "PASS: launch.sh builds one-rank-per-GPU mpirun and srun commands and launches"
