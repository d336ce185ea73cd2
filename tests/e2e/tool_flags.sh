#!/usr/bin/env bash
# The command lines of convert_checkpoint, preprocess_data, activation_memory and megadlm_bench
# (their flag tables, apps/tool_cli.h) as a user mistypes them: each refuses with exit 2 before any work,
# naming the flag: an unknown flag with the nearest known one, a value outside the choices with
# the valid ones, a number outside its range, a missing required flag; every problem of a command
# line at once; --help / -h generated from the table (every row, its default). Then
# activation_memory's account for configs/tiny_dlm.args, whose tokens per rank follow from the flags.
set -uo pipefail
bin=$1; src=$2
source "$src/tests/e2e/lib/expect.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

# ---- convert_checkpoint
refuses 'unknown flag `--lod`; did you mean `--load`?' "$bin/convert_checkpoint" --to-hf --lod ck --out hf
refuses '`--dtype fp16`: invalid value; valid: fp32, bf16' "$bin/convert_checkpoint" --to-hf --load ck --out hf --dtype fp16
refuses '`--to-hf` needs `--out HF_DIR`' "$bin/convert_checkpoint" --to-hf --load ck
refuses 'give exactly one of `--to-hf`, `--from-hf DIR`, `--compare A B`, `--check DIR` (2 given)' \
  "$bin/convert_checkpoint" --check ck --compare a b
refuses '`--compare` takes two paths (checkpoints or Hugging Face folders), got 3' "$bin/convert_checkpoint" --compare a b c
# Three problems, reported together.
refuses 'invalid command line (3 problems)' "$bin/convert_checkpoint" --compare a b --tolerance -1 --verify-seq 0 --hf-format qwen3
has '`--tolerance -1` must be >= 0' '`--verify-seq 0` must be >= 1' '`--hf-format qwen3`: invalid value; valid: qwen, sdar, fast_dllm_v2, llada'
[ ! -e hf ] || fail "convert_checkpoint wrote hf although refused"
expect 0 "$bin/convert_checkpoint" --help
has "usage:" "  --verify-loss-diff X" "  --dtype fp32|bf16" "(default: 5)" "  --help"
echo "PASS convert_checkpoint: unknown flag, --dtype fp16, missing --out, two modes, --compare arity, ranges, --help"

# ---- preprocess_data
printf '{"text": "1 2 3"}\n' > in.jsonl
pre() { "$bin/preprocess_data" "$@"; }
refuses 'unknown flag `--output_prefix`; did you mean `--output-prefix`?' \
  pre --input in.jsonl --output_prefix out --tokenizer-type NullTokenizer --vocab-size 100
refuses '`--tokenizer-type GPT2Tokenizer`: invalid value; valid: HuggingFaceTokenizer, GPT2BPETokenizer,' \
  pre --input in.jsonl --output-prefix out --tokenizer-type GPT2Tokenizer
refuses 'missing required flag `--input FILE`' pre --output-prefix out --tokenizer-type NullTokenizer --vocab-size 100
# A required flag with a bad value is named once, for its value.
refuses 'invalid command line (2 problems)' pre --tokenizer-type Null --workers 0 --output-prefix out --input in.jsonl
has '`--workers 0` must lie in [1, 4096]' '`--tokenizer-type Null`: invalid value'
refuses '`--partitions 2`: only 1 is supported (use --workers)' \
  pre --input in.jsonl --output-prefix out --tokenizer-type NullTokenizer --vocab-size 100 --partitions 2
[ -z "$(ls | grep '^out')" ] || fail "preprocess_data wrote files although refused: $(ls)"
expect 0 pre -h
has "  --json-keys KEY ..." "(default: text)" "  --workers N" "(default: 1)" "(required)"
# Megatron's spelling of a list flag: several keys up to the next flag, one dataset each.
printf '{"text": "1 2 3", "title": "4"}\n' > two.jsonl
expect 0 pre --input two.jsonl --json-keys text title --output-prefix out --tokenizer-type NullTokenizer --vocab-size 100
[ -s out_text_document.idx ] && [ -s out_title_document.idx ] || fail "--json-keys text title: $(ls)"
echo "PASS preprocess_data: unknown flag, --tokenizer-type GPT2Tokenizer, missing --input, --workers 0, --partitions 2, -h, --json-keys"

# ---- activation_memory
refuses 'unknown flag `--gpu-gb`; did you mean `--gpu-gib`?' "$bin/activation_memory" --gpu-gb 80 -- @"$src/configs/tiny_dlm.args"
# The Megatron flags after -- are pretrain_difflm's, checked by its table.
refuses '`--normalization rmsnorm`: invalid value; valid: LayerNorm, RMSNorm' \
  "$bin/activation_memory" -- @"$src/configs/tiny_dlm.args" --normalization rmsnorm
refuses "missing the model's Megatron flags after \`--\`" "$bin/activation_memory" --cp 1,2
refuses '`--reserve 1` must lie in [0, 1)' "$bin/activation_memory" --reserve 1 -- @"$src/configs/tiny_dlm.args"
refuses '`--cp 1,x`: `x` is not a context-parallel size' "$bin/activation_memory" --cp 1,x -- @"$src/configs/tiny_dlm.args"
expect 0 "$bin/activation_memory" --help
has "  --cp LIST" "(default: 1,2,4,8)" "  --reserve F"
# tiny_dlm.args: --seq-length 64, --micro-batch-size 4: 256 tokens per rank at CP 1, 64 at CP 4.
expect 0 "$bin/activation_memory" --cp 1,4 -- @"$src/configs/tiny_dlm.args"
grep -qE '^  1 +256 ' <<< "$out" && grep -qE '^  4 +64 ' <<< "$out" || fail "tokens per rank: $out"
has "longest sequence at CP=4"
echo "PASS activation_memory: unknown flag, a bad Megatron value after --, no Megatron flags, --reserve 1, --cp 1,x, --help, tokens per rank"

# ---- megadlm_bench (its subcommands' tables; the benchmarks themselves need a GPU)
refuses 'unknown flag `--opp`; did you mean `--op`?' "$bin/megadlm_bench" ops --opp gemm
refuses '`--mib 0` must be >= 1' "$bin/megadlm_bench" comm --mib 0
refuses 'give the subcommand ops or comm, not `bench`' "$bin/megadlm_bench" bench
expect 0 "$bin/megadlm_bench" comm --help
has "  --mib SIZE" "(default: 1024)"
echo "PASS megadlm_bench: unknown flag, --mib 0, no subcommand, --help"
echo "PASS: tool_flags"
