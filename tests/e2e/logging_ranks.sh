#!/usr/bin/env bash
# Diagnostics of a 2-rank run as a user sees them (core/logging.h, docs/launching.md "Logging"):
#   1. by default only rank 0 writes its warnings to stderr, and no line carries a rank prefix;
#   2. --log-all-ranks: rank 1 writes too, each of its lines starting "[rank 1] ";
#   3. --log-dir: one file per rank (rank_0.log, rank_1.log) with that rank's messages, the console
#      unchanged; --log-level debug adds each rank's start-up line;
#   4. --logging-level 40 (Megatron's, Python's ERROR) drops the warnings;
#   5. an error reaches the console from every rank, prefixed, without --log-all-ranks.
# Megatron's record (arguments, iteration lines) stays on rank 0's stdout without a prefix.
# Needs an MPI build and mpirun (exit 77 = skipped otherwise).
set -uo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

if ! { [ -x "$bin/comm_timeout_probe" ] && "$bin/comm_timeout_probe" --mpi-compiled && command -v mpirun > /dev/null; }; then
  echo "SKIP: needs a build with MPI and mpirun"
  exit 77
fi
flags=()
version=$(mpirun --version 2>&1 || true)
if grep -q "Open MPI" <<< "$version"; then
  flags+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
fi
# --log-params-norm is accepted with a warning on every rank ("has no effect in megadlm").
warning='WARNING: `--log-params-norm` has no effect in megadlm'
run() {  # run NAME FLAGS...: 2 ranks, 3 iterations; stdout and stderr kept apart
  local name=$1; shift
  mpirun -np 2 "${flags[@]}" "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu \
    --train-iters 3 --lr-warmup-iters 1 --log-interval 1 --eval-iters 0 --log-params-norm "$@" \
    > "$tmp/$name.out" 2> "$tmp/$name.err"
}
count() { grep -cF -- "$1" "$2" || true; }
iterations() { grep -cE '^ \[[^]]*\] iteration +[0-9]+/ +3 \|' "$1" || true; }

# ---- 1. default: rank 0 only
run default || fail "default run: $(tail -5 "$tmp/default.err")"
[ "$(count "$warning" "$tmp/default.err")" = 1 ] || fail "expected the warning once (rank 0): $(cat "$tmp/default.err")"
! grep -q '\[rank ' "$tmp/default.err" "$tmp/default.out" || fail "a rank prefix without --log-all-ranks"
[ "$(iterations "$tmp/default.out")" = 3 ] || fail "expected 3 iteration lines on stdout: $(cat "$tmp/default.out")"
echo "PASS 1: by default one copy of the warning (rank 0), no rank prefix"

# ---- 2. --log-all-ranks
run all --log-all-ranks || fail "--log-all-ranks run: $(tail -5 "$tmp/all.err")"
[ "$(count "$warning" "$tmp/all.err")" = 2 ] || fail "expected the warning from both ranks: $(cat "$tmp/all.err")"
[ "$(grep -cxF -- "[rank 1] $warning" "$tmp/all.err")" = 1 ] || fail "rank 1's warning is not prefixed: $(cat "$tmp/all.err")"
[ "$(grep -cxF -- "$warning" "$tmp/all.err")" = 1 ] || fail "rank 0's warning should have no prefix: $(cat "$tmp/all.err")"
# Every line of rank 1 is prefixed: rank 0 and rank 1 write the same warnings, so the unprefixed
# lines are exactly the prefixed ones without their prefix.
diff <(grep -v '^\[rank 1\] ' "$tmp/all.err" | sort) <(grep '^\[rank 1\] ' "$tmp/all.err" | sed 's/^\[rank 1\] //' | sort) \
  > /dev/null || fail "rank 0's and rank 1's lines differ beyond the prefix: $(cat "$tmp/all.err")"
! grep -q '\[rank ' "$tmp/all.out" || fail "Megatron's record (stdout) got a rank prefix"
[ "$(iterations "$tmp/all.out")" = 3 ] || fail "expected 3 iteration lines on stdout"
echo "PASS 2: --log-all-ranks: $(grep -F "[rank 1]" "$tmp/all.err" | head -1)"

# ---- 3. --log-dir with --log-level debug
run dir --log-dir "$tmp/logs" --log-level debug || fail "--log-dir run: $(tail -5 "$tmp/dir.err")"
[ -f "$tmp/logs/rank_0.log" ] && [ -f "$tmp/logs/rank_1.log" ] || fail "no rank_0.log / rank_1.log in --log-dir: $(ls "$tmp/logs")"
grep -qF "] [rank 1] $warning" "$tmp/logs/rank_1.log" || fail "rank_1.log lacks rank 1's warning: $(cat "$tmp/logs/rank_1.log")"
grep -qF "] [rank 1] debug: rank 1 of 2" "$tmp/logs/rank_1.log" || fail "rank_1.log lacks the debug start-up line"
grep -qF "] $warning" "$tmp/logs/rank_0.log" || fail "rank_0.log lacks rank 0's warning"
! grep -q '\[rank 1\]' "$tmp/logs/rank_0.log" || fail "rank 1 wrote into rank_0.log"
grep -qxF "debug: rank 0 of 2 (mpirun, local rank 0 of 2)" "$tmp/dir.err" || fail "no debug line on the console: $(cat "$tmp/dir.err")"
! grep -q '\[rank ' "$tmp/dir.err" || fail "--log-dir alone put rank 1 on the console"
echo "PASS 3: --log-dir: $(wc -l < "$tmp/logs/rank_1.log") lines in rank_1.log, e.g. $(grep -F debug "$tmp/logs/rank_1.log" | head -1)"

# ---- 4. Megatron's --logging-level 40 (ERROR)
run quiet --logging-level 40 --log-all-ranks || fail "--logging-level run: $(tail -5 "$tmp/quiet.err")"
! grep -q 'WARNING' "$tmp/quiet.err" || fail "--logging-level 40 still printed warnings: $(cat "$tmp/quiet.err")"
[ "$(iterations "$tmp/quiet.out")" = 3 ] || fail "--logging-level changed the record"
echo "PASS 4: --logging-level 40 drops the warnings, keeps the iteration lines"

# ---- 5. errors come from every rank
if run broken --log-dir /dev/null/logs; then fail "a log directory under /dev/null was accepted"; fi
grep -q '^error: cannot create the log directory `/dev/null/logs`' "$tmp/broken.err" || fail "rank 0's error: $(cat "$tmp/broken.err")"
grep -q '^\[rank 1\] error: cannot create the log directory `/dev/null/logs`' "$tmp/broken.err" ||
  fail "rank 1's error is missing or unprefixed: $(cat "$tmp/broken.err")"
echo "PASS 5: $(grep -F '[rank 1]' "$tmp/broken.err" | cut -c1-90)"
