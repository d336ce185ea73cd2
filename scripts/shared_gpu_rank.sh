#!/usr/bin/env bash
# Runs one rank of a multi-rank job on a GPU that other ranks share (testing only: exact, slow).
# NCCL refuses two ranks on one GPU unless each has its own host id; with one, it connects them
# through its socket transport on loopback. This sets, for the rank it starts:
#   NCCL_HOSTID           megadlm-rank-<global rank> (from OMPI_COMM_WORLD_RANK, RANK, PMI_RANK
#                         or SLURM_PROCID)
#   NCCL_SOCKET_IFNAME=lo NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1
#   NCCL_NVLS_ENABLE=0    (each only when not already set)
#   MEGADLM_SHARED_GPU=1  libmegadlm binds GPU (local rank mod GPU count) and logs that the
#                         run's speed means nothing
# then execs the command. Works under mpirun, srun and torchrun (torchrun --no-python):
#   mpirun -np 8 scripts/shared_gpu_rank.sh build/bin/pretrain_difflm @configs/tiny_dlm.args ...
#   torchrun --nproc_per_node=8 --no-python scripts/shared_gpu_rank.sh build/bin/pretrain_difflm ...
# docs/launching.md, "Many ranks on one GPU".
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/shared_gpu_rank.sh PROGRAM [ARGS...]" >&2; exit 2; }
rank="${OMPI_COMM_WORLD_RANK:-${RANK:-${PMI_RANK:-${SLURM_PROCID:-}}}}"
if [ -z "$rank" ]; then
  echo "shared_gpu_rank.sh: no rank in the environment (OMPI_COMM_WORLD_RANK, RANK, PMI_RANK or" \
       "SLURM_PROCID); start it under mpirun, srun or torchrun" >&2
  exit 2
fi
export NCCL_HOSTID="megadlm-rank-$rank"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
export NCCL_P2P_DISABLE="${NCCL_P2P_DISABLE:-1}"
export NCCL_SHM_DISABLE="${NCCL_SHM_DISABLE:-1}"
export NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
export MEGADLM_SHARED_GPU=1
exec "$@"
