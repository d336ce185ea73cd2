#!/usr/bin/env bash
# cuDNN attention on one GPU: megadlm_bench attention rows with the heuristic engine and with
# MEGADLM_CUDNN_AUTOTUNE=1, the attention parity suites, and the 1.7B at seq 8192 with and without
# autotuning. Usage: scripts/device_attention_check.sh BUILD   (results under $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: device_attention_check.sh BUILD}; export LD_LIBRARY_PATH=$PWD/$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0; S=$SECONDS
$B/bin/megadlm_bench ops --op attention > $OUT/att_default.txt 2>&1; echo "att default $((SECONDS-S))"
MEGADLM_CUDNN_AUTOTUNE=1 $B/bin/megadlm_bench ops --op attention > $OUT/att_autotune.txt 2>&1; echo "att autotune $((SECONDS-S))"
timeout 120 $B/bin/gpu_parity --gtest_filter='AttentionParity.*:ElementwiseParity.*' > $OUT/parity.log 2>&1; echo "parity rc $? $((SECONDS-S))"; grep -E "FAILED|PASSED" $OUT/parity.log | head
for tune in 0 1; do
  if [ $tune = 1 ]; then export MEGADLM_CUDNN_AUTOTUNE=1; fi
  $B/bin/pretrain_difflm @configs/megadlms_1.7b.args --mock-data --device cuda --seq-length 8192 --max-position-embeddings 8192 --micro-batch-size 1 --global-batch-size 8 --train-iters 6 --log-interval 1 --eval-iters 0 --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000 > $OUT/s8192_tune$tune.log 2>&1
  echo "s8192 tune $tune $((SECONDS-S))"; grep -E "iteration +[3-6]/" $OUT/s8192_tune$tune.log | sed 's/.*elapsed time per iteration (ms): \([0-9.]*\).*tokens\/s[^:]*: \([0-9.]*\).*/\1 ms \2 tok\/s/' 
done
grep "autotune" $OUT/s8192_tune1.log | head
