#!/usr/bin/env bash
# Starts a megadlm program with one rank per GPU, through mpirun (one or more nodes) or Slurm's
# srun, exporting what NCCL needs. Everything after the launcher options goes to the program.
# docs/launching.md explains each way, how the NCCL id travels and the timeout behaviour.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/launch.sh [options] [--] PROGRAM [ARGS...]

Runs PROGRAM (e.g. build/bin/pretrain_difflm) with one rank per GPU; ARGS are passed unchanged.

options:
  --launcher mpirun|srun  how to start the ranks (default: srun inside a Slurm allocation,
                          i.e. when SLURM_JOB_ID is set, otherwise mpirun)
  --gpus N                ranks (GPUs) per node (default: GPUs counted by nvidia-smi, else 1)
  --nodes N               nodes (default: hosts in --hostfile/--hosts for mpirun,
                          SLURM_JOB_NUM_NODES for srun, else 1)
  --hostfile FILE         mpirun: one host name per line (slots are set to --gpus)
  --hosts H1,H2,...       mpirun: the same as a comma-separated list
  --srun-mpi TYPE         srun: PMI plugin that lets MPI start inside the step (default: pmix)
  --master-port PORT      port of rank 0's NCCL id rendezvous when MPI is not used
                          (exported as MASTER_PORT; default 29500)
  --shared-gpu N          testing only: N ranks on this node's GPU(s), several per GPU, each
                          through scripts/shared_gpu_rank.sh (own NCCL_HOSTID, NCCL over
                          loopback sockets): exact results, meaningless speed
  --dry-run               print the launch command instead of running it
  -h, --help              this text

environment exported to every rank:
  NCCL_NVLS_ENABLE=0      NVLink SHARP / multicast stays off unless you set it yourself
  NCCL_*                  every NCCL variable set here (NCCL_DEBUG, NCCL_SOCKET_IFNAME, ...)
  MASTER_ADDR, MASTER_PORT  rank 0's host and a port (used only when MPI is not running)
  MEGADLM_RENDEZVOUS_TOKEN  a random token of this launch that rank 0's TCP rendezvous demands
                          (yours if set; docs/launching.md)
  PATH, LD_LIBRARY_PATH

examples:
  scripts/launch.sh --gpus 8 build/bin/pretrain_difflm @configs/megadlms_1.7b.args --mock-data
  scripts/launch.sh --gpus 8 --hostfile hosts.txt build/bin/pretrain_difflm @my.args
  sbatch -N 4 --gpus-per-node 8 --wrap "scripts/launch.sh build/bin/pretrain_difflm @my.args"
  mpirun -np 2 build/bin/gpu_nccl      (what this script runs for --gpus 2, minus the extras)

Ranks: global rank = node * GPUS + local rank; each process binds the GPU of its local rank.
Exit status: the program's (a rank that fails ends every rank: see docs/launching.md).
EOF
}

launcher=""
gpus=""
nodes=""
hostfile=""
hosts=""
srun_mpi="pmix"
master_port="${MASTER_PORT:-29500}"
dry_run=0
shared_gpu=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --launcher) launcher=${2:?--launcher needs mpirun or srun}; shift 2 ;;
    --gpus) gpus=${2:?--gpus needs a number}; shift 2 ;;
    --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
    --hostfile) hostfile=${2:?--hostfile needs a file}; shift 2 ;;
    --hosts) hosts=${2:?--hosts needs a list}; shift 2 ;;
    --srun-mpi) srun_mpi=${2:?--srun-mpi needs a plugin name}; shift 2 ;;
    --master-port) master_port=${2:?--master-port needs a port}; shift 2 ;;
    --shared-gpu) shared_gpu=${2:?--shared-gpu needs a number of ranks}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --) shift; break ;;
    -*) echo "launch.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "launch.sh: no program given (see --help)" >&2; exit 2; }
program=$1
shift

is_number() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

if [ -z "$launcher" ]; then
  if [ -n "${SLURM_JOB_ID:-}" ]; then launcher=srun; else launcher=mpirun; fi
fi
if [ -n "$shared_gpu" ]; then
  is_number "$shared_gpu" || { echo "launch.sh: --shared-gpu must be a positive integer, got '$shared_gpu'" >&2; exit 2; }
  [ -z "$gpus" ] || { echo "launch.sh: give --gpus or --shared-gpu, not both" >&2; exit 2; }
  gpus=$shared_gpu   # ranks per node
