#!/usr/bin/env bash
# scripts/make_synthetic_corpus.py (the packed-document timings' data, docs/benchmarks.md):
#   1. the files are Megatron's MMIDIDX v1 with uint16 tokens, the document lengths cycle
#      256, 200, 312, 256, 180, 332 (x --scale) and each document ends in the EOD id alone;
#   2. pretrain_difflm reads them with NullTokenizer (EOD = vocab - 1) and, with
#      --reset-attention-mask, finds the documents: the first iteration's loss differs from the
#      same run without it (were the EOD id wrong, nothing would be cut and the losses equal).
set -uo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 "$src/scripts/make_synthetic_corpus.py" "$tmp/docs" --tokens 60000 --scale 1 --eod 511 --mask-token 500 \
  > "$tmp/make.log" || { cat "$tmp/make.log"; fail "make_synthetic_corpus.py failed"; }
grep -q "docs: 235 documents, 60160 tokens, mean length 256" "$tmp/make.log" || { cat "$tmp/make.log"; fail "summary line"; }
python3 - "$tmp/docs" <<'PY' || fail "file format"
import array, struct, sys
prefix = sys.argv[1]
idx = open(prefix + ".idx", "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00", idx[:9]
version, code, n, d = struct.unpack_from("<QBQQ", idx, 9)
assert (version, code, d) == (1, 8, n + 1), (version, code, n, d)
sizes = array.array("i"); sizes.frombytes(idx[34:34 + 4 * n])
pointers = array.array("q"); pointers.frombytes(idx[34 + 4 * n:34 + 12 * n])
docs = array.array("q"); docs.frombytes(idx[34 + 12 * n:])
assert len(idx) == 34 + 12 * n + 8 * d, len(idx)
cycle = [256, 200, 312, 256, 180, 332]
assert list(sizes) == [cycle[i % 6] for i in range(n)], list(sizes)[:8]
assert list(docs) == list(range(n + 1))
tokens = array.array("H"); tokens.frombytes(open(prefix + ".bin", "rb").read())
assert len(tokens) == sum(sizes) and pointers[-1] == 2 * (sum(sizes) - sizes[-1])
for i in range(n):
    doc = tokens[pointers[i] // 2:pointers[i] // 2 + sizes[i]]
    assert doc[-1] == 511 and all(1 <= t < 500 for t in doc[:-1]), i
PY
echo "1. the corpus: MMIDIDX v1 uint16, the length cycle, one EOD a document"

run() {
  "$bin/pretrain_difflm" --num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 \
    --swiglu --normalization RMSNorm --disable-bias-linear --position-embedding-type rope \
    --vocab-size 512 --mask-token 500 --tokenizer-type NullTokenizer --seq-length 512 \
    --max-position-embeddings 512 --micro-batch-size 2 --global-batch-size 2 --train-iters 1 --lr 1e-4 \
    --data-path "$tmp/docs" --split 100,0,0 --eval-iters 0 --model-running-mode difflm-noshift \
    --log-interval 1 --seed 7 "$@"
}
run > "$tmp/dense.log" 2>&1 || { tail -20 "$tmp/dense.log"; fail "training without packing"; }
run --reset-attention-mask --reset-position-ids --cut-off-varlen-to-seqlen > "$tmp/packed.log" 2>&1 ||
  { tail -20 "$tmp/packed.log"; fail "training with --reset-attention-mask"; }
loss() { grep -oE "lm loss: [0-9.E+-]+" "$1" | head -1 | awk '{print $3}'; }
a=$(loss "$tmp/dense.log"); b=$(loss "$tmp/packed.log")
[ -n "$a" ] && [ -n "$b" ] || fail "no loss logged ($a / $b)"
[ "$a" != "$b" ] || fail "the packed run's loss $b equals the dense run's: no document was found"
echo "2. NullTokenizer reads it; --reset-attention-mask cuts its documents (loss $a dense, $b packed)"
