#!/usr/bin/env bash
# pretrain_difflm --save-gradients and scripts/compare_gradients.py as a user runs them, on the
# CPU with the tiny model (fp32): two dumps of the same step with --micro-batch-size 4 and 2 (the
# same function, other GEMM shapes) agree within the fp32 floor and compare_gradients.py says so
# (exit 0); a dump whose one tensor is moved by 1e-3 relative, and a dump of another seed, are
# refused (exit 1) naming the tensors; the noise bound is K x the noise pair's difference per
# tensor; the dump holds the checkpoint's tensors (names, shapes), its norm is the logged grad norm
# (pre-clip), and a bad --save-gradients-iteration is refused naming the flag. The layouts' dumps
# are compared in tests/layout/gradient_dump (mpirun) and scripts/multi_gpu_runs.sh.
set -uo pipefail
bin=$1; src=$2
py=""  # compare_gradients.py needs numpy: the first python3 that has it (a pyenv python3 may not)
for p in python3 /usr/bin/python3; do
  command -v "$p" > /dev/null && "$p" -c "import numpy" 2> /dev/null && { py=$p; break; }
done
[ -n "$py" ] || { echo "SKIP: no python3 with numpy (apt-get install python3-numpy)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cmp_py="$src/scripts/compare_gradients.py"
train() {  # train NAME FLAGS...: 2 iterations, the first one's gradients in $tmp/NAME
  "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 2 --clip-grad 0.01 \
    --lr-warmup-iters 1 --global-batch-size 8 --log-interval 1 --metrics-jsonl "$tmp/$1.jsonl" --save-gradients "$tmp/$1" \
    "${@:2}" > "$tmp/$1.log" 2>&1 || fail "$1: pretrain_difflm exited $?: $(tail -5 "$tmp/$1.log")"
  [ -s "$tmp/$1/gradients.safetensors" ] || fail "$1: no $tmp/$1/gradients.safetensors"
  grep -q "saved the gradients of iteration 1 to $tmp/$1/gradients.safetensors" "$tmp/$1.log" ||
    fail "$1: the log does not say where the gradients went"
  [ ! -e "$tmp/$1/sharded" ] || fail "$1: the sharded intermediate was left behind"
}
train mbs4 --micro-batch-size 4
train mbs2 --micro-batch-size 2
train seed --micro-batch-size 4 --seed 99
# A checkpoint of the same model: the dump must hold exactly its tensors.
"$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 2 --lr-warmup-iters 1 \
  --global-batch-size 8 --exit-interval 1 --save "$tmp/ckpt" --save-interval 1 > "$tmp/ckpt.log" 2>&1 || fail "checkpoint run: $(tail -3 "$tmp/ckpt.log")"

"$py" - "$tmp" <<'PY' || fail "the dump's contents: see above"
import json, math, struct, sys
import numpy as np
tmp = sys.argv[1]
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    meta = h.pop("__metadata__", {})
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4").reshape(v["shape"])
            for k, v in h.items() if v["dtype"] == "F32"}, h, meta
g, h, meta = load(tmp + "/mbs4/gradients.safetensors")
bad = []
if meta.get("format") != "megadlm-gradients" or meta.get("iteration") != "1": bad.append("metadata %s" % meta)
if "tp 1" not in meta.get("layout", ""): bad.append("layout %r" % meta.get("layout"))
index = json.load(open(tmp + "/ckpt/iter_0000001/metadata.json"))
ckpt = {k[len("model/"):]: v for k, v in index["tensors"].items() if k.startswith("model/")}
if set(ckpt) != set(h): bad.append("names differ from the checkpoint's: %s" % sorted(set(ckpt) ^ set(h)))
for k in ckpt:
    if k in h and list(ckpt[k]["shape"]) != list(h[k]["shape"]): bad.append("%s: shape %s vs %s" % (k, h[k]["shape"], ckpt[k]["shape"]))
# The logged grad norm of iteration 1 (before clipping) is the dump's norm.
row = [json.loads(l) for l in open(tmp + "/mbs4.jsonl") if '"lm_loss"' in l][0]
norm = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in g.values()))
if abs(norm - row["grad_norm"]) > 1e-5 * row["grad_norm"]: bad.append("dump norm %.8g vs logged grad norm %.8g" % (norm, row["grad_norm"]))
if row["grad_norm"] <= 0.01: bad.append("grad norm %g: clipping (--clip-grad 0.01) inactive, untested" % row["grad_norm"])
for b in bad: print("  " + b)
sys.exit(1 if bad else 0)
PY