fi
if [ -z "$gpus" ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  [ "${gpus:-0}" -ge 1 ] || gpus=1
fi
is_number "$gpus" || { echo "launch.sh: --gpus must be a positive integer, got '$gpus'" >&2; exit 2; }

# NCCL's environment: NVLink SHARP off by default, the user's NCCL_* passed along.
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
export MASTER_PORT="$master_port"
# The token rank 0's rendezvous socket demands: random per launch, so that another job (or
# anything else) reaching MASTER_PORT is refused. Not printed by --dry-run (it is a secret).
if [ -z "${MEGADLM_RENDEZVOUS_TOKEN:-}" ]; then
  MEGADLM_RENDEZVOUS_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
fi
export MEGADLM_RENDEZVOUS_TOKEN
nccl_vars=$(compgen -e | grep '^NCCL_' || true)

cmd=()
case "$launcher" in
  mpirun)
    host_list=()
    if [ -n "$hostfile" ]; then
      [ -r "$hostfile" ] || { echo "launch.sh: cannot read --hostfile $hostfile" >&2; exit 2; }
      while read -r host _ || [ -n "${host:-}" ]; do  # also a last line without newline
        [[ -z "$host" || "$host" == \#* ]] && continue
        host_list+=("$host")
      done < "$hostfile"
    elif [ -n "$hosts" ]; then
      IFS=, read -r -a host_list <<< "$hosts"
    fi
    if [ -z "$nodes" ]; then nodes=${#host_list[@]}; [ "$nodes" -ge 1 ] || nodes=1; fi
    is_number "$nodes" || { echo "launch.sh: --nodes must be a positive integer, got '$nodes'" >&2; exit 2; }
    if [ ${#host_list[@]} -gt 0 ] && [ ${#host_list[@]} -lt "$nodes" ]; then
      echo "launch.sh: --nodes $nodes but only ${#host_list[@]} host(s) given" >&2; exit 2
    fi
    export MASTER_ADDR="${MASTER_ADDR:-${host_list[0]:-$(hostname)}}"
    cmd=(mpirun -np $((nodes * gpus)) --map-by "ppr:${gpus}:node" --bind-to none)
    if [ ${#host_list[@]} -gt 0 ]; then
      # Open MPI's hostfile wants slots; one slot per GPU.
      gen=$(mktemp "${TMPDIR:-/tmp}/megadlm-hosts.XXXXXX")
      trap 'rm -f "$gen"' EXIT
      for h in "${host_list[@]:0:$nodes}"; do echo "$h slots=$gpus"; done > "$gen"
      cmd+=(--hostfile "$gen")
    fi
    [ "$(id -u)" = 0 ] && cmd+=(--allow-run-as-root)
    for v in $nccl_vars MASTER_ADDR MASTER_PORT MEGADLM_RENDEZVOUS_TOKEN PATH LD_LIBRARY_PATH; do cmd+=(-x "$v"); done
    ;;
  srun)
    if [ -z "$nodes" ]; then nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}; fi
    is_number "$nodes" || { echo "launch.sh: --nodes must be a positive integer, got '$nodes'" >&2; exit 2; }
    if [ -z "${MASTER_ADDR:-}" ]; then
      first=""
      if [ -n "${SLURM_JOB_NODELIST:-}" ] && command -v scontrol >/dev/null; then
        first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR == 1')
      fi
      export MASTER_ADDR="${first:-$(hostname)}"
    fi
    # --kill-on-bad-exit: a rank that fails ends the step, like MPI_Abort under mpirun.
    cmd=(srun --nodes "$nodes" --ntasks-per-node "$gpus" --ntasks $((nodes * gpus))
         --mpi "$srun_mpi" --kill-on-bad-exit=1 --export=ALL)
    ;;
  *) echo "launch.sh: --launcher must be mpirun or srun, got '$launcher'" >&2; exit 2 ;;
esac
if [ -n "$shared_gpu" ]; then
  cmd+=("$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/shared_gpu_rank.sh")
fi
cmd+=("$program" "$@")

if [ "$dry_run" = 1 ]; then
  echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
  [ -n "${gen:-}" ] && echo "# hostfile: $(paste -sd, "$gen")"
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
set +e
"${cmd[@]}"
exit $?
