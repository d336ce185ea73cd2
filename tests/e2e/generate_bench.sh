#!/usr/bin/env bash
# generate_bench (scripts/bench_generate.sh's program) on the CPU: each mode's completions are
# generate_difflm's for the same flags (exact at batch 1 and 3, the threshold and the dual cache
# at batch 3); every row counts what was generated (3 prompts x G tokens; S forwards a prompt
# for the exact sampler and the cache, fewer under a low threshold); the agreement rows are
# recounted here from the completions. Its prompt file is generate_difflm's: a bad line and a
# mode list without exact are reported by line and flag.
set -euo pipefail
source "$2/tests/e2e/lib/inference.sh"
source "$src/tests/e2e/lib/python_numpy.sh"
tiny_checkpoint ckpt
cat > prompts.jsonl <<'P'
{"prompt_ids": [5, 17, 33, 2, 90, 14, 61]}
{"prompt_ids": [100, 3]}
{"prompt_ids": [44, 45, 46, 47]}
P
sampling=(--gen-length 16 --steps 16 --block-length 4 --seed 7 --device cpu)
"$bin/generate_bench" --load ckpt --prompts-jsonl prompts.jsonl "${sampling[@]}" --batch-sizes 1,3 \
  --modes exact,threshold,dual --threshold 0.05 --completions-dir completions --output rows.jsonl 2> bench.err \
  || { cat bench.err; exit 1; }
gen() {  # gen OUT FLAGS...: generate_difflm's completions of the same prompts, all G tokens
  local out=$1; shift
  "$bin/generate_difflm" --load ckpt --prompts-jsonl prompts.jsonl "${sampling[@]}" --batch-size 3 \
    --no-stop-at-eos "$@" --output "$out" 2> gen.err || { cat gen.err; exit 1; }
}
gen exact.jsonl
gen threshold.jsonl --confidence-threshold 0.05
gen dual.jsonl --kv-cache dual
"$PY" - <<'PYEOF'
import json, sys
def tokens(path, key):
    return [json.loads(l)[key] for l in open(path)]
for mode, bs in [("exact", 1), ("exact", 3), ("threshold", 3), ("dual", 3)]:
    got = tokens(f"completions/{mode}.b{bs}.jsonl", "token_ids")
    want = tokens(f"{mode}.jsonl", "token_ids")
    if got != want:
        sys.exit(f"FAIL: generate_bench {mode} at batch {bs} gave {got}, generate_difflm {want}")
rows = [json.loads(l) for l in open("rows.jsonl")]
timed = {(r["impl"], r["batch_size"]): r for r in rows if "impl" in r}
agree = {r["agreement"]: r for r in rows if "agreement" in r}
assert len(timed) == 6 and len(agree) == 4, rows
for (impl, bs), r in timed.items():
    assert r["prompts"] == 3 and r["tokens"] == 48, r
    assert r["tokens_per_s"] > 0 and abs(r["tokens_per_s"] * r["seconds"] - 48) < 1e-6 * 48, r
    if impl == "megadlm threshold":  # several positions a step: fewer forwards than steps
        assert 4 <= r["forwards_per_prompt"] < 16, r
    else:
        assert r["forwards_per_prompt"] == 16, r
for mode in ["threshold", "dual"]:
    for bs in [1, 3]:
        a = tokens(f"completions/{mode}.b{bs}.jsonl", "token_ids")
        e = tokens(f"completions/exact.b{bs}.jsonl", "token_ids")
        r = agree[f"{mode} vs exact, batch {bs}"]
        same = sum(x == y for x, y in zip(a, e))
        changed = sum(p != q for x, y in zip(a, e) for p, q in zip(x, y))
        assert (r["prompts_identical"], r["tokens_changed"], r["prompts"], r["tokens"]) == (same, changed, 3, 48), (r, same, changed)
        print(f"{mode} vs exact, batch {bs}: {same}/3 prompts identical, {changed}/48 tokens changed")
PYEOF
set +e
printf '{"prompt_ids": [5, 6]}\n{"text": "no prompt here"}\n' > bad.jsonl
"$bin/generate_bench" --load ckpt --prompts-jsonl bad.jsonl "${sampling[@]}" --output x.jsonl > bad.out 2>&1
rc_line=$?
"$bin/generate_bench" --load ckpt --prompts-jsonl prompts.jsonl "${sampling[@]}" --modes dual --output x.jsonl > nox.out 2>&1
rc_modes=$?
set -e
[ $rc_line -eq 2 ] && grep -q 'bad.jsonl line 2: needs "prompt" or "prompt_ids"' bad.out \
  || { echo "FAIL: a bad prompt line (rc $rc_line)"; cat bad.out; exit 1; }
[ $rc_modes -eq 2 ] && grep -q '`--modes` must include exact' nox.out || { echo "FAIL: --modes without exact"; cat nox.out; exit 1; }
echo "PASS: generate_bench's completions are generate_difflm's; rows and agreement recounted; bad input reported"
