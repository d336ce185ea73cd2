#!/usr/bin/env bash
# Checkpoints driven as a user drives them (docs/checkpoints.md), on the tiny model:
#   1. --save/--save-interval/--exit-interval, then --load: iterations 7..12 are bit-identical to
#      an uninterrupted run (metrics JSON lines: losses, grad norms, lr, consumed samples);
#   1b. rolling (non-persistent) checkpoints: the exit at a rolling iteration, the load's choice;
#   2. SIGTERM mid-run: a checkpoint at the next iteration boundary, exit code 0, exact resume;
#   3. SIGKILL at random moments of a run that saves every iteration: "latest" always names a
#      checkpoint that verifies (convert_checkpoint --check) and that the trainer loads;
#   4. a flipped byte: --load fails with exit code 2 naming the file and both SHA-256 sums;
#   5. with MPI: save under 2 ranks with the distributed optimizer, resume in one process;
#      SIGUSR1 to mpirun stops both ranks with a checkpoint.
set -uo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
train() { "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --log-interval 1 \
            --lr-warmup-iters 2 --lr-decay-iters 12 "$@"; }
# In the background: `exec`, so that $! is the program itself (signals go to it, not to a subshell).
train_bg() { exec "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --log-interval 1 \
               --lr-warmup-iters 2 --lr-decay-iters 12 "$@"; }
# A metrics file without its timing fields: what must be identical between runs.
det() { sed -E 's/"(elapsed_ms|tokens_per_s|tflops_per_gpu|mfu|mfu_989|peak_mem_gb|peak_reserved_gb)":[^,}]*,?//g' "$1"; }
# Training iterations logged (the final validation/test lines are not counted).
lines() { local n=0; [ -f "$1" ] && n=$(grep -c '"lm_loss"' "$1"); echo "${n:-0}"; }

# ---- 1. interval saves, exit, resume
train --train-iters 12 --metrics-jsonl "$tmp/straight.jsonl" > "$tmp/straight.log" 2>&1 || fail "straight run"
train --train-iters 12 --save "$tmp/ck" --save-interval 4 --exit-interval 6 \
  --metrics-jsonl "$tmp/first.jsonl" > "$tmp/first.log" 2>&1 || fail "first half: $(tail -3 "$tmp/first.log")"
grep -q "exiting program at iteration 6 (--exit-interval)" "$tmp/first.log" || fail "no exit at iteration 6"
[ "$(cat "$tmp/ck/latest_checkpointed_iteration.txt")" = 6 ] || fail "latest is not 6"
[ -d "$tmp/ck/iter_0000004" ] && [ -d "$tmp/ck/iter_0000006" ] || fail "iter_0000004/iter_0000006 missing"
train --train-iters 12 --load "$tmp/ck" --save "$tmp/ck" --save-interval 4 \
  --metrics-jsonl "$tmp/second.jsonl" > "$tmp/second.log" 2>&1 || fail "resume: $(tail -3 "$tmp/second.log")"
grep -q "successfully loaded checkpoint from $tmp/ck/iter_0000006" "$tmp/second.log" || fail "no load message"
[ "$(lines "$tmp/second.jsonl")" -eq 6 ] || fail "the resumed run logged $(lines "$tmp/second.jsonl") iterations, expected 6"
# Iterations 7-12 and the final validation and test losses (two more lines).
cmp -s <(det "$tmp/straight.jsonl" | tail -8) <(det "$tmp/second.jsonl") ||
  { diff <(det "$tmp/straight.jsonl" | tail -8) <(det "$tmp/second.jsonl") | head; fail "resumed iterations differ"; }
[ "$(cat "$tmp/ck/latest_checkpointed_iteration.txt")" = 12 ] || fail "latest is not 12 after the resumed run"
echo "PASS 1: stop at 6, resume to 12: iterations 7-12 and the final validation/test losses bit-identical to the straight run"

# ---- 1b. rolling checkpoints: an exit at a rolling iteration (8) saves only the rolling one
# (Megatron's rule), and --load with the rolling flags resumes from it
roll=(--save "$tmp/roll" --save-interval 6 --non-persistent-save-interval 4 --non-persistent-ckpt-type global --async-save)
train --train-iters 12 "${roll[@]}" --exit-interval 8 > "$tmp/roll1.log" 2>&1 || fail "rolling run: $(tail -3 "$tmp/roll1.log")"
[ "$(cat "$tmp/roll/latest_checkpointed_iteration.txt")" = 6 ] || fail "rolling: persistent latest is not 6"
[ "$(cd "$tmp/roll/non_persistent" && echo iter_*)" = iter_0000008 ] || fail "rolling: non_persistent holds $(ls "$tmp/roll/non_persistent")"
train --train-iters 12 "${roll[@]}" --load "$tmp/roll" --metrics-jsonl "$tmp/roll2.jsonl" > "$tmp/roll2.log" 2>&1 ||
  fail "rolling resume: $(tail -3 "$tmp/roll2.log")"
grep -q "loading: non-persistent checkpoint (iteration 8, persistent 6)" "$tmp/roll2.log" || fail "rolling: no choice message"
cmp -s <(det "$tmp/straight.jsonl" | tail -6) <(det "$tmp/roll2.jsonl") || fail "rolling: resumed iterations differ"
echo "PASS 1b: rolling checkpoints: exit at rolling 8 keeps persistent 6 + rolling 8, resume from 8 bit-identical"

# ---- 2. SIGTERM
train_bg --train-iters 100000 --save "$tmp/sig" --save-interval 100000 --metrics-jsonl "$tmp/sig.jsonl" \
  > "$tmp/sig.log" 2>&1 &
pid=$!; pids+=("$pid")
for _ in $(seq 600); do [ "$(lines "$tmp/sig.jsonl")" -ge 3 ] && break; sleep 0.05; done
kill -TERM "$pid"
wait "$pid"; rc=$?
[ "$rc" -eq 0 ] || fail "SIGTERM: exit code $rc, expected 0: $(tail -3 "$tmp/sig.log")"
n=$(cat "$tmp/sig/latest_checkpointed_iteration.txt") || fail "SIGTERM left no checkpoint"
grep -q "exiting program at iteration $n (stop requested" "$tmp/sig.log" || fail "SIGTERM: no exit message for iteration $n"
train --train-iters $((n + 3)) --metrics-jsonl "$tmp/sig_straight.jsonl" > /dev/null 2>&1 || fail "straight run to $((n + 3))"
train --train-iters $((n + 3)) --load "$tmp/sig" --metrics-jsonl "$tmp/sig_resumed.jsonl" > /dev/null 2>&1 ||
  fail "resume after SIGTERM"
cmp -s <(det "$tmp/sig_straight.jsonl" | tail -5) <(det "$tmp/sig_resumed.jsonl") || fail "resume after SIGTERM differs"
echo "PASS 2: SIGTERM during iteration $n: checkpoint saved, exit 0, iterations $((n + 1))-$((n + 3)) bit-identical"

# ---- 3. SIGKILL at random moments while saving every iteration
checked=0
for trial in 1 2 3 4 5 6; do
  rm -rf "$tmp/kill"
  train_bg --train-iters 100000 --save "$tmp/kill" --save-interval 1 > "$tmp/kill.log" 2>&1 &
  pid=$!; pids+=("$pid")
  for _ in $(seq 600); do [ -f "$tmp/kill/latest_checkpointed_iteration.txt" ] && break; sleep 0.02; done
  sleep "0.$((RANDOM % 9))$((RANDOM % 10))"
  kill -9 "$pid"; wait "$pid" 2>/dev/null
  [ -f "$tmp/kill/latest_checkpointed_iteration.txt" ] || fail "trial $trial: no checkpoint before the kill"
  "$bin/convert_checkpoint" --check "$tmp/kill" > "$tmp/check.log" 2>&1 ||
    fail "trial $trial: latest does not verify after SIGKILL: $(cat "$tmp/check.log")"
  checked=$((checked + 1))
  leftovers=$(ls -d "$tmp"/kill/*.incomplete 2>/dev/null | wc -l)
  echo "  SIGKILL trial $trial: latest = $(cat "$tmp/kill/latest_checkpointed_iteration.txt"), verifies; interrupted saves left behind: $leftovers"
done
k=$(cat "$tmp/kill/latest_checkpointed_iteration.txt")
train --train-iters $((k + 1)) --load "$tmp/kill" > "$tmp/kill_resume.log" 2>&1 || fail "the trainer cannot load after SIGKILL"
echo "PASS 3: $checked SIGKILLs while saving; latest always verified; the trainer resumed from iteration $k"

# ---- 4. a flipped byte in a tensor file
f="$tmp/ck/iter_0000012/model_rank00000.safetensors"
size=$(stat -c %s "$f")
printf '\xff' | dd of="$f" bs=1 seek=$((size - 100)) conv=notrunc status=none
train --train-iters 14 --load "$tmp/ck" > "$tmp/corrupt.log" 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "loading a corrupted checkpoint exited $rc, expected 2"
grep -q "$f is corrupted: SHA-256 expected [0-9a-f]\{64\}, actual [0-9a-f]\{64\}" "$tmp/corrupt.log" ||
  fail "the error does not name the file and both checksums: $(tail -2 "$tmp/corrupt.log")"
echo "PASS 4: a flipped byte is reported before training: $(grep -o 'model_rank00000.safetensors is corrupted.*' "$tmp/corrupt.log" | cut -c1-80)..."

# ---- 5. several ranks (needs MPI)
if [ -x "$bin/comm_timeout_probe" ] && "$bin/comm_timeout_probe" --mpi-compiled && command -v mpirun > /dev/null; then
  flags=()
  version=$(mpirun --version 2>&1 || true)
  if grep -q "Open MPI" <<< "$version"; then
    flags+=(--oversubscribe)
    [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
  fi
  mpirun -np 2 "${flags[@]}" "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --log-interval 1 \
    --lr-warmup-iters 2 --lr-decay-iters 12 --train-iters 12 --use-distributed-optimizer --save "$tmp/mpi" \
    --save-interval 3 --exit-interval 6 > "$tmp/mpi.log" 2>&1 || fail "2-rank save: $(tail -5 "$tmp/mpi.log")"
  train --train-iters 12 --load "$tmp/mpi" --metrics-jsonl "$tmp/mpi_resumed.jsonl" > "$tmp/mpi_resume.log" 2>&1 ||
    fail "1-process resume of a 2-rank checkpoint: $(tail -3 "$tmp/mpi_resume.log")"
  # DP 2 -> 1 changes fp32 summation orders: the losses agree to 1e-5, not bitwise.
  paste -d' ' <(grep -o '"lm_loss":[^,]*' "$tmp/straight.jsonl" | tail -6 | cut -d: -f2) \
              <(grep -o '"lm_loss":[^,]*' "$tmp/mpi_resumed.jsonl" | cut -d: -f2) |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "iteration " NR + 6 ": " $1 " vs " $2; bad = 1 } }
         END { exit bad }' || fail "DP 2 + distributed optimizer -> DP 1 continued with other losses"
  exec_mpirun() { exec mpirun "$@"; }
  exec_mpirun -np 2 "${flags[@]}" "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --log-interval 1 \
    --lr-warmup-iters 2 --lr-decay-iters 12 --train-iters 100000 --save "$tmp/usr1" --save-interval 100000 \
    --metrics-jsonl "$tmp/usr1.jsonl" > "$tmp/usr1.log" 2>&1 &
  pid=$!; pids+=("$pid")
  for _ in $(seq 1200); do [ "$(lines "$tmp/usr1.jsonl")" -ge 2 ] && break; sleep 0.05; done
  kill -USR1 "$pid"
  wait "$pid"; rc=$?
  [ "$rc" -eq 0 ] || fail "SIGUSR1 to mpirun: exit code $rc: $(tail -5 "$tmp/usr1.log")"
  "$bin/convert_checkpoint" --check "$tmp/usr1" > "$tmp/check.log" 2>&1 || fail "SIGUSR1 checkpoint: $(cat "$tmp/check.log")"
  echo "PASS 5: 2-rank distributed-optimizer checkpoint resumed in one process (losses within 1e-5); SIGUSR1 to mpirun saved iteration $(cat "$tmp/usr1/latest_checkpointed_iteration.txt") and exited 0"
else
  echo "SKIP 5: no MPI in this build or no mpirun"
fi
echo "PASS: checkpoint_resume"
