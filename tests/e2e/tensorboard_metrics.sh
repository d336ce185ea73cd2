#!/usr/bin/env bash
# Watching a run: pretrain_difflm --tensorboard-dir writes TensorBoard event files holding every
# Megatron scalar at every logged step, read back by an independent parser of the record framing
# with every CRC checked (scripts/check_tensorboard.py --reader builtin; on a machine with the
# tensorboard package, --reader tensorboard reads the same directory), values equal to the
# metrics JSONL; a flipped byte is detected. The iteration line ends with the estimated time
# left, --wandb-* flags say there is no network logging, and scripts/plot_metrics.py draws the
# curves (where matplotlib is installed; elsewhere it must say that it needs it).
set -euo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/tests/e2e/lib/python_numpy.sh"
cd "$tmp"
"$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --train-iters 20 --log-interval 5 \
  --eval-interval 10 --eval-iters 2 --tensorboard-dir tb --log-timers-to-tensorboard --log-throughput \
  --log-memory-to-tensorboard --log-validation-ppl-to-tensorboard --metrics-jsonl m.jsonl \
  --wandb-project demo > run.log 2> run.err || { cat run.log run.err; exit 1; }
grep -q "\`--wandb-project\` has no effect in megadlm (megadlm has no network logging" run.err \
  || { echo "FAIL: --wandb-project did not say there is no network logging"; cat run.err; exit 1; }
grep -Eq "number of nan iterations: +0 \| estimated time left: [0-9]+:[0-5][0-9]:[0-5][0-9] \|$" run.log \
  || { echo "FAIL: no estimated time left at the end of the iteration line"; grep " iteration" run.log; exit 1; }
grep " iteration  *20/" run.log | grep -q "estimated time left: 0:00:00 |" || { echo "FAIL: ETA at the last iteration"; exit 1; }
ls tb/events.out.tfevents.* > /dev/null
samples=$(seq -s, 8 8 160)
"$PY" "$src/scripts/check_tensorboard.py" tb --reader builtin --json tb.json \
  --expect "lm loss=1:20" --expect "learning-rate=1:20" --expect "grad-norm=1:20" --expect "batch-size=1:20" \
  --expect "loss-scale=1:20" --expect "lm loss vs samples=$samples" --expect "learning-rate vs samples=$samples" \
  --expect "iteration-time=5,10,15,20" --expect "throughput=5,10,15,20" --expect "mem-max-allocated-bytes=5,10,15,20" \
  --expect "lm loss validation=10,20" --expect "lm loss validation vs samples=80,160" \
  --expect "lm loss validation ppl=10,20" || { echo "FAIL: scalars missing"; exit 1; }
"$PY" - <<'P' || { echo "FAIL: TensorBoard values differ from the metrics JSONL"; exit 1; }
import json, math, sys
tb = {t: dict(v) for t, v in json.load(open("tb.json")).items()}
lines = [json.loads(l) for l in open("m.jsonl")]
bad = []
for j in lines:
    it = j["iteration"]
    if "lm_loss" in j:  # the line's loss is the mean over its 5 iterations
        mean = sum(tb["lm loss"][s] for s in range(it - 4, it + 1)) / 5
        if abs(mean - j["lm_loss"]) > 1e-5 * abs(j["lm_loss"]): bad.append(("lm loss", it, mean, j["lm_loss"]))
        if abs(tb["learning-rate"][it] - j["lr"]) > 1e-6 * j["lr"]: bad.append(("lr", it))
        if abs(tb["grad-norm"][it] - j["grad_norm"]) > 1e-5 * j["grad_norm"]: bad.append(("grad-norm", it))
        if abs(tb["iteration-time"][it] - j["elapsed_ms"] / 1e3) > 1e-5 * j["elapsed_ms"]: bad.append(("time", it))
    if "validation_lm_loss" in j and it in (10, 20):
        v = j["validation_lm_loss"]
        if abs(tb["lm loss validation"][it] - v) > 1e-5 * v: bad.append(("validation", it))
        if abs(tb["lm loss validation ppl"][it] - math.exp(v)) > 1e-5 * math.exp(v): bad.append(("ppl", it))
print("values compared:", len(lines), "metrics lines;", "mismatches:", bad)
sys.exit(1 if bad else 0)
P
# A flipped byte in the middle of the file is a CRC error, not a silently different number.
f=$(ls tb/events.out.tfevents.*)
"$PY" -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=0x40; open(p,'wb').write(b)" "$f"
if "$PY" "$src/scripts/check_tensorboard.py" tb --reader builtin > corrupt.out 2>&1; then
  echo "FAIL: a corrupted event file was read without error"; exit 1
fi
grep -q "CRC mismatch" corrupt.out || { cat corrupt.out; echo "FAIL: no CRC error"; exit 1; }
# Curves: a PNG where matplotlib is installed; elsewhere a clear message and exit 2.
set +e
"$PY" "$src/scripts/plot_metrics.py" m.jsonl --output curves.png > plot.out 2>&1
rc=$?
set -e
if "$PY" -c "import matplotlib" 2>/dev/null; then
  [ $rc -eq 0 ] && head -c 8 curves.png | od -An -c | grep -q "P   N   G" || { cat plot.out; echo "FAIL: no PNG"; exit 1; }
  echo "plot_metrics.py: $(cat plot.out)"
else
  [ $rc -eq 2 ] && grep -q "matplotlib is not installed" plot.out || { cat plot.out; echo "FAIL: plot_metrics.py without matplotlib"; exit 1; }
  echo "plot_metrics.py: matplotlib absent here, the script says so (exit 2)"
fi
echo "PASS: TensorBoard events hold every scalar at every logged step, CRCs checked; ETA; wandb notice"
