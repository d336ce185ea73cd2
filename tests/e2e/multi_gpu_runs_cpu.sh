#!/usr/bin/env bash
# scripts/multi_gpu_runs.sh --cpu-dry --shared-gpu 2: the run list on the CPU under mpirun
# (tiny model, 2 iterations), each rank started through scripts/shared_gpu_rank.sh as on a shared
# GPU, so that the script's plumbing and its result parsing are proven before a GPU runs it.
# Every 2-rank equivalence run must train and match the one-process run within the bound, both
# its curve and its step-1 gradients (--save-gradients, scripts/compare_gradients.py against the
# noise pair); runs needing more ranks must be skipped with their
# reason; the refused guide line must be refused; the killed rank must be named; results.md must
# mark the speeds meaningless. Then the summary must notice a doctored loss and a doctored
# gradient tensor (the comparisons are not vacuous).
# Exit 77 (skipped) without MPI.
set -uo pipefail
bin=$1; src=$2
"$bin/comm_timeout_probe" --mpi-compiled 2>/dev/null || { echo "SKIP: this build has no MPI"; exit 77; }
command -v mpirun > /dev/null || { echo "SKIP: no mpirun"; exit 77; }
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$src/scripts/multi_gpu_runs.sh" "$bin/.." "$tmp/out" --shared-gpu 2 --cpu-dry --iters 2 > "$tmp/run.log" 2>&1 ||
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
                 "fsdp2_optim", "fsdp2_optim_grads"]
for name in ["ref_1gpu", "ref_1gpu_mbs2", "ref_moe_1gpu", "ref_moe_1gpu_mbs2"] + equivalence_2:
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
    # Step-1 gradients: compared tensor by tensor against the reference with the noise pair.
    need(r.get("grad_equal") is True, "%s: step-1 gradients not equal (%s, beyond: %s, %s)" % (
        name, r.get("grad_rel_diff"), r.get("grad_beyond"), r.get("grad_note")))
    need(r.get("grad_noise_pair") is not None, name + ": gradients compared without the noise pair")
    need(r.get("grad_rel_diff") is not None and r["grad_rel_diff"] < 1e-5, "%s: whole-model gradient diff %s" % (
        name, r.get("grad_rel_diff")))
    need((r.get("shared_gpu") or "").startswith("shared GPU: 2 ranks"), name + ": not marked as a shared-GPU run")
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
# The guide's lines need 8 ranks (skipped here), but the refusal of the CP line as written is a
# dry run: checked.
for name in ["guide_tp4_sp", "guide_pp8_vpp4", "guide_ep4", "guide_custom_fsdp"]:
    r = res.get(name, {})
    need(r.get("status") == "skipped" and "needs 8" in (r.get("reason") or ""), name + ": not skipped for its size")
r = res.get("guide_cp2_as_written", {})
need(r.get("status") == "ok" and "multiply to 8" in (r.get("reason") or ""), "guide_cp2_as_written: " + str(r))
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
# ... and one tensor of the distributed optimizer's step-1 gradients moved by 1e-3 relative.
python3 - "$tmp/doctored/logs/dp2_distopt.grads/gradients.safetensors" <<'PY'
import array, json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
key = sorted(k for k in header if k.startswith("decoder.layers.0.") and "linear_fc1" in k)[0]
b, e = header[key]["data_offsets"]
x = array.array("f", bytes(raw[8 + n + b:8 + n + e]))  # F32, little-endian (x86)
raw[8 + n + b:8 + n + e] = array.array("f", (v * 1.001 for v in x)).tobytes()
open(sys.argv[1], "wb").write(bytes(raw))
PY
"$src/scripts/multi_gpu_runs.sh" --summarize "$tmp/doctored" > "$tmp/summary.log" 2>&1 || fail "--summarize exited $?"
grep -q "not equal: tp2_sp_overlap;" "$tmp/summary.log" || fail "a 1e-3 loss change was not noticed: $(cat "$tmp/summary.log")"
grep -q "step-1 gradients not equal: dp2_distopt$" "$tmp/summary.log" ||
  fail "a 1e-3 change of one gradient tensor was not noticed: $(cat "$tmp/summary.log")"
grep -q '| tp2_sp_overlap | equivalence | 2 | ok |.*| \*\*no\*\* |' "$tmp/doctored/results.md" ||
  fail "results.md does not mark tp2_sp_overlap unequal"
grep -q '| dp2_distopt | equivalence | 2 | ok |.*| [0-9.e+-]* \*\*no\*\* |.*linear_fc1' "$tmp/doctored/results.md" ||
  fail "results.md does not mark dp2_distopt's gradients unequal: $(grep dp2_distopt "$tmp/doctored/results.md")"
grep -q "^† shared GPU: 2 ranks" "$tmp/out/results.md" || fail "results.md does not mark the speeds meaningless"
echo "PASS: multi_gpu_runs.sh --cpu-dry ran $(grep -c '"status": "ok"' "$tmp/out/results.jsonl") runs and skipped $(grep -c '"status": "skipped"' "$tmp/out/results.jsonl") with their reasons"
