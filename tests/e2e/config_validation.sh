#!/usr/bin/env bash
# pretrain_difflm's front door: a large layout validates in --dry-run on one CPU process and prints
# its groups; bad input exits with code 2 and a message naming the flags, before any work.
set -uo pipefail
bin=$1; src=$2
p="$bin/pretrain_difflm"
fail() { echo "FAIL: $*"; exit 1; }

out=$("$p" @"$src/configs/megadlms_1.7b.args" --mock-data --train-iters 3000 --dry-run \
      --global-batch-size 512 --world-size 1024 --tensor-model-parallel-size 8 --use-distributed-optimizer 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "dry run of a valid 1024-rank layout exited $rc: $out"
grep -q 'world size 1024 = tp 8 x cp 1 x dp 128 x pp 1' <<< "$out" || fail "layout line missing"
grep -q 'tp .* \[0, 1, 2, 3, 4, 5, 6, 7\]' <<< "$out" || fail "rank 0's tp group missing"
grep -q 'valid and runnable by this build' <<< "$out" || fail "dry run of TP 8 x DP 128 should be runnable: $out"

out=$("$p" @"$src/configs/tiny_dlm.args" --tensor-model-parallel-size 3 --world-size 3 --dry-run 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "tp 3 with 4 heads should exit 2, got $rc"
grep -q -- '--tensor-model-parallel-size 3' <<< "$out" || fail "message must name the flag: $out"
grep -q -- '--num-attention-heads 4' <<< "$out" || fail "message must name the heads: $out"

out=$("$p" @"$src/configs/tiny_dlm.args" --tensor-parallel-size 2 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "an unknown flag should exit 2, got $rc"
grep -q 'did you mean `--tensor-model-parallel-size`' <<< "$out" || fail "no suggestion: $out"

out=$("$p" @"$src/configs/tiny_dlm.args" --mask-token 5000 --device cpu 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "a mask token outside the vocabulary should exit 2, got $rc"
grep -q -- '--mask-token 5000' <<< "$out" || fail "message must name --mask-token: $out"

# Not `--help | grep -q`: grep -q exits at the first match and, under pipefail, the SIGPIPE the
# still-writing program then gets would fail the pipeline now and then.
help=$("$p" --help)
grep -q -- '--tensor-model-parallel-size' <<< "$help" || fail "--help lacks the flag table"
echo "PASS"
