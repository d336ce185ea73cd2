#!/usr/bin/env bash
# The block-diffusion loss curve against the PyTorch peer (scripts/bd_loss_curve.sh) feeds the
# peer the rows scripts/megatron_samples.py rebuilds from megadlm's --data-cache-path. This checks
# on the CPU, without torch or numpy, that those are the rows megadlm trained on: a Megatron
# dataset of random tokens (4000 ids, documents shorter and longer than a row, two epochs), the
# tiny model, 2 micro-batches an iteration, and megadlm's own gradients of one iteration
# (--save-gradients) as the witness:
#  - autoregressive (vanilla): the word embedding rows with a nonzero gradient are exactly the
#    token ids of that iteration's inputs w_0..w_{L-1} as megatron_samples.py assembles them;
#  - block diffusion: every embedding row with a gradient is a token of the rebuilt clean rows
#    x_0 = w_1..w_L or the mask token, and (nearly) every token of x_0's blocks before the last
#    two (which noisy queries with a masked token see) has one.
# Also: scripts/bd_curve_report.py's verdict on two identical curves and on an offset one.
set -uo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
py=python3
python3 "$src/scripts/make_synthetic_corpus.py" "$tmp/c" --tokens 1500 --eod 4001 --mask-token 4000 > /dev/null ||
  fail "make_synthetic_corpus.py"
args=$(grep -v '^#' "$src/configs/tiny_dlm.args" | tr '\n' ' ' \
       | sed -e 's/--mock-data//' -e 's/--vocab-size [0-9]*//' -e 's/--mask-token [0-9]*//' \
             -e 's/--train-iters [0-9]*//' -e 's/--difflm-varilen-prob [0-9.]*//' \
             -e 's/--model-running-mode [a-z-]*//' -e 's/--attention-mask-type [a-z_]*//')
run() {  # run NAME ITER FLAGS...: 9 iterations, the gradients of iteration ITER in $tmp/NAME
  # shellcheck disable=SC2086
  "$bin/pretrain_difflm" $args --device cpu --data-path "$tmp/c" --split 100,0,0 \
    --tokenizer-type NullTokenizer --vocab-size 4002 --mask-token 4095 --difflm-varilen-prob 0 \
    --micro-batch-size 2 --global-batch-size 4 --train-iters 9 --lr-warmup-iters 2 --eval-iters 0 --log-interval 1 \
    --data-cache-path "$tmp/cache_$1" --save-gradients "$tmp/$1" --save-gradients-iteration "$2" "${@:3}" \
    > "$tmp/$1.log" 2>&1 || fail "$1: pretrain_difflm exited $?: $(tail -5 "$tmp/$1.log")"
  [ -s "$tmp/$1/gradients.safetensors" ] || fail "$1: no gradients.safetensors"
}
run ar 7 --model-running-mode vanilla
run bd 8 --model-running-mode difflm-noshift --attention-mask-type block_causal --dlm-block-size 16 \
  --dlm-loss-weight inv_t_eps

"$py" - "$src/scripts" "$tmp" <<'PY' || fail "the rebuilt rows are not megadlm's (above)"
import json, struct, sys, array
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[1])
from megatron_samples import CachedGptSamples
tmp = sys.argv[2]

def embedding_rows_with_grad(path):
    raw = open(path, "rb").read()
    n = struct.unpack_from("<Q", raw, 0)[0]
    header = json.loads(raw[8:8 + n])
    names = [k for k in header if k != "__metadata__" and "word_embeddings" in k]
    assert len(names) == 1, names
    t = header[names[0]]
    assert t["dtype"] == "F32", t
    rows, cols = t["shape"]
    b, e = t["data_offsets"]
    g = array.array("f"); g.frombytes(raw[8 + n + b:8 + n + e])
    return {r for r in range(rows) if any(g[r * cols + c] != 0.0 for c in range(cols))}

