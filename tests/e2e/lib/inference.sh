# shellcheck shell=bash
# Sourced by the generate_* / evaluate_* end-to-end tests right after `set -euo pipefail`:
#   source "$2/tests/e2e/lib/inference.sh"
# with the test's own arguments, BIN_DIR SRC_DIR (as tests/CMakeLists.txt passes them). Sets
# $bin (the programs), $src (the repository) and $ref (the NumPy reference of LLaDA's sampler and
# estimators, tests/golden/llada_reference.py; run it with $PY from lib/python_numpy.sh), moves
# into a scratch directory $tmp that is removed at exit, and defines:
#   tiny_checkpoint DIR [FLAGS...]  configs/tiny_dlm.args trained two steps on the CPU with
#                                   spread-out logits (init std 0.3), saved in DIR; FLAGS add to
#                                   or override the file's (not these settings)
#   export_hf CKPT OUT              CKPT's Hugging Face export (convert_checkpoint --to-hf) in OUT
#   byte_tokenizer FILE FIRST       a byte-level BPE tokenizer.json (GPT-2's byte encoder, no merges)
#                                   in FILE whose 128 tokens are the bytes FIRST .. FIRST + 127
# Each prints its log and fails the test when its program fails.
bin=$1
src=$2
# shellcheck disable=SC2034  # used by the sourcing tests
ref="$src/tests/golden/llada_reference.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

tiny_checkpoint() {
  local dir=$1
  shift
  "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" "$@" --device cpu --train-iters 2 --lr-warmup-iters 0 \
    --init-method-std 0.3 --eval-iters 0 --save "$dir" --save-interval 2 > "train_$dir.log" 2>&1 \
    || { cat "train_$dir.log"; exit 1; }
}

export_hf() {
  "$bin/convert_checkpoint" --to-hf --load "$1" --out "$2" > "convert_$2.log" 2>&1 || { cat "convert_$2.log"; exit 1; }
}

byte_tokenizer() {
  python3 - "$1" "$2" <<'P'
import json, sys
def bytes_to_unicode():  # GPT-2's byte encoder
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
m = bytes_to_unicode()
first = int(sys.argv[2], 0)
tok = {"version": "1.0", "added_tokens": [], "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
       "post_processor": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "vocab": {m[first + k]: k for k in range(128)}, "merges": []}}
json.dump(tok, open(sys.argv[1], "w"))
P
}
