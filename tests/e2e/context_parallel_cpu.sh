#!/usr/bin/env bash
# The parallelism guide's CP line, run for real on the CPU under `mpirun -np 8` with the tiny
# model (configs/tiny_dlm.args). As written (`--context-parallel-size 2 --cp-comm-type p2p
# --hierarchical-context-parallel-sizes 2 4`) the levels multiply to 8, not 2, and the run is
# refused before any work (e2e/parallelism_guide_lines.sh checks the message); its valid variants
# run here: CP 2 x DP 4 with levels 2 1, CP 8 with levels 2 4 (p2p, and a2a+p2p: all-to-all inside
# pairs of ranks, a ring of 4 across them). Each must log the losses and gradient norms of the
# same run in one process, iteration by iteration, within 1e-5 relative.
set -uo pipefail
bin=$1; src=$2
fail() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || { echo "no mpirun: skipped"; exit 77; }
"$bin/comm_timeout_probe" --mpi-compiled 2>/dev/null || { echo "built without MPI: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi_flags=(-np 8)
if mpirun --version 2>&1 | grep -q "Open MPI\|OpenRTE"; then
  mpi_flags+=(--oversubscribe)
  [ "$(id -u)" = 0 ] && mpi_flags+=(--allow-run-as-root)
fi
# Micro-batch 2: 8 samples per iteration over DP 4 (the CP ranks of a DP rank read the same ones).
common=(@"$src/configs/tiny_dlm.args" --device cpu --train-iters 10 --lr-warmup-iters 2
        --micro-batch-size 2 --eval-iters 0 --log-interval 1)

"$bin/pretrain_difflm" "${common[@]}" --metrics-jsonl "$tmp/one.jsonl" > "$tmp/one.log" 2>&1 \
  || { cat "$tmp/one.log"; fail "the one-process run failed"; }

# metrics <file>: "iteration lm_loss grad_norm" per training row.
metrics() {
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    if "lm_loss" in row and "grad_norm" in row:
        print(row["iteration"], repr(row["lm_loss"]), repr(row["grad_norm"]))
PY
}
metrics "$tmp/one.jsonl" > "$tmp/one.txt"
[ "$(wc -l < "$tmp/one.txt")" -eq 10 ] || fail "expected 10 iterations in one process: $(cat "$tmp/one.txt")"

run_cp() {
  local label=$1; shift
  mpirun "${mpi_flags[@]}" "$bin/pretrain_difflm" "${common[@]}" "$@" --metrics-jsonl "$tmp/$label.jsonl" \
    > "$tmp/$label.log" 2>&1 || { tail -30 "$tmp/$label.log"; fail "$label: mpirun failed"; }
  grep -q "context-parallel size" "$tmp/$label.log" || { cat "$tmp/$label.log"; fail "$label: no CP in the start-up line"; }
  metrics "$tmp/$label.jsonl" > "$tmp/$label.txt"
  python3 - "$tmp/one.txt" "$tmp/$label.txt" "$label" <<'PY' || fail "$label: differs from one process"
import sys
ref = [l.split() for l in open(sys.argv[1])]
got = [l.split() for l in open(sys.argv[2])]
assert len(got) == len(ref), f"{len(got)} iterations, expected {len(ref)}"
for r, g in zip(ref, got):
    for name, a, b in (("lm loss", float(r[1]), float(g[1])), ("grad norm", float(r[2]), float(g[2]))):
        if abs(a - b) > 1e-5 * abs(a):
            sys.exit(f"iteration {r[0]}: {name} {b} vs {a} in one process")
print(f"{sys.argv[3]}: {len(got)} iterations equal to one process within 1e-5")
PY
}

run_cp cp2-dp4 --context-parallel-size 2 --cp-comm-type p2p --hierarchical-context-parallel-sizes 2 1
run_cp cp8-p2p --context-parallel-size 8 --cp-comm-type p2p --hierarchical-context-parallel-sizes 2 4
run_cp cp8-a2a-p2p --context-parallel-size 8 --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 4

# As written: refused before any work, naming the flags and the valid values.
out=$(mpirun "${mpi_flags[@]}" "$bin/pretrain_difflm" "${common[@]}" --context-parallel-size 2 \
      --cp-comm-type p2p --hierarchical-context-parallel-sizes 2 4 2>&1) && fail "the line as written ran"
grep -qF "\`--hierarchical-context-parallel-sizes 2 4\` multiply to 8, not to \`--context-parallel-size 2\`" <<< "$out" \
  || fail "the refusal does not name the flags: $out"
grep -qE 'iteration +[0-9]+/' <<< "$out" && fail "the line as written trained: $out"
echo "PASS"
