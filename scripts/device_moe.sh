#!/usr/bin/env bash
# Everything mixture of experts needs proven on one GPU, from a carried build folder
# (BUILD/bin and BUILD/lib; nothing is compiled here), in about 2 minutes of GPU time:
#   parity  gpu_parity MoeParity.*: every MoE kernel against the CPU (router top-k for every score
#           mode, statistics and aux/z gradients, dispatch plan, permute/unpermute, grouped GEMM
#           with empty and full groups) and a whole MoE training step CUDA vs CPU         (~10 s)
#   ops     megadlm_bench ops: the grouped GEMMs' own TFLOP/s at the benchmark's shape (64 experts,
#           8192 tokens top-8, fc1 2x768 / fc2 768 wide, forward, dgrad, wgrad), router, permutes (~15 s)
#   train   scripts/bench_moe.sh: the fine-grained MoE (configs/fine_grained_moe.args: 12 layers,
#           hidden 2048, 64 experts top-8 of 768, seq 2048, mbs 4, bf16, dropless) beside the
#           PyTorch peer (peer_torch_dlm.py --layers 12 --experts 64 --topk 8 --expert-ffn 768
#           --compile 0 --params amp) in the same call                                  (~60 s)
#   hf      a tiny MoE trained 2 steps on CUDA, saved, exported as Qwen3-MoE and --verify'd
#           against transformers (fp32, both on the CPU: exact to 1e-4)                     (~20 s)
#
#   scripts/device_moe.sh BUILD OUT [STAGES...]      STAGES: parity ops train hf (default: all)
#
# OUT gets summary.txt (short tables), bench_moe.json and bench_moe.md (the benchmark), parity.xml,
# and results.tgz (every log and the report's inputs; packed after each stage, so a stage cut off
# by the call's limit keeps the earlier ones). Back on the dev machine:
#   mkdir r && tar xzf OUT/results.tgz -C r && python3 scripts/moe_bench_report.py r --update docs/benchmarks.md
# Environment: PEER (the peer script; default: the first of BUILD/.., BUILD, the repo root that
# has peer_torch_dlm.py), ITERS (megadlm iterations, 20;
# the first 6 warm up: new expert row counts still meet cuBLASLt heuristics early on),
# PEER_STEPS (timed peer steps, 8), PEER_WARMUP (3), DEADLINE_S (skip stages that would start
# after this many seconds; default 150), HF_DEVICE (where the tiny MoE of `hf` trains, cuda).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: scripts/device_moe.sh BUILD OUT [parity] [ops] [train] [hf]}" && pwd)
final=${2:?usage: scripts/device_moe.sh BUILD OUT [STAGES...]}
shift 2
stages=${*:-parity ops train hf}
mkdir -p "$final"
final=$(cd "$final" && pwd)
bin=$build/bin
work=${WORK_DIR:-/tmp/device_moe_work}
rm -rf "$work"
mkdir -p "$work"
pack() { tar czf "$final/results.tgz" -C "$work" --exclude='ckpt*' . 2>/dev/null; }
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
deadline=${DEADLINE_S:-150}
if [ -z "${PEER:-}" ]; then
  for p in "$build/.." "$build" "$root"; do
    [ -f "$p/peer_torch_dlm.py" ] && { PEER=$(cd "$p" && pwd)/peer_torch_dlm.py; break; }
  done
fi
export PEER=${PEER:-}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  ldd "$build/lib/libmegadlm.so" 2>/dev/null | grep -E "cudnn|cublas|nccl|cudart"
  echo "peer: ${PEER:-not found}"
} > "$work/machine.txt" 2>&1
cat "$work/machine.txt"
summary="$final/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

for stage in $stages; do
  if [ "$SECONDS" -ge "$deadline" ]; then note "skipped $stage: past DEADLINE_S=$deadline ($SECONDS s)"; continue; fi
  case $stage in
    parity)
      timeout 90 "$bin/gpu_parity" --gtest_filter='MoeParity.*' --gtest_output=xml:"$final/parity.xml" \
        > "$work/parity.log" 2>&1
      note "parity MoeParity.*: exit $? ($SECONDS s)"
      grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|\[parity moe\]|Failure" "$work/parity.log" | head -30 | tee -a "$summary"
      ;;
    ops)
      rm -f "$work/moe_ops.jsonl"
      for filter in grouped_gemm moe_; do
        timeout 60 "$bin/megadlm_bench" ops --op "$filter" --out "$work/moe_ops.jsonl" > "$work/ops_$filter.log" 2>&1
        note "ops $filter: exit $? ($SECONDS s)"
      done
      ;;
    train)
      MEGADLM_BIN=$bin timeout 200 bash "$root/scripts/bench_moe.sh" "$work" "${ITERS:-20}" 4 > "$work/train.log" 2>&1
      note "train (bench_moe.sh, gbs 4 = the peer's step): exit $? ($SECONDS s)"
      grep -E "^(megadlm|peer|speed-up|memory):|exit" "$work/train.log" | tee -a "$summary"
      ;;
    hf)
      tiny=(@"$root/configs/tiny_dlm.args" --device "${HF_DEVICE:-cuda}" --train-iters 2 --log-interval 1 --eval-iters 0
            --lr-warmup-iters 1 --lr-decay-iters 10
            --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 48 --moe-layer-freq "[1,0]"
            --moe-grouped-gemm --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2)
      rm -rf "$work/ckpt_tiny_moe" "$work/ckpt_tiny_moe_hf"
      timeout 60 "$bin/pretrain_difflm" "${tiny[@]}" --save "$work/ckpt_tiny_moe" --save-interval 2 > "$work/hf.log" 2>&1
      note "hf: tiny MoE 2 steps (${HF_DEVICE:-cuda}) + save: exit $? ($SECONDS s)"
      timeout 120 "$bin/convert_checkpoint" --to-hf --load "$work/ckpt_tiny_moe" --out "$work/ckpt_tiny_moe_hf" \
        --verify --verify-device cpu --hf-device cpu --verify-batch 2 --verify-seq 64 \
        --hf-verify-script "$root/scripts/hf_verify.py" >> "$work/hf.log" 2>&1
      note "hf: Qwen3-MoE export + --verify (fp32, CPU): exit $? ($SECONDS s)"
      grep -E "^verify:|Error|error" "$work/hf.log" | head -8 | tee -a "$summary"
      [ -f "$work/ckpt_tiny_moe_hf/config.json" ] && cp "$work/ckpt_tiny_moe_hf/config.json" "$work/hf_config.json"
      ;;
    *) echo "unknown stage $stage (parity, ops, train, hf)"; exit 2 ;;
  esac
  pack
done

# The benchmark's JSON and Markdown (whatever of megadlm, the peer and the ops rows exists).
it=${ITERS:-20}
python3 "$root/scripts/moe_bench_report.py" "$work" --skip $(( it >= 20 ? 6 : it > 10 ? 4 : 1 )) > "$work/report.log" 2>&1
note "report: exit $?"
for f in bench_moe.json bench_moe.md; do [ -f "$work/$f" ] && cp "$work/$f" "$final/$f"; done
[ -f "$work/bench_moe.md" ] && cat "$work/bench_moe.md" >> "$summary"
pack
note "device_moe.sh: done in $SECONDS s"
exit 0
