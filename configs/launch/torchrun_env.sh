#!/usr/bin/env bash
# Without mpirun or Slurm: a torchrun-style environment per process (what torchrun, or any
# launcher that sets these variables, gives each rank). Run this on every node with NODE_RANK set
# (0 on the node whose address is MASTER_ADDR); it starts 8 ranks there. GPU runs only: CPU
# tensors need MPI (docs/launching.md).
#   NODE_RANK=0 NNODES=2 MASTER_ADDR=gpu-node-001 configs/launch/torchrun_env.sh
set -euo pipefail
: "${NODE_RANK:?set NODE_RANK}" "${NNODES:?set NNODES}" "${MASTER_ADDR:?set MASTER_ADDR}"
export MASTER_PORT="${MASTER_PORT:-29500}"
RECIPE=${RECIPE:-configs/recipes/qwen3_8b_16gpu_tp2.args}
source configs/launch/cluster_env.sh
read -r -a data <<< "${DATA_FLAGS:---mock-data}"
export WORLD_SIZE=$((NNODES * 8)) LOCAL_WORLD_SIZE=8
pids=()
for local in 0 1 2 3 4 5 6 7; do
  RANK=$((NODE_RANK * 8 + local)) LOCAL_RANK=$local \
    "$MEGADLM_BIN/pretrain_difflm" @"$RECIPE" "${data[@]}" "${RUN_FLAGS[@]}" &
  pids+=($!)
done
trap 'kill -USR1 "${pids[@]}" 2>/dev/null' USR1 TERM   # forward preemption: save and stop
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