gbs, ok = 4, True
s = CachedGptSamples(f"{tmp}/cache_ar", f"{tmp}/c")
assert s.desc["num_samples"] == 9 * gbs, s.desc
epochs = len(s.document_index) // len(s.data.lengths)
inputs = [s.sample(g)[:-1] for g in range(6 * gbs, 7 * gbs)]          # iteration 7: w_0..w_{L-1}
want = {t for r in inputs for t in r}
got = embedding_rows_with_grad(f"{tmp}/ar/gradients.safetensors")
print(f"vanilla, iteration 7: {len(got)} embedding rows with a gradient, {len(want)} token ids in the rebuilt rows "
      f"(dataset of {len(s.data.lengths)} documents, {epochs} epochs of indices)")
if got != want:
    ok = False
    print(f"  differ: only megadlm {sorted(got - want)[:10]}, only the rebuilt rows {sorted(want - got)[:10]}")
s = CachedGptSamples(f"{tmp}/cache_bd", f"{tmp}/c")
clean = s.iteration_rows(8, gbs)                                         # x_0 = w_1..w_L
toks = {t for r in clean for t in r}
got = embedding_rows_with_grad(f"{tmp}/bd/gradients.safetensors")
extra = got - toks - {4095}
# A clean token of block b is seen by the noisy queries of blocks > b only, and counts when one of
# them holds a masked token: no noisy query sees the last block, one block may miss (p ~ 1/17),
# two blocks both miss rarely (~1/300). So: every token of the blocks before the last two.
seen = {t for r in clean for t in r[:len(r) - 32]}
cover = len(got & seen) / len(seen)
print(f"block diffusion, iteration 8: {len(got)} rows with a gradient; outside x_0 and the mask: {len(extra)}; "
      f"tokens of x_0's blocks before the last two with a gradient: {cover:.1%}")
if extra or cover < 0.97 or 4095 not in got:
    ok = False
    print(f"  unexpected rows {sorted(extra)[:10]}")
# The rows of another iteration must not fit: the check can tell iterations apart.
other = {t for r in s.iteration_rows(7, gbs) for t in r}
if not (got - other - {4095}):
    ok = False
    print("  iteration 7's rows also fit: the check is too weak")
sys.exit(0 if ok else 1)
PY

# The report: a curve compared with itself passes, one 0.5 nats higher fails.
"$py" - "$tmp" <<'PY' || fail "writing the test curves"
import json, math, random, sys
tmp = sys.argv[1]
for name, seed, off in (("m", 1, 0.0), ("p1", 2, 0.0), ("p2", 3, 0.0), ("high", 4, 0.5)):
    rng = random.Random(seed)
    with open(f"{tmp}/{name}.jsonl", "w") as f:
        for it in range(1, 121):
            f.write(json.dumps({"iteration": it, "lm_loss": 8 * math.exp(-it / 60) + 3 + off + rng.gauss(0, 0.2)}) + "\n")
PY
"$py" "$src/scripts/bd_curve_report.py" "$tmp/m.jsonl" "$tmp/p1.jsonl" "$tmp/p2.jsonl" --out "$tmp/r" > "$tmp/r.log" ||
  fail "bd_curve_report.py on equal curves: $(cat "$tmp/r.log")"
grep -q '"verdict": "same curve"' "$tmp/r/bd_loss_curve.json" || fail "equal curves not called the same: $(cat "$tmp/r.log")"
grep -q '| 120 |' "$tmp/r/bd_loss_curve.md" || fail "no row for iteration 120 in the table"
"$py" "$src/scripts/bd_curve_report.py" "$tmp/high.jsonl" "$tmp/p1.jsonl" "$tmp/p2.jsonl" --out "$tmp/h" > "$tmp/h.log"
[ $? -eq 1 ] || fail "a curve 0.5 higher was not refused (exit 1): $(cat "$tmp/h.log")"
grep -q '"verdict": "different"' "$tmp/h/bd_loss_curve.json" || fail "the offset curve's verdict"
echo "PASS: the peer's rows are megadlm's rows; the report tells equal from offset curves"
