#!/usr/bin/env bash
# The multi-GPU runs in one script: from a build folder (bin/ lib/, e.g. a carried
# build-cuda), runs every run of the issue whose code exists and that fits GPUS, each under its
# own `timeout`, and writes one results file, OUT/results.jsonl (one JSON object per run, fields
# below) with OUT/results.md (the same as a table), plus OUT/logs/<run>.log and <run>.jsonl.
#
#   scripts/multi_gpu_runs.sh BUILD OUT [GPUS] [--cpu-dry] [--shared-gpu N] [--only REGEX]
#                             [--iters N] [--limit S]
#   scripts/multi_gpu_runs.sh --summarize OUT [MORE ...]   (re-reads OUT/logs, rewrites the
#              results; first merges each MORE, the OUT of another call, into OUT)
#
#   GPUS       GPUs of this host to use (default: nvidia-smi's count; 4 with --cpu-dry). Runs
#              needing more ranks are listed as skipped.
#   --cpu-dry  the same run list on the CPU under mpirun (--oversubscribe) with the tiny model
#              and few iterations: proves the plumbing and the parsing (tests/e2e/
#              multi_gpu_runs_cpu.sh); the 1.7B and long-context runs are skipped there.
#   --shared-gpu N  N ranks on this host's GPU(s), several ranks per GPU, each started through
#              scripts/shared_gpu_rank.sh (its own NCCL_HOSTID, NCCL over loopback sockets;
#              docs/launching.md "Many ranks on one GPU"): runs needing up to N ranks run. Exact,
#              slow: results.md marks the speed columns meaningless. With --cpu-dry the wrapper
#              is used too (MPI on the CPU ignores its NCCL settings): the plumbing is the same.
#   --only RE  only runs whose name matches the extended regex RE (a device call has at most
#              10 minutes: split the list, e.g. --only '^(ref|dp|tp)', into several calls with
#              the same OUT; results accumulate, a run is redone only when named again. On the
#              device, where $OUT starts empty in every call, give each call its own OUT and
#              merge them afterwards: --summarize ALL OUT1 OUT2 ...; a device call returns few
#              files, so write OUT under /tmp and pack it: tar czf $OUT/runs.tgz -C /tmp NAME).
#              A run's comparison needs its reference's logs (ref_1gpu, ref_1gpu_mbs2, ...): a
#              call that does not run them leaves the comparison to the --summarize that merges.
#   --iters N  training iterations of the equivalence runs (default 100, the long-curve setting
#              below; --cpu-dry: 3).
#   --limit S  seconds per run before `timeout` ends it (default 240; --cpu-dry: 60).
#
# The equivalence method (docs/parallelism/equivalence.md). Each run of the tiny model is
# compared with the same model on one GPU in two ways:
#   step-1 gradients  every run writes its first iteration's full fp32 gradients
#                (pretrain_difflm --save-gradients logs/<run>.grads, assembled from any layout);
#                scripts/compare_gradients.py compares them tensor by tensor with the reference's,
#                each tensor against 3 x the relative difference of the noise pair (the two one-
#                GPU runs with --micro-batch-size 4 and 2), floor 1e-5. One step's gradients
#                cannot be amplified by training's chaos: this separates rounding from a bug.
#   curve        per-iteration lm loss and grad norm over --iters iterations at a learning rate
#                where the tiny model is not chaotic (--lr 3e-4, min 3e-5, cosine over 1000
#                iterations: the CPU fp32 noise twin stays within 1.1e-6 relative for 100
#                iterations, where lr 3e-3 reaches 1.9e-2; bf16 on the GPU: 2.6e-2 in 12),
#                against 3 x the noise pair's largest relative difference, floor 1e-5.
# Groups of runs:
#   suite        bin/gpu_nccl under mpirun -np 2 (when carried): NCCL collectives exactly, and
#                --tp-comm-overlap's rings with the side stream's events against the plain ones.
#   equivalence  the tiny model (4 layers) under each layout against the same run on one GPU
#                (both comparisons above):
#                DP 2 plain / overlapped / distributed optimizer, TP 2 + SP with and without
#                --tp-comm-overlap, PP 2 x VPP 2, CP 2 with each --cp-comm-type, EP 2 with each
#                dispatcher, Megatron-FSDP over 2 with each sharding strategy; at 4 and 8 GPUs
#                TP2xPP2(xDP2), TP2xCP2(xDP2), CP 4/8, EP 2/4 x TP 2 + SP, FSDP 4/8, DP 4/8, TP 4 + SP.
#                Bound: bf16 noise measured as the largest relative difference between two
#                one-GPU runs of the same function that differ only in --micro-batch-size (4
#                vs 2: other GEMM shapes and summation order); a layout passes within 3x that
#                (floor 1e-5, the CPU layout suites' fp32 tolerance). The MoE runs' curves take
#                the dense noise (a smaller micro-batch changes MoE's aux loss, not only
#                rounding); their gradients take the MoE noise pair's per tensor (the router's
#                bound then includes that aux-loss change: a weaker check for the router alone).
#   guide        the parallelism guide's launch lines (tests/e2e/parallelism_guide_lines.sh) with
#                8 ranks on the tiny model: DP no_shard, TP 4 + SP, PP 8 x VPP 4 (32 layers, its
#                own one-GPU reference and noise pair), CP 2 p2p with hierarchical sizes 2 4
#                (refused as written: the refusal is checked, group refusal; then the valid form
#                2 1 runs), EP 4
#                with 8 experts and grouped GEMM, TP 2 x PP 2 x CP 2 with EP 2, Megatron-FSDP and
#                --use-torch-fsdp2 with --no-gradient-accumulation-fusion; each compared as above,
#                and each launched again with torchrun (torchrun_<line>: torchrun
#                --nproc_per_node=8 --no-python scripts/shared_gpu_rank.sh ..., when torchrun
#                exists), whose losses must equal the mpirun run's (bound 1e-6 relative).
#   scaling      the MegaDLMs 1.7B shape: DP (distributed optimizer, overlapped) at 1/2/4/8 with
#                the same per-GPU batch; TP 2/4 + SP with and without --tp-comm-overlap; PP 2/4
#                with and without VPP (bubble against (P-1)/(M V)); CP 2/4/8 at 32k and CP 8 at
#                64k/128k; EP 8 on the fine-grained MoE against EP 1; FSDP 8 against the
#                distributed optimizer at 8. tokens/s per GPU, MFU, peak memory, efficiency
#                against the 1-GPU run of the same shape; the runs with the 1-GPU run's global
#                batch (TP, PP) are also compared with it, against the 1.7B shape's own noise.
#   planner      its predicted peak memory (from --dry-run) against the measured one, when the
#                build has a memory planner (skipped with the reason otherwise).
#   fault        DP 2 (through the wrapper with --shared-gpu), a rank SIGKILLed, and a rank
#                SIGSTOPped, mid-run: the job must end within
#                the limit; the log must name the rank (kill) or the group, operation and rank
#                of the timed-out collective with the last-collectives file (stop; needs one
#                --distributed-timeout-minutes, so not in --cpu-dry).
# Before a run, `pretrain_difflm --dry-run` for its world size says whether this build can run
# it; a run it cannot is listed as skipped with the dry run's reason.
#
# results.jsonl fields: run, group, np, model, reference, status (ok | failed | timeout |
# skipped), exit, seconds, reason, command, iterations, max_rel_loss_diff, max_rel_grad_norm_diff,
# bound, equal (the curve), grad_equal, grad_rel_diff (whole model), grad_beyond (tensors beyond
# their bound), grad_worst (tensor, rel diff, bound), shared_gpu, tokens_per_s_per_gpu, mfu, peak_mem_gb, scaling_efficiency, bubble_measured,
# bubble_estimate, fault fields (ended_s, names_rank, names_group_op, collective_log).
# Every job runs with NCCL_NVLS_ENABLE=0 (multicast stays off on these machines).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

