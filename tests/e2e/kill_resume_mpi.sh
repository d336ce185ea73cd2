#!/usr/bin/env bash
# kill -9 loop under mpirun (docs/checkpoints.md; checkpoint_resume.sh covers one
# process): DP = 2 with the distributed optimizer, saving every iteration, synchronously and
# with --async-save. A random rank is SIGKILLed at a random moment (mpirun then ends the other),
# "latest" must always name a checkpoint that verifies, and the same command line resumes from
# it (taking over the dead run's lock) until training ends. Every iteration any run logged, and
# the final checkpoint (model and Adam state), must be bitwise those of an uninterrupted run.
# Exit 77 (skipped) without MPI.
set -uo pipefail
bin=$1; src=$2
"$bin/comm_timeout_probe" --mpi-compiled 2>/dev/null || { echo "SKIP: this build has no MPI"; exit 77; }
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
flags=()
version=$(mpirun --version 2>&1 || true)
if grep -q "Open MPI" <<< "$version"; then
  flags+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
fi
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
iters=24
RANDOM=1717  # the kill moments are random but the same in every CI run
args=(@"$src/configs/tiny_dlm.args" --device cpu --log-interval 1 --lr-warmup-iters 2 --lr-decay-iters "$iters"
      --train-iters "$iters" --eval-iters 0 --use-distributed-optimizer)
det() { sed -E 's/"(elapsed_ms|tokens_per_s|tflops_per_gpu|mfu|mfu_989|peak_mem_gb|peak_reserved_gb)":[^,}]*,?//g' "$1"; }
# `exec`, so that $! is mpirun itself and its children are the ranks.
launch() { exec mpirun -np 2 "${flags[@]}" "$bin/pretrain_difflm" "${args[@]}" "$@"; }

launch --save "$tmp/straight" --save-interval 1000 --metrics-jsonl "$tmp/straight.jsonl" > "$tmp/straight.log" 2>&1 &
pid=$!; pids+=("$pid"); wait "$pid" || fail "the uninterrupted run: $(tail -5 "$tmp/straight.log")"

for mode in sync async; do
  ck="$tmp/$mode"
  extra=(--save "$ck" --load "$ck" --save-interval 1)
  [ "$mode" = async ] && extra+=(--async-save)
  kills=0 runs=0 done=0 tries=1 max_delay=10
  while [ "$done" = 0 ]; do
    runs=$((runs + 1))
    [ "$runs" -le 8 ] || fail "$mode: no end after 8 runs"
    launch "${extra[@]}" --metrics-jsonl "$tmp/$mode.$runs.jsonl" > "$tmp/$mode.$runs.log" 2>&1 &
    pid=$!; pids+=("$pid")
    ranks=()
    if [ "$kills" -lt 3 ]; then
      # Past the first checkpoint of this run, then a random moment (mostly inside a save).
      before=$(cat "$ck/latest_checkpointed_iteration.txt" 2>/dev/null || echo 0)
      for _ in $(seq 600); do
        now=$(cat "$ck/latest_checkpointed_iteration.txt" 2>/dev/null || echo 0)
        [ "$now" != "$before" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
      done
      sleep "$(awk -v r=$((RANDOM % max_delay)) 'BEGIN { printf "%.2f", r / 10 }')"
      ranks=($(pgrep -P "$pid" || true))
      if [ "${#ranks[@]}" -gt 0 ] && kill -0 "$pid" 2>/dev/null; then
        victim=${ranks[$((RANDOM % ${#ranks[@]}))]}
        kill -9 "$victim" 2>/dev/null && kills=$((kills + 1))
      fi
    fi
    wait "$pid"; rc=$?
    # A restarted job starts after the old one's processes are gone (a scheduler waits for them).
    for r in "${ranks[@]:-}"; do
      [ -n "$r" ] || continue
      for _ in $(seq 200); do kill -0 "$r" 2>/dev/null || break; sleep 0.05; done
    done
    if [ "$rc" = 0 ] && [ "$kills" = 0 ] && [ "$tries" -lt 4 ]; then
      # The run ended before the kill (a fast machine): start this mode over from nothing, with
      # kills sooner after the first checkpoint.
      tries=$((tries + 1)) max_delay=$((max_delay > 2 ? max_delay / 2 : 1)) runs=0
      rm -rf "$ck" "$tmp/$mode".*.jsonl "$tmp/$mode".*.log
      continue
    fi
    if [ "$rc" = 0 ]; then
      done=1
    else
      grep -q "error: invalid\|does not fit\|in use by another run" "$tmp/$mode.$runs.log" &&
        fail "$mode run $runs failed on its own: $(tail -5 "$tmp/$mode.$runs.log")"
    fi
    if [ -f "$ck/latest_checkpointed_iteration.txt" ]; then
      "$bin/convert_checkpoint" --check "$ck" > "$tmp/check.log" 2>&1 ||
        fail "$mode: after run $runs (exit $rc) latest does not verify: $(cat "$tmp/check.log")"
    fi
  done
  [ "$kills" -ge 1 ] || fail "$mode: no rank was killed (the runs were too fast to catch)"
  takeovers=$(cat "$tmp/$mode".*.log | grep -c "took over the lock")
  # Every iteration any run logged equals the uninterrupted run's line for that iteration.
  for f in "$tmp/$mode".*.jsonl; do
    [ -s "$f" ] || continue
    while IFS= read -r line; do
      it=$(grep -o '"iteration":[0-9]*' <<< "$line" | cut -d: -f2)
      want=$(det "$tmp/straight.jsonl" | grep "\"iteration\":$it,")
      [ "$line" = "$want" ] || fail "$mode: iteration $it differs from the uninterrupted run ($f):
  got  $line
  want $want"
    done < <(det "$f")
  done
  "$bin/convert_checkpoint" --compare "$tmp/straight" "$ck" --all > "$tmp/compare.log" 2>&1 ||
    fail "$mode: the final checkpoint differs from the uninterrupted run's: $(tail -5 "$tmp/compare.log")"
  echo "PASS $mode: $kills kill -9 of a rank in $runs runs ($takeovers stale-lock takeovers); latest always verified; every logged iteration and the final model and Adam state bitwise those of the uninterrupted run"
done
echo "PASS: kill_resume_mpi"
