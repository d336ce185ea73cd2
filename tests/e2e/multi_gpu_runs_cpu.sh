#!/usr/bin/env bash
# scripts/multi_gpu_runs.sh --cpu-dry for 2 "GPUs": its run list on the CPU under mpirun
# (tiny model, 2 iterations), so that the script's plumbing and its result parsing are proven
# before a multi-GPU machine runs it. Every 2-rank equivalence run must train and match the
# one-process run within the bound (FSDP's three sharding strategies among them); runs needing
# more ranks must be skipped with their reason; the killed rank must be named.
# Then the summary must notice a doctored loss (the comparison is not vacuous).
# Exit 77 (skipped) without MPI.
set -uo pipefail
bin=$1; src=$2
"$bin/comm_timeout_probe" --mpi-compiled 2>/dev/null || { echo "SKIP: this build has no MPI"; exit 77; }
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$src/scripts/multi_gpu_runs.sh" "$bin/.." "$tmp/out" 2 --cpu-dry --iters 2 > "$tmp/run.log" 2>&1 ||
  fail "the script exited $?: $(tail -20 "$tmp/run.log")"
tail -1 "$tmp/run.log"
[ -s "$tmp/out/results.jsonl" ] && [ -s "$tmp/out/results.md" ] || fail "no results file"

python3 - "$tmp/out/results.jsonl" <<'PY' || fail "results: see above"
import json, sys
res = {r["run"]: r for r in map(json.loads, open(sys.argv[1]))}
bad = []
def need(cond, what):
    if not cond: bad.append(what)
equivalence_2 = ["dp2", "dp2_overlap", "dp2_distopt", "tp2_sp", "tp2_sp_overlap", "pp2_vpp2", "cp2_p2p",
                 "cp2_all_gather", "cp2_a2a", "cp2_a2a_p2p", "ep2_allgather", "ep2_alltoall",
                 "fsdp2_optim", "fsdp2_optim_grads", "fsdp2_optim_grads_params"]
for name in ["ref_1gpu", "ref_1gpu_mbs2", "ref_moe_1gpu"] + equivalence_2:
    r = res.get(name)
    need(r is not None, name + ": no row")
    if r is None: continue
    need(r["status"] == "ok", "%s: status %s (%s)" % (name, r["status"], r.get("reason")))
    need(r.get("iterations") == 2, "%s: %s iterations" % (name, r.get("iterations")))
for name in equivalence_2:
    r = res.get(name, {})
    need(r.get("equal") is True, "%s: not equal (%s / %s, bound %s)" % (
        name, r.get("max_rel_loss_diff"), r.get("max_rel_grad_norm_diff"), r.get("bound")))
    need(r.get("reference") in ("ref_1gpu", "ref_moe_1gpu"), name + ": reference " + str(r.get("reference")))
    need(r.get("tokens_per_s_per_gpu", 0) > 0, name + ": no throughput")
# The noise run compares two micro-batch sizes of one process: a number, below the floor.
need(res.get("ref_1gpu_mbs2", {}).get("max_rel_loss_diff") is not None, "ref_1gpu_mbs2: no noise measured")
for name in ["tp2_pp2", "cp4", "dp8_distopt", "ep4_tp2_sp", "big_dp4_distopt"]:
    r = res.get(name, {})
    need(r.get("status") == "skipped" and "needs" in (r.get("reason") or ""), name + ": not skipped for its size")
for name in ["big_1gpu", "big_tp2_sp_overlap", "fgmoe_ep1"]:
    need(res.get(name, {}).get("status") == "skipped", name + ": a GPU-sized run was not skipped")
for name in ["plan_dp2", "plan_tp2_pp2_dp2"]:
    r = res.get(name, {})
    need(r.get("status") == "skipped" and r.get("reason") or r.get("status") == "ok", name + ": " + str(r))
k = res.get("fault_kill", {})
need(k.get("status") == "ok", "fault_kill: %s (%s)" % (k.get("status"), k.get("reason")))
need(k.get("victim_rank") == "1" and k.get("names_rank") is True, "fault_kill: the killed rank is not named: " + str(k))
need(k.get("ended_s") is not None and k["ended_s"] < 30, "fault_kill: the job did not end soon: " + str(k.get("ended_s")))
need(res.get("fault_stop", {}).get("status") == "skipped", "fault_stop: not skipped in --cpu-dry")
for b in bad: print("  " + b)
sys.exit(1 if bad else 0)
PY

# A doctored copy: one loss of the overlapped TP run moved by 1e-3 relative must be caught.
cp -r "$tmp/out" "$tmp/doctored"
python3 - "$tmp/doctored/logs/tp2_sp_overlap.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rows[-1]["lm_loss"] *= 1.001
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
"$src/scripts/multi_gpu_runs.sh" --summarize "$tmp/doctored" > "$tmp/summary.log" 2>&1 || fail "--summarize exited $?"
grep -q "not equal: tp2_sp_overlap$" "$tmp/summary.log" || fail "a 1e-3 loss change was not noticed: $(cat "$tmp/summary.log")"
grep -q '| tp2_sp_overlap | equivalence | 2 | ok |.*| \*\*no\*\* |' "$tmp/doctored/results.md" ||
  fail "results.md does not mark tp2_sp_overlap unequal"
echo "PASS: multi_gpu_runs.sh --cpu-dry ran $(grep -c '"status": "ok"' "$tmp/out/results.jsonl") runs and skipped $(grep -c '"status": "skipped"' "$tmp/out/results.jsonl") with their reasons"
