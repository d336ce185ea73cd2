#!/usr/bin/env bash
# What a run records reaches its files, or the run says so (docs/monitoring.md, "When a record
# cannot be written"; /dev/full stands in for a full disk, `ulimit -f` for a full quota):
#   1. --metrics-jsonl on a full disk stops the run (exit 2) naming the file, the row and the
#      system's reason (it used to exit 0 with rows lost or cut mid-number);
#   2. the record on stdout (`> log`) on a full disk: exit 2 and an error on stderr;
#   3. a --log-dir file that cannot be written: one warning on stderr, the run goes on;
#   4. --tensorboard-dir past a file-size limit: the run stops naming the flag and the file;
#   5. with `> log 2>&1` a start-up error is the log's last line, after the whole argument dump
#      (stdout is block-buffered in a file, stderr is not: it used to land inside the dump).
set -uo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
[ -w /dev/full ] || { echo "SKIP: no writable /dev/full"; exit 77; }
train() { "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --log-interval 1 \
            --lr-warmup-iters 1 --train-iters 3 --eval-iters 0 "$@"; }

# ---- 1
train --metrics-jsonl /dev/full > "$tmp/m.out" 2> "$tmp/m.err"
rc=$?
[ "$rc" -eq 2 ] || fail "1: --metrics-jsonl /dev/full exited $rc, expected 2: $(tail -3 "$tmp/m.err")"
grep -q "error: --metrics-jsonl /dev/full: writing the row of iteration 1 failed (No space left on device)" "$tmp/m.err" ||
  fail "1: the error does not name the file, the row and the reason: $(cat "$tmp/m.err")"
echo "PASS 1: $(grep -m1 'metrics-jsonl' "$tmp/m.err" | cut -c1-150)"

# ---- 2
train > /dev/full 2> "$tmp/o.err"
rc=$?
[ "$rc" -eq 2 ] || fail "2: stdout on /dev/full exited $rc, expected 2: $(tail -3 "$tmp/o.err")"
grep -q "error: writing the record .* to standard output failed (No space left on device)" "$tmp/o.err" ||
  fail "2: no error about standard output: $(cat "$tmp/o.err")"
echo "PASS 2: $(grep -m1 'standard output' "$tmp/o.err" | cut -c1-150)"

# ---- 3
mkdir "$tmp/logs"; ln -s /dev/full "$tmp/logs/rank_0.log"
train --log-dir "$tmp/logs" --log-level info > "$tmp/l.out" 2> "$tmp/l.err" ||
  fail "3: an unwritable log file stopped the run: $(tail -3 "$tmp/l.err")"
n=$(grep -c "WARNING: --log-dir $tmp/logs: .*No space left on device; the log file misses the messages from here on" "$tmp/l.err")
[ "$n" -eq 1 ] || fail "3: expected one warning about the log file, got $n: $(cat "$tmp/l.err")"
! grep -q "LOG ERROR" "$tmp/l.err" || fail "3: spdlog's raw error lines: $(cat "$tmp/l.err")"
grep -q "iteration        3/       3" "$tmp/l.out" || fail "3: the run did not finish: $(tail -3 "$tmp/l.out")"
echo "PASS 3: $(grep -m1 'log-dir' "$tmp/l.err" | cut -c1-150)"

# ---- 4: a 4 KiB file-size limit (SIGXFSZ ignored, so the write fails with EFBIG); stdout and
# stderr go to pipes, which the limit does not cover.
err=$( (ulimit -f 4; trap '' XFSZ; exec "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu \
        --lr-warmup-iters 1 --train-iters 200 --eval-iters 0 --tensorboard-dir "$tmp/tb" --log-interval 1 \
        2>&1 >/dev/null) | cat)
grep -q "error: --tensorboard-dir: writing the event file $tmp/tb/events.out.tfevents.* failed (File too large)" <<< "$err" ||
  fail "4: $(tail -3 <<< "$err")"
echo "PASS 4: $(grep -m1 'tensorboard-dir' <<< "$err" | cut -c1-150)"

# ---- 5
train --load "$tmp/no_such_checkpoint" --exit-on-missing-checkpoint > "$tmp/start.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] || fail "5: a missing checkpoint with --exit-on-missing-checkpoint did not fail"
last=$(grep -v '^\s*$' "$tmp/start.log" | tail -1)
end=$(grep -n "end of arguments" "$tmp/start.log" | cut -d: -f1)
first_error=$(grep -n "^error: " "$tmp/start.log" | head -1 | cut -d: -f1)
[ -n "$end" ] && [ -n "$first_error" ] || fail "5: no argument dump or no error: $(cat "$tmp/start.log")"
[ "$first_error" -gt "$end" ] || fail "5: the error (line $first_error) lands inside the argument dump (ends at line $end)"
grep -q "^error: " <<< "$(tail -3 "$tmp/start.log")" || fail "5: the log's last lines do not say what went wrong: $last"
echo "PASS 5: the log ends with: $(cut -c1-120 <<< "$last")"
echo "PASS: record_write_errors"
