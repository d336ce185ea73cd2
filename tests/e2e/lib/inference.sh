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
