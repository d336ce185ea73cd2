#!/usr/bin/env bash
# A rank that skips a collective must not hang the job: under mpirun -np 2, rank 1 skips an
# all_reduce (tests/e2e/comm_timeout_probe.cpp); with a 3 s timeout set through the API, rank 0
# raises CommTimeoutError naming the group, the operation and its rank, and abort_job ends the
# job. Pass: non-zero exit in under 30 s with that message on stderr, and rank 0's last
# collectives in the directory given to the probe (all_reduce #1 completed, #2 not), named by the
# error. Then the same in a split group that is destroyed before abort_job rewrites the file: the
# group stays in it. Exit 77 (skipped) when the build or the machine has no MPI.
set -uo pipefail
bin=$1
probe=$bin/comm_timeout_probe
[ -x "$probe" ] || { echo "SKIP: $probe was not built"; exit 77; }
"$probe" --mpi-compiled || { echo "SKIP: this build has no MPI"; exit 77; }
command -v mpirun >/dev/null || { echo "SKIP: no mpirun on PATH"; exit 77; }
flags=()
version=$(mpirun --version 2>&1 || true)  # captured first: `| grep -q` can SIGPIPE under pipefail
if grep -q "Open MPI" <<< "$version"; then
  flags+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s%N)
# The outer timeout only guards CI against a regression that hangs; the test demands < 30 s.
timeout 120 mpirun -np 2 "${flags[@]}" "$probe" 3 "$tmp/logs" > "$tmp/out" 2> "$tmp/err"
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "mpirun -np 2 ${flags[*]} comm_timeout_probe 3: exit $rc after ${elapsed_ms} ms"
fail() { echo "FAIL: $*"; echo "--- stderr ---"; cat "$tmp/err"; echo "--- stdout ---"; cat "$tmp/out"; exit 1; }
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ "$rc" -ne 124 ] || fail "the job hung until the outer 120 s guard"
[ "$elapsed_ms" -lt 30000 ] || fail "the job took ${elapsed_ms} ms (limit 30000)"
[ "$elapsed_ms" -ge 3000 ] || fail "the job ended after ${elapsed_ms} ms, before the 3 s timeout"
for want in "CommTimeoutError" "group 'world'" "all_reduce #2" "rank 0 of 2" "3000 ms"; do
  grep -qF "$want" "$tmp/err" || fail "stderr does not mention \"$want\""
done
! grep -q "still alive after 60 s" "$tmp/err" || fail "rank 1 outlived abort_job"
record="$tmp/logs/collectives_rank00000.txt"
grep -qF "This rank's last collectives are in $record" "$tmp/err" || fail "the error does not name $record"
[ -f "$record" ] || fail "$record was not written"
grep -qE "^group 'world' \(rank 0 of 2\): 2 operation\(s\) issued" "$record" || fail "no world block: $(cat "$record")"
grep -qE "^  #1 +all_reduce +3 f32 .* after [0-9]+ ms  sum" "$record" || fail "#1 not recorded as completed: $(cat "$record")"
grep -qE "^  #2 +all_reduce +3 f32 .* NOT COMPLETED \(waiting [0-9]+ ms\)  sum" "$record" ||
  fail "#2 not recorded as pending: $(cat "$record")"
echo "--- $record"; cat "$record"
grep -F "CommTimeoutError" "$tmp/err" | head -1
echo "PASS: the skipped all_reduce ended the job in ${elapsed_ms} ms with the group, operation and rank named"

# The same in a group split from the world ('dp'), destroyed while the error unwinds — as a
# trainer's groups are — before abort_job writes the file again: the group that hung must still
# be in it, not only the world's start-up operations.
timeout 120 mpirun -np 2 "${flags[@]}" "$probe" 3 "$tmp/split" split > "$tmp/out" 2> "$tmp/err"
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "split: exit $rc"
grep -qF "group 'dp'" "$tmp/err" || fail "split: stderr does not name group 'dp'"
record="$tmp/split/collectives_rank00000.txt"
[ -f "$record" ] || fail "split: $record was not written"
grep -qE "^group 'world' \(rank 0 of 2\)" "$record" || fail "split: no world block: $(cat "$record")"
grep -qE "^group 'dp' \(rank 0 of 2; destroyed at .*\): 2 operation\(s\) issued" "$record" ||
  fail "split: the group that hung is missing from the file abort_job wrote: $(cat "$record")"
grep -qE "^  #2 +all_reduce +3 f32 .* NOT COMPLETED \(waiting [0-9]+ ms\)  sum" "$record" ||
  fail "split: dp's all_reduce #2 not recorded as pending: $(cat "$record")"
echo "--- $record"; cat "$record"
echo "PASS: a hung split group destroyed before abort_job is still in the last-collectives file"
