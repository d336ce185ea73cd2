#!/usr/bin/env bash
# Fault detection and replay as a user drives it (docs/faults.md), on the tiny model:
#   1. --rerun-mode validate_results with an injected transient fault (--error-injection-type
#      transient_error): each injected step is replayed, the log says TRANSIENT, and the run's
#      losses and gradient norms are bitwise those of the run without injection;
#   2. an injected persistent fault: the replay reproduces it, the run stops with exit code 16
#      and a checkpoint of the last good state, which verifies and resumes bitwise;
#   3. a diverging run (--lr 1e3) with --check-for-spiky-loss is reported as a spike, and without
#      any flag as a possible divergence (a warning; the healthy run has none);
#   4. a gradual divergence (--lr 20), which the median of recent losses follows, is reported
#      against the loss of a uniform guess.
set -uo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
train() { "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --log-interval 1 \
            --lr-warmup-iters 2 --lr-decay-iters 10 --train-iters 10 --eval-iters 0 "$@"; }
det() { sed -E 's/"(elapsed_ms|tokens_per_s|tflops_per_gpu|mfu|mfu_989|peak_mem_gb|peak_reserved_gb)":[^,}]*,?//g' "$1"; }

train --metrics-jsonl "$tmp/clean.jsonl" > "$tmp/clean.log" 2>&1 || fail "clean run: $(tail -3 "$tmp/clean.log")"

# ---- 1
train --rerun-mode validate_results --error-injection-rate 3 --error-injection-type transient_error \
  --metrics-jsonl "$tmp/transient.jsonl" > "$tmp/transient.log" 2>&1 || fail "transient run: $(tail -3 "$tmp/transient.log")"
n=$(grep -c "a TRANSIENT fault. The first result is discarded and the step applied from the replay" "$tmp/transient.log")
[ "$n" -ge 1 ] || fail "1: no transient verdict in the log: $(tail -5 "$tmp/transient.log")"
grep -q "injected: --error-injection-type transient_error" "$tmp/transient.log" || fail "1: the injection is not named"
cmp -s <(det "$tmp/clean.jsonl") <(det "$tmp/transient.jsonl") ||
  { diff <(det "$tmp/clean.jsonl") <(det "$tmp/transient.jsonl") | head -4; fail "1: the replayed run differs from the clean one"; }
echo "PASS 1: $n injected transient fault(s) replayed away; the run is bitwise the clean one"
grep -m1 "TRANSIENT" "$tmp/transient.log" | cut -c1-220

# ---- 2
train --rerun-mode validate_results --error-injection-rate 3 --error-injection-type persistent_error \
  --save "$tmp/ck" --save-interval 100 > "$tmp/persistent.log" 2>&1
rc=$?
[ "$rc" -eq 16 ] || fail "2: exit code $rc, expected 16: $(tail -3 "$tmp/persistent.log")"
line=$(grep "a REPRODUCIBLE fault" "$tmp/persistent.log" | tail -1)
[ -n "$line" ] || fail "2: no reproducible verdict: $(tail -3 "$tmp/persistent.log")"
k=$(sed -nE 's/.*the last good state \(iteration ([0-9]+)\) is the checkpoint .*/\1/p' <<< "$line")
[ -n "$k" ] || fail "2: the message does not name the checkpoint: $line"
[ "$(cat "$tmp/ck/latest_checkpointed_iteration.txt")" = "$k" ] || fail "2: latest is not $k"
"$bin/convert_checkpoint" --check "$tmp/ck" > "$tmp/check.log" 2>&1 || fail "2: the checkpoint does not verify: $(cat "$tmp/check.log")"
train --load "$tmp/ck" --save "$tmp/ck" --save-interval 100 --metrics-jsonl "$tmp/resumed.jsonl" > "$tmp/resumed.log" 2>&1 ||
  fail "2: resume: $(tail -3 "$tmp/resumed.log")"
cmp -s <(det "$tmp/clean.jsonl" | tail -n $((10 - k))) <(det "$tmp/resumed.jsonl") || fail "2: the resumed run differs from the clean one"
echo "PASS 2: a persistent fault stopped the run at iteration $((k + 1)) with exit code 16; iter $k verifies and resumes bitwise"
echo "$line" | cut -c1-260

# ---- 3
train --lr 1e3 --clip-grad 0 --no-check-for-nan-in-loss-and-grad --check-for-spiky-loss \
  --rerun-mode validate_results > "$tmp/diverge.log" 2>&1 || fail "3: the diverging run failed: $(tail -3 "$tmp/diverge.log")"
grep -q "found a spiky loss" "$tmp/diverge.log" || fail "3: the divergence was not reported: $(grep 'lm loss' "$tmp/diverge.log" | tail -3)"
echo "PASS 3: the divergence is reported: $(grep -m1 'found a spiky loss' "$tmp/diverge.log" | cut -c1-160)"
train --lr 1e3 --clip-grad 0 --no-check-for-nan-in-loss-and-grad > "$tmp/diverge_default.log" 2>&1 ||
  fail "3: the diverging run without flags failed: $(tail -3 "$tmp/diverge_default.log")"
grep -q "WARNING: iteration [0-9]*: lm loss .* the run may be diverging" "$tmp/diverge_default.log" ||
  fail "3: without flags the divergence is silent: $(grep 'lm loss' "$tmp/diverge_default.log" | tail -3)"
! grep -q "may be diverging" "$tmp/clean.log" || fail "3: the healthy run was reported as diverging"
echo "PASS 3: without flags too: $(grep -m1 'may be diverging' "$tmp/diverge_default.log" | cut -c1-120)"

# ---- 4: a gradual divergence (--lr 20 reached over a long warm-up: the loss climbs from 4.85
# past 100 in 50 iterations, the median of the last 32 with it, never 10x it) is caught against
# the loss of a uniform guess, 10 x ln(vocabulary)
"$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --log-interval 10 --lr 20 --lr-warmup-iters 200 \
  --lr-decay-iters 1000 --train-iters 50 --eval-iters 0 --check-for-spiky-loss > "$tmp/gradual.log" 2>&1 ||
  fail "4: the run failed: $(tail -3 "$tmp/gradual.log")"
! grep -q "found a spiky loss" "$tmp/gradual.log" || fail "4: not a gradual divergence (the median rule saw it)"
grep -q "found a diverging loss (.* >= 1.000000E+01 x 4.852030E+00, the loss of a uniform guess" "$tmp/gradual.log" ||
  fail "4: the gradual divergence was not reported: $(grep -o 'lm loss: [^|]*' "$tmp/gradual.log" | tr '\n' ' ')"
! grep -q "found a diverging loss" "$tmp/clean.log" || fail "4: the healthy run was reported as diverging"
echo "PASS 4: $(grep -m1 'found a diverging loss' "$tmp/gradual.log" | cut -c1-160)"
echo "PASS: fault_replay"