# The same step with other GEMM shapes: within the fp32 floor.
"$py" "$cmp_py" "$tmp/mbs2" "$tmp/mbs4" > "$tmp/same.out" 2>&1 || fail "mbs 2 vs 4 refused: $(tail -5 "$tmp/same.out")"
grep -q "^compare_gradients: [0-9]* tensor(s), 0 beyond their bound" "$tmp/same.out" || fail "summary: $(tail -2 "$tmp/same.out")"
grep -q '^| decoder.layers.0.self_attention.linear_proj.weight | 4096 | ' "$tmp/same.out" || fail "no table row: $(head -5 "$tmp/same.out")"

# One tensor moved by 1e-3 relative: refused, naming it.
"$py" - "$tmp/mbs2/gradients.safetensors" "$tmp/moved.safetensors" <<'PY'
import json, struct, sys
raw = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
b, e = json.loads(raw[8:8 + n])["decoder.layers.1.self_attention.linear_proj.weight"]["data_offsets"]
import numpy as np
x = np.frombuffer(bytes(raw[8 + n + b:8 + n + e]), "<f4") * np.float32(1.001)
raw[8 + n + b:8 + n + e] = x.astype("<f4").tobytes()
open(sys.argv[2], "wb").write(bytes(raw))
PY
"$py" "$cmp_py" "$tmp/moved.safetensors" "$tmp/mbs4" --json "$tmp/moved.json" > "$tmp/moved.out" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "a 1e-3 change of one tensor: exit $rc, expected 1: $(tail -3 "$tmp/moved.out")"
grep -q "^compare_gradients: [0-9]* tensor(s), 1 beyond their bound" "$tmp/moved.out" || fail "summary: $(tail -2 "$tmp/moved.out")"
grep -q '^| decoder.layers.1.self_attention.linear_proj.weight | .* | \*\*no\*\* |$' "$tmp/moved.out" ||
  fail "the moved tensor is not marked: $(grep linear_proj "$tmp/moved.out")"
"$py" -c "import json,sys; v=json.load(open(sys.argv[1])); sys.exit(0 if v['beyond']==['decoder.layers.1.self_attention.linear_proj.weight'] and v['equal'] is False else 1)" \
  "$tmp/moved.json" || fail "--json: $(cat "$tmp/moved.json" | head -20)"

# Another seed: another initialisation and other masks, every tensor far off.
"$py" "$cmp_py" "$tmp/seed" "$tmp/mbs4" --quiet > "$tmp/seed.out" 2>&1
[ $? = 1 ] || fail "another seed was accepted: $(cat "$tmp/seed.out")"

# The noise bound: K x the pair's difference per tensor. With the 1e-3 change as the "noise" of
# that tensor (pair moved / mbs4) and K = 3 the moved dump passes; the floor alone refuses it.
"$py" "$cmp_py" "$tmp/moved.safetensors" "$tmp/mbs4" --noise "$tmp/moved.safetensors" "$tmp/mbs2" --factor 3 \
  > "$tmp/noise.out" 2>&1 || fail "within 3 x its own noise, refused: $(tail -3 "$tmp/noise.out")"
"$py" "$cmp_py" "$tmp/moved.safetensors" "$tmp/mbs4" --noise "$tmp/mbs2" "$tmp/mbs4" --factor 3 --quiet \
  > "$tmp/noise2.out" 2>&1 && fail "1e-3 beyond 3 x the fp32 noise was accepted: $(cat "$tmp/noise2.out")"
# Bad input: a clear error naming the file.
echo nonsense > "$tmp/bad.safetensors"
"$py" "$cmp_py" "$tmp/bad.safetensors" "$tmp/mbs4" > "$tmp/bad.out" 2>&1
rc=$?
[ "$rc" = 2 ] || fail "a broken file: exit $rc, expected 2: $(cat "$tmp/bad.out")"
grep -q "bad.safetensors" "$tmp/bad.out" || fail "the error does not name the file: $(cat "$tmp/bad.out")"

# A --save-gradients-iteration beyond --train-iters is refused naming the flags.
"$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 2 --lr-warmup-iters 1 --save-gradients "$tmp/x" \
  --save-gradients-iteration 3 > "$tmp/iter.log" 2>&1
rc=$?
[ "$rc" = 2 ] || fail "--save-gradients-iteration 3 of 2 iterations: exit $rc, expected 2: $(tail -3 "$tmp/iter.log")"
grep -q -- "--save-gradients-iteration 3.* must be between 1 and .*--train-iters 2" "$tmp/iter.log" ||
  fail "the error does not name the flags: $(grep -i error "$tmp/iter.log")"
echo "PASS: gradient dumps: mbs 2 vs 4 within 1e-5 per tensor, a 1e-3 change of one tensor and another seed refused, noise bound per tensor"
