# Sourced by the launch files in this folder: where a run writes, and the environment NCCL needs
# on a multi-node cluster. Edit the NCCL block for your fabric (the defaults suit InfiniBand with
# GPUDirect RDMA); every NCCL_* variable set here reaches every rank (scripts/launch.sh exports
# them).

# --- where things go ------------------------------------------------------------------------
: "${MEGADLM_BIN:=build/bin}"                       # the built programs
: "${RUN_NAME:=$(basename "${RECIPE:-run}" .args)}"
: "${RUN_DIR:=runs/$RUN_NAME}"                       # one folder per run, on a shared filesystem
CKPT_DIR="$RUN_DIR/checkpoints"                      # --save and --load: a preempted job resumes
LOG_DIR="$RUN_DIR/logs"                              # per-rank diagnostics (--log-dir)
mkdir -p "$CKPT_DIR" "$LOG_DIR"

# --- NCCL on InfiniBand / RoCE ----------------------------------------------------------------
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"     # NVLink SHARP off unless your site wants it
export NCCL_IB_HCA="${NCCL_IB_HCA:-mlx5}"            # the HCAs to use (prefix match)
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-^lo,docker}"  # bootstrap interface
export NCCL_NET_GDR_LEVEL="${NCCL_NET_GDR_LEVEL:-PHB}"         # GPUDirect RDMA when GPU and NIC share a PCIe switch
export NCCL_IB_QPS_PER_CONNECTION="${NCCL_IB_QPS_PER_CONNECTION:-4}"
# RoCE: also select the RoCEv2 GID (often 3) and the traffic class your switches prioritise:
# export NCCL_IB_GID_INDEX=3
# export NCCL_IB_TC=106
# Debugging a hang or a slow collective: NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

# The flags every launch adds to the recipe: checkpoints (resume is automatic), metrics, logs.
RUN_FLAGS=(--save "$CKPT_DIR" --load "$CKPT_DIR" --metrics-jsonl "$RUN_DIR/metrics.jsonl"
           --log-dir "$LOG_DIR" --exit-signal-handler)
