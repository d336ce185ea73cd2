#!/usr/bin/env bash
# Short packed documents on one GPU: where the time goes and what else reaches them. Stages
# (all by default, or those named after BUILD):
#   parity   the attention and fused parity suites (cuDNN against the CPU reference);
#   rows     megadlm_bench's attention rows (dense, packed documents of ~256 / exactly 256 /
#            ~1024 tokens, B32 S256 dense);
#   knobs    the cuDNN document rows with MEGADLM_CUDNN_KNOBS=1: every knob value of the
#            heuristics' engines timed on the row's first call (choices and times on stderr);
#   cudnn919 the cuDNN rows and the attention parity suite on the cuDNN that PyTorch's wheel
#            ships (LD_LIBRARY_PATH), next to the system's;
#   torch    PyTorch's kernels at the same shapes (scripts/bench_attention_torch.py);
#   e2e      the 1.7B at seq 2048 (mbs 4, gbs 32, 8 iterations) on synthetic corpora of ~256-
#            and ~1024-token documents (scripts/make_synthetic_corpus.py), with and without
#            --reset-attention-mask --reset-position-ids --cut-off-varlen-to-seqlen.
# Usage: scripts/device_attention_short_docs.sh BUILD [STAGE...]   (BUILD holds bin/ and lib/;
# everything goes into $OUT/results.tgz, the summary also to stdout)
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: device_attention_short_docs.sh BUILD [STAGE...]}
shift
STAGES=${*:-parity rows knobs cudnn919 torch e2e}
export LD_LIBRARY_PATH=$PWD/$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
R=$(mktemp -d)
S=$SECONDS
DOC_ROWS=attention_fwd_cudnn,attention_bwd_cudnn,documents_cudnn,documents256x_cudnn,documents1k_cudnn,s256_cudnn
stage() { echo "== $1 done at $((SECONDS - S)) s"; tar czf "$OUT/results.tgz" -C "$R" .; }
rows() { grep -E "^attention_" "$1" | grep -v "PASS  err" | awk '{printf "%-36s %s err %s  %s ms  %s TFLOP/s\n", $1, $(NF-5), $(NF-4), $(NF-3), $(NF-2)}'; }
for st in $STAGES; do case $st in
parity)
  timeout 240 $B/bin/gpu_parity --gtest_filter='AttentionParity.*:FusedParity.*' > "$R/parity.log" 2>&1
  echo "parity rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran" "$R/parity.log" | head -20 ;;
rows)
  timeout 200 $B/bin/megadlm_bench ops --op attention_ --out "$R/attention.jsonl" > "$R/attention.txt" 2>&1
  echo "rows rc $?"; rows "$R/attention.txt" | grep -E "documents|s256|_cudnn " ;;
knobs)
  for row in documents_cudnn documents256x_cudnn documents1k_cudnn s256_cudnn; do
    for dir in fwd bwd; do
      MEGADLM_CUDNN_KNOBS=1 timeout 90 $B/bin/megadlm_bench ops --op "attention_${dir}_$row" > "$R/knobs_${dir}_$row.txt" 2>&1
      echo "knobs $dir $row rc $?"; grep -E "autotune \((forward|backward) b (16|32|64) " "$R/knobs_${dir}_$row.txt" | cut -c1-300
    done
  done ;;
cudnn919)
  D=$(python3 -c "import nvidia.cudnn as c, os; print(os.path.join(list(c.__path__)[0], 'lib'))" 2>/dev/null)
  echo "PyTorch's cuDNN: ${D:-not found}"
  for lib in "$D/libcudnn.so.9" libcudnn.so.9; do
    python3 -c "import ctypes, sys; print(sys.argv[1], ctypes.CDLL(sys.argv[1]).cudnnGetVersion())" "$lib"
  done
  if [ -n "$D" ] && [ -d "$D" ]; then
    LD_LIBRARY_PATH=$PWD/$B/lib:$D:/usr/local/cuda/lib64 timeout 150 $B/bin/megadlm_bench ops --op "$DOC_ROWS" > "$R/cudnn919.txt" 2>&1
    echo "cudnn919 rows rc $?"; grep -i "cudnn" "$R/cudnn919.txt" | grep -v "^attention" | head -3; rows "$R/cudnn919.txt"
    timeout 150 $B/bin/megadlm_bench ops --op "$DOC_ROWS" > "$R/cudnn914.txt" 2>&1
    echo "cudnn914 rows rc $?"; rows "$R/cudnn914.txt"
    LD_LIBRARY_PATH=$PWD/$B/lib:$D:/usr/local/cuda/lib64 timeout 200 $B/bin/gpu_parity --gtest_filter='AttentionParity.*' > "$R/parity919.log" 2>&1
    echo "parity on PyTorch's cuDNN rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$R/parity919.log" | head
  fi ;;
torch)
  PYTHONUNBUFFERED=1 timeout 150 python3 scripts/bench_attention_torch.py "$R/attention_torch.json" > "$R/attention_torch.txt" 2>&1
  echo "torch rc $?"; cat "$R/attention_torch.txt" ;;
e2e)
  for scale in 1 4; do
    python3 scripts/make_synthetic_corpus.py "$R/docs$scale" --tokens 3000000 --scale $scale
    for packed in 0 1; do
      flags=""; [ $packed = 1 ] && flags="--reset-attention-mask --reset-position-ids --cut-off-varlen-to-seqlen"
      log="$R/e2e_docs${scale}_packed$packed.log"
      timeout 150 $B/bin/pretrain_difflm @configs/megadlms_1.7b.args --device cuda --data-path "$R/docs$scale" \
        --tokenizer-type NullTokenizer --split 100,0,0 --eval-iters 0 --global-batch-size 32 --train-iters 8 \
        --log-interval 1 --lr-warmup-iters 1 --lr-decay-style cosine --lr-decay-iters 1000 $flags > "$log" 2>&1
      echo "e2e documents x$scale packed $packed rc $?"
      grep -E "iteration +[3-8]/" "$log" | sed -E 's/.*elapsed time per iteration \(ms\): ([0-9.]+).*lm loss: ([0-9.E+-]+).*/\1 ms, loss \2/' | tr '\n' ';'; echo
    done
    rm -f "$R/docs$scale".bin
  done ;;
*) echo "unknown stage $st" ;;
esac; stage "$st"; done