usage() { sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
summarize_only=0
if [ "${1:-}" = --summarize ]; then
  [ $# -ge 2 ] || usage
  summarize_only=1; out=$2; shift 2
  mkdir -p "$out/logs"; touch "$out/runs.tsv"
  for more in "$@"; do  # another call's runs: its lines replace OUT's lines of the same run
    [ -f "$more/runs.tsv" ] || { echo "multi_gpu_runs.sh: $more has no runs.tsv" >&2; exit 2; }
    cp -r "$more/logs/." "$out/logs/"
    [ -f "$more/shared_gpu" ] && cp "$more/shared_gpu" "$out/shared_gpu"
    awk -F'\t' 'NR == FNR { drop[$1]; next } !($1 in drop)' "$more/runs.tsv" "$out/runs.tsv" > "$out/runs.tsv.tmp"
    cat "$more/runs.tsv" >> "$out/runs.tsv.tmp"
    mv "$out/runs.tsv.tmp" "$out/runs.tsv"
  done
else
  [ $# -ge 2 ] || usage
  build=$1; out=$2; shift 2
  gpus=""; cpu_dry=0; only=""; iters=""; run_limit=""; shared_gpu=""
  if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then gpus=$1; shift; fi
  while [ $# -gt 0 ]; do
    case $1 in
      --cpu-dry) cpu_dry=1 ;;
      --shared-gpu)
        [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "multi_gpu_runs.sh: --shared-gpu needs a number of ranks >= 1, got '${2:-}'" >&2; exit 2; }
        shared_gpu=$2; shift ;;
      --only) only=$2; shift ;;
      --iters) iters=$2; shift ;;
      --limit) run_limit=$2; shift ;;
      *) echo "multi_gpu_runs.sh: unknown argument '$1'" >&2; usage ;;
    esac
    shift
  done
  [ -x "$build/bin/pretrain_difflm" ] || { echo "multi_gpu_runs.sh: $build/bin/pretrain_difflm is not built" >&2; exit 2; }
  build=$(cd "$build" && pwd)
  if [ -n "$shared_gpu" ]; then
    [ -z "$gpus" ] || { echo "multi_gpu_runs.sh: give GPUS or --shared-gpu N, not both" >&2; exit 2; }
    if [ "$cpu_dry" = 0 ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
      echo "multi_gpu_runs.sh: --shared-gpu $shared_gpu: no GPU visible to share (nvidia-smi -L lists none)" >&2; exit 2
    fi
    gpus=$shared_gpu
  fi
  if [ -z "$gpus" ]; then
    if [ "$cpu_dry" = 1 ]; then gpus=4; else gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
  fi
  [ "${gpus:-0}" -ge 1 ] || { echo "multi_gpu_runs.sh: no GPU visible; give GPUS or --cpu-dry" >&2; exit 2; }
  [ -n "$iters" ] || iters=$([ "$cpu_dry" = 1 ] && echo 3 || echo 100)
  [ -n "$run_limit" ] || run_limit=$([ "$cpu_dry" = 1 ] && echo 60 || echo 240)
fi
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
plan="$out/runs.tsv"   # one line per run attempted: name group np model reference status exit seconds reason command

if [ "$summarize_only" = 0 ]; then
  export NCCL_NVLS_ENABLE=0
  export MEGADLM_BIN="$build/bin"
  export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  source "$root/scripts/lib/bench_run.sh"   # mpirun_flags (the launch itself: launch() below)
  bin="$build/bin"
  limit=$run_limit
  device=cuda
  if [ "$cpu_dry" = 1 ]; then
    device=cpu
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    mpirun_flags+=(--oversubscribe)
  fi
  # Several ranks per GPU: each rank starts through the wrapper (its NCCL_HOSTID and sockets).
  rank_wrapper=()
  if [ -n "$shared_gpu" ]; then
    rank_wrapper=("$root/scripts/shared_gpu_rank.sh")
    [ "$cpu_dry" = 1 ] || mpirun_flags+=(--oversubscribe)  # more ranks than cores is fine too
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    if [ "$cpu_dry" = 1 ]; then where="the CPU (--cpu-dry)"; else where="${ngpu:-0} GPU(s)"; fi
    echo "shared GPU: $shared_gpu ranks on $where" > "$out/shared_gpu"
  fi
  logs="$out/logs"
  touch "$plan"

  # launch NAME NP LAUNCHER FLAGS...: pretrain_difflm with $common and FLAGS on NP ranks under
  # `timeout`, LAUNCHER mpirun or torchrun (NP 1: the binary alone), through the shared-GPU
  # wrapper when set; writes logs/NAME.{jsonl,log} and echoes the exit status.
  launch() {
    local name=$1 np=$2 how=$3; shift 3
    rm -f "$logs/$name.jsonl"
    local prog=("$bin/pretrain_difflm" "${common[@]}" --metrics-jsonl "$logs/$name.jsonl" "$@")
    if [ "$np" = 1 ]; then
      timeout "$limit" "${prog[@]}" > "$logs/$name.log" 2>&1
    elif [ "$how" = torchrun ]; then
      # torchrun's own rendezvous on this host; --no-python: the wrapper is a shell script.
      timeout "$limit" torchrun --standalone --nproc_per_node="$np" --no-python \
        "${rank_wrapper[@]+"${rank_wrapper[@]}"}" "${prog[@]}" > "$logs/$name.log" 2>&1
    else
      timeout "$limit" mpirun -np "$np" "${mpirun_flags[@]}" "${rank_wrapper[@]+"${rank_wrapper[@]}"}" \
        "${prog[@]}" > "$logs/$name.log" 2>&1
    fi
    echo $?
  }

  # ---- the models. The tiny one: 4 layers (PP 2 x VPP 2), global batch 32 of micro-batches of
  # 4 (8 per GPU at DP 1, 1 at DP 8); --cpu-dry: 8 of 1, so that 2 CPU cores keep up.
  mbs=4 gbs=32 mbs_noise=2
  [ "$cpu_dry" = 1 ] && { mbs=1 gbs=8 mbs_noise=2; }
  # The padded vocabulary is a multiple of --make-vocab-size-divisible-by x TP (Megatron): 32 keeps
  # it at 128 for TP 1, 2 and 4, so that every layout trains the same model.
  # lr 3e-4 (not the config's 3e-3): the long curve must not be chaotic. On the CPU in fp32 the
  # micro-batch 4 / 2 twin stays within 2.2e-7 (loss) / 1.1e-6 (grad norm) relative for 100
  # iterations at 3e-4, against 2.4e-3 / 1.9e-2 at 3e-3 (docs/parallelism/equivalence.md).
  tiny=(@configs/tiny_dlm.args --num-layers 4 --make-vocab-size-divisible-by 32
        --micro-batch-size "$mbs" --global-batch-size "$gbs" --lr 3e-4 --min-lr 3e-5
        --difflm-varilen-prob 0 --log-interval 1 --eval-iters 0 --lr-warmup-iters 1
        --lr-decay-iters 1000 --distributed-timeout-minutes 1 --device "$device")
  tiny_moe=(--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-aux-loss-coeff 1e-2
            --moe-grouped-gemm)
  big=(@configs/megadlms_1.7b.args --mock-data --log-interval 1 --eval-iters 0 --lr-warmup-iters 1
       --lr-decay-style cosine --lr-decay-iters 1000 --distributed-timeout-minutes 1 --device "$device")
  fgmoe=(@configs/fine_grained_moe.args --mock-data --log-interval 1 --eval-iters 0 --lr-warmup-iters 1
         --lr-decay-iters 1000 --distributed-timeout-minutes 1 --device "$device")

  # record NAME GROUP NP MODEL REF STATUS EXIT SECONDS REASON COMMAND (tabs and newlines removed)
  record() {
    local clean=()
    for f in "$@"; do clean+=("$(printf '%s' "$f" | tr '\t\n' '  ')"); done
    grep -v -P "^\Q$1\E\t" "$plan" > "$plan.tmp" || true
    (IFS=$'\t'; echo "${clean[*]}") >> "$plan.tmp"
    mv "$plan.tmp" "$plan"
  }
  wanted() { [ -z "$only" ] || [[ $1 =~ $only ]]; }

  # run NAME GROUP NP MODEL REF FLAGS...: MODEL picks the flag set (tiny, tiny_moe, big, fgmoe).
  # The tiny models also write their first iteration's gradients (logs/NAME.grads). With
  # how=torchrun in the environment the ranks start under torchrun instead of mpirun.
  run() {
    local name=$1 group=$2 np=$3 model=$4 ref=$5; shift 5
    wanted "$name" || return 0
    local -a model_flags
    local launcher=${how:-mpirun}
    case $model in
      tiny) model_flags=("${tiny[@]}" --train-iters "$iters") ;;
      tiny_moe) model_flags=("${tiny[@]}" "${tiny_moe[@]}" --train-iters "$iters") ;;
      big) model_flags=("${big[@]}") ;;
      fgmoe) model_flags=("${fgmoe[@]}") ;;
    esac
    rm -rf "$logs/$name.grads"
    case $model in tiny|tiny_moe) model_flags+=(--save-gradients "$logs/$name.grads") ;; esac
    local starter="mpirun -np $np ${rank_wrapper[*]+${rank_wrapper[*]#"$root/"} }"
    [ "$launcher" = torchrun ] && starter="torchrun --standalone --nproc_per_node=$np --no-python ${rank_wrapper[*]+${rank_wrapper[*]#"$root/"} }"
    local cmd="NCCL_NVLS_ENABLE=0 $( [ "$np" = 1 ] || echo "$starter")bin/pretrain_difflm ${model_flags[*]} $*"
    if [ "$launcher" = torchrun ] && ! command -v torchrun > /dev/null; then
      record "$name" "$group" "$np" "$model" "$ref" skipped "" 0 "no torchrun on this machine (PyTorch's launcher)" "$cmd"
      echo "$name: skipped (no torchrun)"; return 0
    fi
    if [ "$np" -gt "$gpus" ]; then
      record "$name" "$group" "$np" "$model" "$ref" skipped "" 0 "needs $np GPUs, $gpus given" "$cmd"
      echo "$name: skipped (needs $np GPUs)"; return 0
    fi
    if [ "$cpu_dry" = 1 ] && { [ "$model" = big ] || [ "$model" = fgmoe ]; }; then
      record "$name" "$group" "$np" "$model" "$ref" skipped "" 0 "GPU-sized model: not in --cpu-dry" "$cmd"
      echo "$name: skipped (--cpu-dry)"; return 0
    fi
    # Can this build run it? (validation and not-supported items, no GPU touched)
    local dry
    dry=$("$bin/pretrain_difflm" "${model_flags[@]}" "$@" --dry-run --world-size "$np" 2>&1)
    if ! grep -q "runnable by this build" <<< "$dry"; then
      local why
      why=$(grep -m3 -E '^(  `|error: )' <<< "$dry" | grep -v '^error: invalid configuration' | sed 's/^ *//' | tr '\n' ' ')
      record "$name" "$group" "$np" "$model" "$ref" skipped "" 0 "this build cannot run it: ${why:-dry run failed}" "$cmd"
      echo "$name: skipped (${why:-dry run failed})"; return 0
    fi
    local common=("${model_flags[@]}") start=$SECONDS rc status
    rc=$(launch "$name" "$np" "$launcher" "$@")
    status=ok
    [ "$rc" = 0 ] || status=failed
    [ "$rc" = 124 ] && status=timeout
    record "$name" "$group" "$np" "$model" "$ref" "$status" "$rc" $((SECONDS - start)) \
      "$( [ "$status" = ok ] || tail -3 "$logs/$name.log" 2>/dev/null)" "$cmd"
    echo "$name: $status ($((SECONDS - start)) s)"
  }

  # fault NAME SIGNAL: DP 2 on the tiny model, a long run; after the second logged iteration one
  # rank (the highest, read from its environment) gets SIGNAL. Facts go to logs/NAME.fault.
  fault() {
    local name=$1 sig=$2
    wanted "$name" || return 0
    local flags=("${tiny[@]}" --train-iters 100000 --collective-log-dir "$logs/$name.collectives")
    local cmd="NCCL_NVLS_ENABLE=0 mpirun -np 2 ${rank_wrapper[*]+${rank_wrapper[*]#"$root/"} }bin/pretrain_difflm ${flags[*]} (then kill -$sig one rank)"
    if [ "$gpus" -lt 2 ]; then
      record "$name" fault 2 tiny "" skipped "" 0 "needs 2 GPUs" "$cmd"; return 0
    fi
    if [ "$sig" = STOP ] && [ "$cpu_dry" = 1 ]; then
      record "$name" fault 2 tiny "" skipped "" 0 \
        "the survivors wait one --distributed-timeout-minutes (>= 1 minute): longer than --cpu-dry's budget" "$cmd"
      echo "$name: skipped (--cpu-dry)"; return 0
    fi
    rm -rf "$logs/$name.collectives" "$logs/$name.jsonl" "$logs/$name.fault"
    mkdir -p "$logs/$name.collectives"
    local start=$SECONDS
    timeout "$limit" mpirun -np 2 "${mpirun_flags[@]}" "${rank_wrapper[@]+"${rank_wrapper[@]}"}" "$bin/pretrain_difflm" \
      "${flags[@]}" --metrics-jsonl "$logs/$name.jsonl" > "$logs/$name.log" 2>&1 &
    local job=$! victim="" victim_rank="" rc
    for _ in $(seq 600); do  # until two iterations are logged (or the job ends)
      local logged
      logged=$(grep -c '"kind": *"train"' "$logs/$name.jsonl" 2>/dev/null || true)
      [ "${logged:-0}" -ge 2 ] && break
      kill -0 "$job" 2>/dev/null || break
      sleep 0.2
    done
    # The ranks are pretrain_difflm processes below the timeout/mpirun pair; pick the highest rank.
    for p in $(pgrep -f "$bin/pretrain_difflm" || true); do
      local envr
      envr=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
      [ -n "$envr" ] || continue
      grep -q "$logs/$name.jsonl" "/proc/$p/cmdline" 2>/dev/null || continue
      if [ -z "$victim_rank" ] || [ "$envr" -gt "$victim_rank" ]; then victim=$p; victim_rank=$envr; fi
    done
    local sent=$SECONDS
    [ -n "$victim" ] && kill "-$sig" "$victim" 2>/dev/null
    wait "$job"; rc=$?
    [ -n "$victim" ] && [ "$sig" = STOP ] && kill -KILL "$victim" 2>/dev/null
    {
      echo "victim_rank=${victim_rank:-none}"
      echo "signal=$sig"
      echo "exit=$rc"
      echo "ended_s=$((SECONDS - sent))"
    } > "$logs/$name.fault"
    local status=ok
    [ -n "$victim" ] || status=failed
    [ "$rc" = 124 ] && status=timeout
    [ "$rc" = 0 ] && status=failed   # a job that survives a lost rank did not notice it
    record "$name" fault 2 tiny "" "$status" "$rc" $((SECONDS - start)) \
      "$( [ -n "$victim" ] || echo "no rank found to signal")" "$cmd"
    echo "$name: $status (exit $rc, ended $((SECONDS - sent)) s after SIG$sig to rank ${victim_rank:-none})"
  }

  # suite NAME NP BINARY [GTEST FLAGS...]: a GoogleTest SPMD suite of the build under mpirun
  # (the NCCL suite: collectives, and --tp-comm-overlap's rings on the side stream).
  suite() {
    local name=$1 np=$2 exe=$3; shift 3
    wanted "$name" || return 0
    local cmd="NCCL_NVLS_ENABLE=0 mpirun -np $np bin/$exe $*"
    if [ "$cpu_dry" = 1 ]; then
      record "$name" suite "$np" "" "" skipped "" 0 "an NCCL suite: not in --cpu-dry" "$cmd"; return 0
    fi
    if [ "$np" -gt "$gpus" ] || [ ! -x "$bin/$exe" ]; then
      record "$name" suite "$np" "" "" skipped "" 0 "needs $np GPUs and bin/$exe (carry it)" "$cmd"; return 0
    fi
    local start=$SECONDS rc status=ok
    timeout "$limit" mpirun -np "$np" "${mpirun_flags[@]}" "$bin/$exe" "$@" > "$logs/$name.log" 2>&1
    rc=$?
    [ "$rc" = 0 ] || status=failed
    [ "$rc" = 124 ] && status=timeout
    # Every test skipped (no 2 GPUs visible to it): not a pass. The suite says so with exit 77
    # (tests/support/spmd_main.cpp); a build from before that exits 0 with "PASSED ] 0 tests".
    local summary
    summary=$(sed 's/\x1b\[[0-9;]*m//g' "$logs/$name.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' | sort -u | tr '\n' ' ')
    [ "$rc" = 77 ] && status=skipped
    [ "$status" = ok ] && grep -q "PASSED  \] 0 tests" <<< "$summary" && status=skipped
    record "$name" suite "$np" "" "" "$status" "$rc" $((SECONDS - start)) "$summary" "$cmd"
    echo "$name: $status"
  }

  # planner NAME NP FLAGS...: the dry run's prediction, then the run's measured peak.
  planner() {
    local name=$1 np=$2; shift 2
    wanted "$name" || return 0
    local pred
    pred=$("$bin/pretrain_difflm" "${big[@]}" "$@" --dry-run --world-size "$np" 2>&1 |
           grep -i -m1 -E "predicted.*(memory|GB|GiB)" || true)
    if [ -z "$pred" ]; then
      record "$name" planner "$np" big "" skipped "" 0 "no memory planner in this build: --dry-run prints no predicted peak memory" ""
      echo "$name: skipped (no memory planner)"; return 0
    fi
    echo "$pred" > "$logs/$name.prediction"
    run "$name" planner "$np" big "" "$@" --train-iters 4 --global-batch-size $((16 * np / $(layout_model_ranks "$@")))
  }
  layout_model_ranks() {  # tp * pp * cp of a flag list (the data-parallel size divides the rest)
    local tp=1 pp=1 cp=1
    while [ $# -gt 0 ]; do
      case $1 in
        --tensor-model-parallel-size) tp=$2 ;; --pipeline-model-parallel-size) pp=$2 ;;
        --context-parallel-size) cp=$2 ;;
      esac
      shift
    done
    echo $((tp * pp * cp))
  }

  # ------------------------------------------------------------- 0. the NCCL suite
  suite nccl_suite 2 gpu_nccl
  # ------------------------------------------------------------- 1. equivalence (tiny model)
  run ref_1gpu equivalence 1 tiny ""
  run ref_1gpu_mbs2 noise 1 tiny ref_1gpu --micro-batch-size "$mbs_noise"
  # The same step in fp32 on the CPU: how far bf16 rounding alone moves the one-GPU gradients.
  # Layouts that move where bf16 rounds (TP, SP, CP, EP) are held to that, not to the micro-batch
  # pair (cuBLAS gives the same rows for either micro-batch, so that pair shows fp32 sum order only).
  run ref_1gpu_fp32 fp32ref 1 tiny ref_1gpu --device cpu
  run ref_moe_1gpu equivalence 1 tiny_moe ""
  run ref_moe_1gpu_mbs2 noise 1 tiny_moe ref_moe_1gpu --micro-batch-size "$mbs_noise"
  run ref_moe_1gpu_fp32 fp32ref 1 tiny_moe ref_moe_1gpu --device cpu
  run dp2 equivalence 2 tiny ref_1gpu
  run dp2_overlap equivalence 2 tiny ref_1gpu --overlap-grad-reduce
  run dp2_distopt equivalence 2 tiny ref_1gpu --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
  run tp2_sp equivalence 2 tiny ref_1gpu --tensor-model-parallel-size 2 --sequence-parallel
  run tp2_sp_overlap equivalence 2 tiny ref_1gpu --tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap
  run pp2_vpp2 equivalence 2 tiny ref_1gpu --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1
  for t in p2p all_gather a2a; do
    run "cp2_$t" equivalence 2 tiny ref_1gpu --context-parallel-size 2 --cp-comm-type "$t"
  done
  run cp2_a2a_p2p equivalence 2 tiny ref_1gpu --context-parallel-size 2 --cp-comm-type a2a+p2p \
    --hierarchical-context-parallel-sizes 1 2
  for d in allgather alltoall; do
    run "ep2_$d" equivalence 2 tiny_moe ref_moe_1gpu --expert-model-parallel-size 2 --moe-token-dispatcher-type "$d"
  done
  for s in optim optim_grads optim_grads_params; do
    run "fsdp2_$s" equivalence 2 tiny ref_1gpu --use-megatron-fsdp --data-parallel-sharding-strategy "$s"
  done
  run dp4_distopt equivalence 4 tiny ref_1gpu --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
  run tp4_sp_overlap equivalence 4 tiny ref_1gpu --tensor-model-parallel-size 4 --sequence-parallel --tp-comm-overlap
  run tp2_pp2 equivalence 4 tiny ref_1gpu --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2
  run tp2_cp2 equivalence 4 tiny ref_1gpu --tensor-model-parallel-size 2 --sequence-parallel --context-parallel-size 2
  run cp4 equivalence 4 tiny ref_1gpu --context-parallel-size 4
  run ep2_tp2_sp equivalence 4 tiny_moe ref_moe_1gpu --expert-model-parallel-size 2 --tensor-model-parallel-size 2 \
    --sequence-parallel --moe-token-dispatcher-type alltoall
  run fsdp4 equivalence 4 tiny ref_1gpu --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params
  run dp8_distopt equivalence 8 tiny ref_1gpu --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
  run tp2_pp2_dp2 equivalence 8 tiny ref_1gpu --tensor-model-parallel-size 2 --sequence-parallel \
    --pipeline-model-parallel-size 2 --use-distributed-optimizer
  run tp2_cp2_dp2 equivalence 8 tiny ref_1gpu --tensor-model-parallel-size 2 --sequence-parallel --context-parallel-size 2
  run cp8 equivalence 8 tiny ref_1gpu --context-parallel-size 8
  run ep4_tp2_sp equivalence 8 tiny_moe ref_moe_1gpu --expert-model-parallel-size 4 --tensor-model-parallel-size 2 \
    --sequence-parallel --moe-token-dispatcher-type alltoall
  run fsdp8 equivalence 8 tiny ref_1gpu --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params

  # ------------------------------------------------------------- 1b. the parallelism guide's lines
  # docs/parallelism/*.md's launch lines (tests/e2e/parallelism_guide_lines.sh) with 8 ranks on
  # the tiny model, each also under torchrun (same losses expected: torchrun_*).
  guide() {  # guide NAME MODEL REF FLAGS...: the mpirun run and its torchrun twin
    local name=$1 model=$2 ref=$3; shift 3
    run "$name" guide 8 "$model" "$ref" "$@"
    how=torchrun run "torchrun_${name#guide_}" launcher 8 "$model" "$name" "$@"
  }
  l32=(--num-layers 32)  # PP 8 x VPP 4: one layer per virtual stage
  if [ "$gpus" -ge 8 ]; then  # the 32-layer reference serves only the 8-rank PP line
    run guide_ref_32l equivalence 1 tiny "" "${l32[@]}"
    run guide_ref_32l_mbs2 noise 1 tiny guide_ref_32l "${l32[@]}" --micro-batch-size "$mbs_noise"
  fi
  guide guide_dp_no_shard tiny ref_1gpu --data-parallel-sharding-strategy no_shard
  guide guide_tp4_sp tiny ref_1gpu --tensor-model-parallel-size 4 --sequence-parallel
  guide guide_pp8_vpp4 tiny guide_ref_32l "${l32[@]}" --pipeline-model-parallel-size 8 \
    --virtual-pipeline-model-parallel-size 4
  # As written (levels 2 x 4 = 8 for CP 2) the line is refused: the refusal must say why.
  if wanted guide_cp2_as_written; then
    cpw=(--context-parallel-size 2 --cp-comm-type p2p --hierarchical-context-parallel-sizes 2 4)
    refusal=$("$bin/pretrain_difflm" "${tiny[@]}" --train-iters "$iters" "${cpw[@]}" --dry-run --world-size 8 2>&1)
    rc=$?
    if [ "$rc" = 2 ] && grep -q "multiply to 8, not to \`--context-parallel-size 2\`" <<< "$refusal"; then
      record guide_cp2_as_written refusal 8 tiny "" ok 2 0 "refused as expected: $(grep -m1 -o 'multiply to 8[^[]*' <<< "$refusal")" "bin/pretrain_difflm ... ${cpw[*]} --dry-run --world-size 8"
    else
      record guide_cp2_as_written refusal 8 tiny "" failed "$rc" 0 "expected exit 2 naming the levels' product; got exit $rc: $(tail -2 <<< "$refusal")" "bin/pretrain_difflm ... ${cpw[*]} --dry-run --world-size 8"
    fi
    echo "guide_cp2_as_written: exit $rc"
  fi
  guide guide_cp2_p2p_h21 tiny ref_1gpu --context-parallel-size 2 --cp-comm-type p2p \
    --hierarchical-context-parallel-sizes 2 1
  guide guide_ep4 tiny_moe ref_moe_1gpu --expert-model-parallel-size 4 --num-experts 8 --moe-grouped-gemm \
    --sequence-parallel
  guide guide_tp2_pp2_cp2_ep2 tiny_moe ref_moe_1gpu --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
    --context-parallel-size 2 --expert-model-parallel-size 2 --sequence-parallel
  guide guide_custom_fsdp tiny ref_1gpu --use-custom-fsdp --no-gradient-accumulation-fusion
  guide guide_torch_fsdp2 tiny ref_1gpu --use-torch-fsdp2 --no-gradient-accumulation-fusion

  # ------------------------------------------------------------- 2. scaling (1.7B shape)
  # Per-GPU work of the DP runs: 4 micro-batches of 4 x 2048 tokens (bench_dp.sh's).
  dopt=(--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
  run big_1gpu scaling 1 big "" --global-batch-size 16 --train-iters 8
  run big_1gpu_mbs2 noise 1 big big_1gpu --global-batch-size 16 --train-iters 8 --micro-batch-size 2
  for n in 2 4 8; do
    run "big_dp${n}_distopt" scaling "$n" big big_1gpu --global-batch-size $((16 * n)) --train-iters 8 "${dopt[@]}"
  done
  for t in 2 4; do
    run "big_tp${t}_sp" scaling "$t" big big_1gpu --global-batch-size 16 --train-iters 6 \
      --tensor-model-parallel-size "$t" --sequence-parallel
    run "big_tp${t}_sp_overlap" scaling "$t" big big_1gpu --global-batch-size 16 --train-iters 6 \
      --tensor-model-parallel-size "$t" --sequence-parallel --tp-comm-overlap
  done
  # 28 layers: PP 2 (14 per stage, VPP 2 = 7 per chunk), PP 4 (7 per stage, VPP 7 = 1 per chunk);
  # PP 8 does not divide 28 layers.
  run big_pp2 scaling 2 big big_1gpu --global-batch-size 16 --train-iters 6 --pipeline-model-parallel-size 2
  run big_pp2_vpp2 scaling 2 big big_1gpu --global-batch-size 16 --train-iters 6 --pipeline-model-parallel-size 2 \
    --num-layers-per-virtual-pipeline-stage 7
  run big_pp4 scaling 4 big big_1gpu --global-batch-size 16 --train-iters 6 --pipeline-model-parallel-size 4
  run big_pp4_vpp7 scaling 4 big big_1gpu --global-batch-size 16 --train-iters 6 --pipeline-model-parallel-size 4 \
    --num-layers-per-virtual-pipeline-stage 1
  long() { echo --seq-length "$1" --max-position-embeddings "$1" --micro-batch-size 1 --global-batch-size "$2" --train-iters 4; }
  run big_cp1_32k scaling 1 big "" $(long 32768 1)
  for c in 2 4 8; do
    run "big_cp${c}_32k" scaling "$c" big big_cp1_32k $(long 32768 1) --context-parallel-size "$c"
  done
  run big_cp8_64k scaling 8 big big_cp1_32k $(long 65536 1) --context-parallel-size 8
  run big_cp8_128k scaling 8 big big_cp1_32k $(long 131072 1) --context-parallel-size 8
  run fgmoe_ep1 scaling 1 fgmoe "" --global-batch-size 4 --train-iters 6
  run fgmoe_ep8 scaling 8 fgmoe fgmoe_ep1 --global-batch-size 32 --train-iters 6 --expert-model-parallel-size 8
  run big_fsdp8 scaling 8 big big_1gpu --global-batch-size 128 --train-iters 8 --use-megatron-fsdp \
    --data-parallel-sharding-strategy optim_grads_params

  # ------------------------------------------------------------- 3. planner
  planner plan_dp2 2 "${dopt[@]}"
  planner plan_tp2_sp 2 --tensor-model-parallel-size 2 --sequence-parallel
  planner plan_pp2 2 --pipeline-model-parallel-size 2
  planner plan_tp2_dp2 4 --tensor-model-parallel-size 2 --sequence-parallel "${dopt[@]}"
  planner plan_tp2_pp2 4 --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2
  planner plan_dp8 8 "${dopt[@]}"
  planner plan_tp2_pp2_dp2 8 --tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2 "${dopt[@]}"

  # ------------------------------------------------------------- 4. faults under NCCL
  fault fault_kill KILL
  fault fault_stop STOP
fi

# ------------------------------------------------------------- results
# compare_gradients.py needs numpy: the first python3 that has it (a pyenv python3 may not).
numpy_python=""
for py in python3 /usr/bin/python3; do
  if command -v "$py" > /dev/null && "$py" -c "import numpy" 2> /dev/null; then numpy_python=$(command -v "$py"); break; fi
done
python3 - "$out" "$plan" "$root/scripts/compare_gradients.py" "$numpy_python" <<'PY'
import json, os, re, statistics, subprocess, sys
out, plan, compare_gradients, numpy_python = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
shared = open(os.path.join(out, "shared_gpu")).read().strip() if os.path.exists(os.path.join(out, "shared_gpu")) else None
logs = os.path.join(out, "logs")
cols = ["run", "group", "np", "model", "reference", "status", "exit", "seconds", "reason", "command"]
runs = []
if os.path.exists(plan):
    for line in open(plan):
        parts = [p.strip() for p in line.rstrip("\n").split("\t")]
        if len(parts) == len(cols): runs.append(dict(zip(cols, parts)))
order = {name: i for i, name in enumerate(r["run"] for r in runs)}
by = {r["run"]: r for r in runs}

def rows(name):
    p = os.path.join(logs, name + ".jsonl")
    if not os.path.exists(p): return []
    r = []
    for l in open(p):
        try: x = json.loads(l)
        except ValueError: continue
        if x.get("kind", "train") == "train" and "lm_loss" in x: r.append(x)
    return r

def max_rel(a, b, key):
    d = [abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(a, b) if y.get(key)]
    return max(d) if d else None

def steady(r):
    return r[2:] if len(r) > 3 else r[1:] if len(r) > 1 else r

# The measured noise: two one-GPU runs of the same function, other micro-batch sizes. The MoE
# pair's curves are not noise alone (the aux loss is per micro-batch): MoE curves take the dense
# noise; the MoE pair serves the MoE gradients (per tensor).
# A run shorter than its reference (e.g. CP 8 with fewer --iters) is compared over its own
# iterations, against the noise of the same prefix.
noise, noise_series, grad_noise, grad_noise_fp32, noise_series_fp32 = {}, {}, {}, {}, {}
for r in runs:
    if r["group"] == "noise" and r["status"] == "ok":
        a, b = rows(r["run"]), rows(r["reference"])
        if a and b and r["model"] != "tiny_moe":
            noise_series[r["reference"]] = [max(abs(x["lm_loss"] - y["lm_loss"]) / abs(y["lm_loss"]),
                                                abs(x["grad_norm"] - y["grad_norm"]) / abs(y["grad_norm"]))
                                            for x, y in zip(a, b)]
            noise[r["reference"]] = max(noise_series[r["reference"]])
        grad_noise[r["reference"]] = r["run"]
    if r["group"] == "fp32ref" and r["status"] == "ok":
        grad_noise_fp32[r["reference"]] = r["run"]
        a, b = rows(r["run"]), rows(r["reference"])
        if a and b and r["model"] != "tiny_moe":
            noise_series_fp32[r["reference"]] = [max(abs(x["lm_loss"] - y["lm_loss"]) / abs(y["lm_loss"]),
                                                     abs(x["grad_norm"] - y["grad_norm"]) / abs(y["grad_norm"]))
                                                 for x, y in zip(a, b)]

def moves_roundings(r):
    """TP, SP, CP and EP change where bf16 rounds; DP, the distributed optimizer, FSDP and PP do not."""
    return re.search(r"--(tensor|expert)-model-parallel-size [2-9]|--context-parallel-size [2-9]|--sequence-parallel",
                     r["command"]) is not None

def noise_over(ref, n, fp32=False):
    series = noise_series_fp32 if fp32 else noise_series
    s = series.get(ref, series.get("ref_1gpu"))
    return max(s[:n]) if s else None

def grads(name):
    p = os.path.join(logs, name + ".grads", "gradients.safetensors")
    return p if os.path.exists(p) else None

def compare_grads(res, mine, ref, noise_pair, floor):
    """scripts/compare_gradients.py on two step-1 dumps; its verdict into res."""
    a, b = grads(mine), grads(ref)
    if not a or not b:
        res["grad_equal"] = None
        res["grad_note"] = "no step-1 gradients of " + (mine if not a else ref)
        return
    if not numpy_python:
        res["grad_equal"] = None
        res["grad_note"] = "no python3 with numpy here: step-1 gradients not compared"
        return
    js = os.path.join(logs, mine + ".gradcmp.json")
    if os.path.exists(js): os.remove(js)
    cmd = [numpy_python, compare_gradients, a, b, "--floor", str(floor), "--json", js, "--quiet"]
    if noise_pair and grads(noise_pair[0]) and grads(noise_pair[1]):
        cmd += ["--noise", grads(noise_pair[0]), grads(noise_pair[1])]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if not os.path.exists(js):
        res["grad_equal"] = None
        res["grad_note"] = "compare_gradients.py failed: " + (p.stderr or p.stdout).strip()[-300:]
        return
    v = json.load(open(js))
    res["grad_equal"] = v["equal"]
    res["grad_rel_diff"] = v["whole_rel_diff"]
    res["grad_beyond"] = v["beyond"]
    res["grad_worst"] = v["worst"]
    res["grad_noise_pair"] = list(noise_pair) if "--noise" in cmd else None

results = []
for r in runs:
    res = {"run": r["run"], "group": r["group"], "np": int(r["np"]), "model": r["model"],
           "reference": r["reference"] or None, "status": r["status"],
           "exit": int(r["exit"]) if r["exit"] else None, "seconds": int(r["seconds"] or 0),
           "reason": r["reason"] or None, "command": r["command"]}
    mine = rows(r["run"]) if r["status"] == "ok" else []
    if shared: res["shared_gpu"] = shared
    if r["status"] == "ok" and r["group"] not in ("fault", "suite", "refusal"):
        res["iterations"] = len(mine)
        if not mine:
            res["status"], res["reason"] = "failed", "no metrics rows in logs/%s.jsonl" % r["run"]
    if mine:
        s = steady(mine)
        res["tokens_per_s_per_gpu"] = statistics.median(x["tokens_per_s"] for x in s) / res["np"]
        res["mfu"] = statistics.median(x.get("mfu", 0) for x in s)
        res["peak_mem_gb"] = max(x.get("peak_mem_gb", 0) for x in mine)
        mem = [x for x in (json.loads(l) for l in open(os.path.join(logs, r["run"] + ".jsonl")) if l.strip())
               if x.get("kind") == "memory"]
        if mem: res["peak_mem_gb_per_stage"] = mem[-1]["peak_mem_gb_per_stage"]
    ref = by.get(r["reference"]) if r["reference"] else None
    theirs = rows(r["reference"]) if ref and ref["status"] == "ok" else []
    if r["status"] == "ok" and ref and ref["status"] == "ok" and r["group"] in ("equivalence", "guide"):
        # Step-1 gradients against the reference, each tensor within 3 x its noise (floor 1e-5).
        # Layouts that move bf16 roundings (TP, SP, CP, EP): the fp32 pair (ref_*_fp32, ref); the
        # others (DP, distributed optimizer, FSDP, PP): the micro-batch pair.
        pair_of = grad_noise_fp32 if moves_roundings(r) and r["reference"] in grad_noise_fp32 else grad_noise
        compare_grads(res, r["run"], r["reference"],
                      (pair_of[r["reference"]], r["reference"]) if r["reference"] in pair_of else None, 1e-5)
    if r["status"] == "ok" and ref and ref["status"] == "ok" and r["group"] == "launcher":
        compare_grads(res, r["run"], r["reference"], None, 1e-6)  # the same run, another launcher
    if mine and theirs and r["group"] == "launcher":
        res["max_rel_loss_diff"] = max_rel(mine, theirs, "lm_loss")
        res["max_rel_grad_norm_diff"] = max_rel(mine, theirs, "grad_norm")
        res["bound"] = 1e-6
        res["equal"] = (len(mine) == len(theirs) and res["max_rel_loss_diff"] is not None and
                        res["max_rel_loss_diff"] <= 1e-6 and (res["max_rel_grad_norm_diff"] or 0) <= 1e-6)
    if mine and theirs and r["group"] in ("equivalence", "noise", "guide"):
        res["max_rel_loss_diff"] = max_rel(mine, theirs, "lm_loss")
        res["max_rel_grad_norm_diff"] = max_rel(mine, theirs, "grad_norm")
        if r["group"] in ("equivalence", "guide"):
            # MoE: a smaller micro-batch changes the aux loss (per micro-batch statistics), so
            # the MoE runs take the dense model's noise.
            # Layouts that move bf16 roundings: the one-GPU run's distance from fp32 on the CPU.
            n = noise_over(r["reference"], len(mine), fp32=moves_roundings(r))
            if n is None: n = noise_over(r["reference"], len(mine))
            res["noise"] = n
            res["bound"] = max(3 * (n or 0), 1e-5)
            res["equal"] = (len(mine) <= len(theirs) and
                            res["max_rel_loss_diff"] is not None and res["max_rel_loss_diff"] <= res["bound"] and
                            res["max_rel_grad_norm_diff"] is not None and res["max_rel_grad_norm_diff"] <= res["bound"])
    if (mine and theirs and r["group"] == "scaling" and r["reference"] in noise and
            mine[0].get("global_batch_size") == theirs[0].get("global_batch_size")):
        # The 1.7B shape's equivalence: TP, PP, CP runs see the 1-GPU run's samples.
        res["max_rel_loss_diff"] = max_rel(mine, theirs, "lm_loss")
        res["max_rel_grad_norm_diff"] = max_rel(mine, theirs, "grad_norm")
        res["noise"] = noise[r["reference"]]
        res["bound"] = max(3 * res["noise"], 1e-5)
        res["equal"] = (res["max_rel_loss_diff"] is not None and res["max_rel_loss_diff"] <= res["bound"] and
                        res["max_rel_grad_norm_diff"] is not None and res["max_rel_grad_norm_diff"] <= res["bound"])
    if mine and theirs and r["group"] == "scaling" and "tokens_per_s_per_gpu" in res:
        base = statistics.median(x["tokens_per_s"] for x in steady(theirs))
        res["scaling_efficiency"] = res["tokens_per_s_per_gpu"] / base
        m = re.search(r"--pipeline-model-parallel-size (\d+)", r["command"])
        if m:
            p = int(m.group(1))
            v = re.search(r"--num-layers-per-virtual-pipeline-stage (\d+)", r["command"])
            chunks = (28 // p) // int(v.group(1)) if v else 1
            mbs = 4 * 16 // 16  # global batch 16 / micro-batch 4 = 4 micro-batches
            t1 = statistics.median(x["elapsed_ms"] for x in steady(theirs))
            tp_ = statistics.median(x["elapsed_ms"] for x in steady(mine))
            res["bubble_measured"] = tp_ / (t1 / p) - 1
            res["bubble_estimate"] = (p - 1) / (mbs * chunks)
    if r["group"] == "planner":
        p = os.path.join(logs, r["run"] + ".prediction")
        if os.path.exists(p): res["prediction"] = open(p).read().strip()
    if r["group"] == "fault" and r["status"] != "skipped":
        facts = {}
        p = os.path.join(logs, r["run"] + ".fault")
        if os.path.exists(p):
            for l in open(p):
                k, _, v = l.strip().partition("=")
                facts[k] = v
        log = open(os.path.join(logs, r["run"] + ".log"), errors="replace").read() if os.path.exists(os.path.join(logs, r["run"] + ".log")) else ""
        res["victim_rank"] = facts.get("victim_rank")
        res["ended_s"] = int(facts["ended_s"]) if facts.get("ended_s", "").isdigit() else None
        vr = facts.get("victim_rank", "none")
        res["names_rank"] = bool(re.search(r"rank %s\b" % re.escape(vr), log)) if vr != "none" else False
        g = re.search(r"(\w+) #(\d+) \(([^)]*)\) on group '([^']+)' \(rank (\d+) of (\d+)", log)
        res["names_group_op"] = ("%s #%s on group '%s', rank %s" % (g.group(1), g.group(2), g.group(4), g.group(5))) if g else None
        cdir = os.path.join(logs, r["run"] + ".collectives")
        files = sorted(os.listdir(cdir)) if os.path.isdir(cdir) else []
        res["collective_log"] = [os.path.join("logs", r["run"] + ".collectives", f) for f in files]
        if r["run"] == "fault_stop":
            ok = res["names_group_op"] is not None and bool(files)
        else:
            ok = res["names_rank"]
        if res["status"] == "ok" and not ok:
            res["status"] = "failed"
            res["reason"] = "the log does not name " + ("the group, operation and rank with a collectives file" if r["run"] == "fault_stop" else "the lost rank")
    results.append(res)

with open(os.path.join(out, "results.jsonl"), "w") as f:
    for res in results: f.write(json.dumps(res) + "\n")

def fmt(v, pct=False):
    if v is None: return "-"
    if isinstance(v, bool): return "yes" if v else "**no**"
    if isinstance(v, float): return ("%.1f%%" % (100 * v)) if pct else ("%.2e" % v if abs(v) < 0.01 and v != 0 else "%.3g" % v)
    return str(v)
speed = "†" if shared else ""
lines = ["# multi-GPU runs", "",
         "Curves (loss diff, grad-norm diff, bound, equal): the largest per-iteration relative difference "
         "from the reference; bound 3 x the measured noise (the largest relative loss / grad-norm "
         "difference between two 1-GPU runs that differ only in --micro-batch-size), at least 1e-5; "
         "torchrun twins (group launcher): 1e-6 from their mpirun run.",
         "Step-1 gradients (grads): scripts/compare_gradients.py, every tensor within 3 x the noise pair's "
         "relative difference of that tensor (floor 1e-5); the column gives the whole model's relative "
         "difference and yes/**no** (the tensors beyond their bound in the notes).", ""]
if shared:
    lines += ["† " + shared + ": the speed columns (tokens/s/GPU, MFU, scaling) mean nothing here.", ""]
for n, v in sorted(noise.items()): lines.append("- measured noise against `%s`: %s" % (n, fmt(v)))
lines += ["", "| run | group | GPUs | status | s | loss diff | grad-norm diff | bound | equal | grads | tokens/s/GPU%s | MFU%s | peak GB | scaling%s | notes |" % (speed, speed, speed),
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in results:
    notes = r.get("reason") or ""
    if r["group"] == "fault" and r["status"] != "skipped":
        notes = "rank %s, ended %s s after the signal; names rank: %s; %s; %d collectives file(s)" % (
            r.get("victim_rank"), r.get("ended_s"), fmt(r.get("names_rank")), r.get("names_group_op") or "no timeout message",
            len(r.get("collective_log") or []))
    if "bubble_measured" in r: notes = "bubble %.3f (estimate %.3f)" % (r["bubble_measured"], r["bubble_estimate"])
    if "prediction" in r: notes = r["prediction"]
    g = "-"
    if r.get("grad_equal") is not None:
        g = "%s %s" % (fmt(r.get("grad_rel_diff")), fmt(r["grad_equal"]))
        if r.get("grad_beyond"): notes = ("beyond their bound: " + ", ".join(r["grad_beyond"][:4]) +
                                          (" (+%d)" % (len(r["grad_beyond"]) - 4) if len(r["grad_beyond"]) > 4 else "") +
                                          ("; " + notes if notes else ""))
    elif r.get("grad_note"): notes = r["grad_note"] + ("; " + notes if notes else "")
    lines.append("| %s | %s | %d | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        r["run"], r["group"], r["np"], r["status"], r["seconds"], fmt(r.get("max_rel_loss_diff")),
        fmt(r.get("max_rel_grad_norm_diff")), fmt(r.get("bound")), fmt(r.get("equal")), g,
        "%.0f" % r["tokens_per_s_per_gpu"] if "tokens_per_s_per_gpu" in r else "-",
        fmt(r.get("mfu"), True) if r.get("mfu") else "-", fmt(r.get("peak_mem_gb")),
        fmt(r.get("scaling_efficiency"), True), notes.replace("|", "/")))
open(os.path.join(out, "results.md"), "w").write("\n".join(lines) + "\n")
counts = {}
for r in results: counts[r["status"]] = counts.get(r["status"], 0) + 1
bad = [r["run"] for r in results if r.get("equal") is False]
bad_grads = [r["run"] for r in results if r.get("grad_equal") is False]
print("results: %s in %s/results.jsonl; %s; %s" % (", ".join("%d %s" % (v, k) for k, v in sorted(counts.items())), out,
      "not equal: " + ", ".join(bad) if bad else "every compared curve equal within its bound",
      "step-1 gradients not equal: " + ", ".join(bad_grads) if bad_grads else "every compared run's step-1 gradients within their bounds"))
PY
