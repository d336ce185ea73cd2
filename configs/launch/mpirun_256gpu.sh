#!/usr/bin/env bash
# mpirun launch for 256 GPUs (32 node(s) x 8), without Slurm: `configs/launch/mpirun_256gpu.sh
# HOSTFILE` from the repository root on the first host; HOSTFILE lists 32 host name(s), one per
# line (configs/launch/hosts.example). RECIPE and DATA_FLAGS as for the Slurm script. `kill -USR1`
# on mpirun (which forwards SIGUSR1 to every rank) saves a checkpoint and stops (docs/recipes.md).
set -euo pipefail
hostfile=${1:?usage: $0 HOSTFILE (32 host(s), one per line)}
hosts=$(grep -cv '^[[:space:]]*\(#\|$\)' "$hostfile")
[ "$hosts" -ge 32 ] || { echo "$0: $hostfile lists $hosts host(s); this launch needs 32" >&2; exit 2; }
RECIPE=${RECIPE:-configs/recipes/llama3_70b_256gpu.args}
source configs/launch/cluster_env.sh
read -r -a data <<< "${DATA_FLAGS:---mock-data}"
exec scripts/launch.sh --launcher mpirun --gpus 8 --nodes 32 --hostfile "$hostfile" \
  "$MEGADLM_BIN/pretrain_difflm" @"$RECIPE" "${data[@]}" "${RUN_FLAGS[@]}"
