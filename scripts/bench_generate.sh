#!/usr/bin/env bash
# Generation benchmark on one GPU (issue 16): tokens/s of generate_difflm for the MegaDLMs 1.7B
# architecture at gen length 256, block 32, 256 steps, batch 1 and 16 — the exact LLaDA sampler
# and the confidence-threshold fast option, with how often the fast result differs from the
# exact one — and transformers + LLaDA's sampler in PyTorch (scripts/bench_generate_reference.py)
# on the same model exported to Hugging Face. Writes OUT_DIR/bench_generate.json and .md.
#
#   scripts/bench_generate.sh BIN_DIR OUT_DIR [CHECKPOINT_DIR]
# Without a checkpoint, a randomly initialised 1.7B model is saved first (one training step on
# mock data, weights only): the speed does not depend on the weights, the agreement numbers do
# (a trained model's confidences are peakier). Needs python3 with torch + transformers for the
# reference rows; without them those rows are skipped and say why.
# Knobs: PROMPTS (default 16), PROMPT_LEN (32), THRESHOLD (0.9), SKIP_REFERENCE=1; for a smoke
# run on the CPU: CONFIG=configs/tiny_dlm.args DEVICE=cpu GEN_LENGTH=32 BLOCK_LENGTH=8 STEPS=32.
set -euo pipefail
bin=${1:?usage: bench_generate.sh BIN_DIR OUT_DIR [CHECKPOINT_DIR]}
out=${2:?usage: bench_generate.sh BIN_DIR OUT_DIR [CHECKPOINT_DIR]}
ckpt=${3:-}
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
n_prompts=${PROMPTS:-16}; prompt_len=${PROMPT_LEN:-32}; threshold=${THRESHOLD:-0.9}
config=${CONFIG:-configs/megadlms_1.7b.args}; device=${DEVICE:-cuda}
g_len=${GEN_LENGTH:-256}; k_len=${BLOCK_LENGTH:-32}; steps=${STEPS:-256}
gen=(--gen-length "$g_len" --block-length "$k_len" --steps "$steps" --device "$device" --no-stop-at-eos --seed 1234)

if [ -z "$ckpt" ]; then
  ckpt="$out/ckpt_1.7b"
  if [ ! -f "$ckpt/latest_checkpointed_iteration.txt" ]; then
    echo "== saving a randomly initialised checkpoint of $config to $ckpt"
    "$bin/pretrain_difflm" @"$src/$config" --mock-data --device "$device" --train-iters 1 \
      --global-batch-size 4 --lr-warmup-iters 0 --lr-decay-iters 10 --log-interval 1 --eval-iters 0 \
      --save "$ckpt" --save-interval 1 --no-save-optim > "$out/save.log" 2>&1
  fi
fi
mask=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['run_config']['diffusion']['mask_token'])" \
  "$ckpt/iter_$(printf %07d "$(cat "$ckpt/latest_checkpointed_iteration.txt")")/metadata.json" 2>/dev/null || echo 50277)
vocab=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['run_config']['model']['vocab_size'])" \
  "$ckpt/iter_$(printf %07d "$(cat "$ckpt/latest_checkpointed_iteration.txt")")/metadata.json" 2>/dev/null || echo 50289)
python3 - "$out/prompts.jsonl" "$n_prompts" "$prompt_len" "$vocab" "$mask" <<'P'
import json, random, sys
path, n, length, vocab, mask = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
random.seed(0)
with open(path, "w") as f:
    for i in range(n):
        ids = [random.randrange(0, vocab) for _ in range(length - (i % 4))]  # ragged: padding exercised
        f.write(json.dumps({"prompt_ids": [t if t != mask else 0 for t in ids]}) + "\n")
P

results="$out/bench_generate_rows.jsonl"
: > "$results"
run_megadlm() {  # name, batch, extra flags
  local name=$1 bs=$2; shift 2
  echo "== megadlm $name, batch $bs"
  # One untimed batch first (CUDA context, cuBLASLt plans), then the timed run of every prompt.
  head -n "$bs" "$out/prompts.jsonl" > "$out/warm.jsonl"
  "$bin/generate_difflm" --load "$ckpt" --prompts-jsonl "$out/warm.jsonl" "${gen[@]}" --batch-size "$bs" "$@" \
    --output /dev/null 2> /dev/null || true
  "$bin/generate_difflm" --load "$ckpt" --prompts-jsonl "$out/prompts.jsonl" "${gen[@]}" --batch-size "$bs" "$@" \
    --output "$out/$name.b$bs.jsonl" 2> "$out/$name.b$bs.log"
  python3 - "$out/$name.b$bs.log" "$out/$name.b$bs.jsonl" "$name" "$bs" >> "$results" <<'P'
import json, re, sys
log, comp, name, bs = sys.argv[1:5]
m = re.search(r"generated (\d+) tokens for (\d+) prompts in ([0-9.e+-]+) s", open(log).read())
rows = [json.loads(l) for l in open(comp)]
print(json.dumps({"impl": "megadlm " + name, "batch_size": int(bs), "tokens": int(m.group(1)), "prompts": int(m.group(2)),
                  "seconds": float(m.group(3)), "tokens_per_s": int(m.group(1)) / float(m.group(3)),
                  "forwards_per_prompt": sum(r["steps"] for r in rows) / len(rows)}))
P
  tail -1 "$results"
}
for bs in 1 16; do
  run_megadlm exact "$bs"
  run_megadlm threshold "$bs" --confidence-threshold "$threshold"
done
# How often the fast option changes the result (per prompt and per token), against the exact run.
python3 - "$out" >> "$results" <<'P'
import json, sys
out = sys.argv[1]
for bs in (1, 16):
    a = [json.loads(l)["token_ids"] for l in open(f"{out}/exact.b{bs}.jsonl")]
    b = [json.loads(l)["token_ids"] for l in open(f"{out}/threshold.b{bs}.jsonl")]
    diff_tok = sum(x != y for p, q in zip(a, b) for x, y in zip(p, q))
    print(json.dumps({"agreement": f"threshold vs exact, batch {bs}", "prompts_identical": sum(p == q for p, q in zip(a, b)),
                      "prompts": len(a), "tokens_changed": diff_tok, "tokens": sum(len(p) for p in a)}))
e1 = [json.loads(l)["token_ids"] for l in open(f"{out}/exact.b1.jsonl")]
e16 = [json.loads(l)["token_ids"] for l in open(f"{out}/exact.b16.jsonl")]
print(json.dumps({"agreement": "exact batch 16 vs batch 1 (bf16: cuBLASLt may pick other kernels per shape)",
                  "prompts_identical": sum(p == q for p, q in zip(e1, e16)), "prompts": len(e1)}))
P

if [ "${SKIP_REFERENCE:-0}" != 1 ]; then
  if python3 -c "import torch, transformers" 2> "$out/reference_import.err"; then
    [ -f "$out/hf/config.json" ] || "$bin/convert_checkpoint" --to-hf --load "$ckpt" --out "$out/hf" --dtype bf16 \
      > "$out/convert.log" 2>&1
    for bs in 1 16; do
      echo "== transformers + reference sampler, batch $bs"
      python3 "$src/scripts/bench_generate_reference.py" --model "$out/hf" --prompts-jsonl "$out/prompts.jsonl" \
        --mask-id "$mask" --gen-length "$g_len" --steps "$steps" --block-length "$k_len" --batch-size "$bs" \
        --output "$out/reference.b$bs.jsonl" | tee -a "$results"
    done
    python3 - "$out" >> "$results" <<'P'
import json, sys
out = sys.argv[1]
for bs in (1, 16):
    a = [json.loads(l)["token_ids"] for l in open(f"{out}/exact.b{bs}.jsonl")]
    b = [json.loads(l)["token_ids"] for l in open(f"{out}/reference.b{bs}.jsonl")]
    print(json.dumps({"agreement": f"megadlm exact vs transformers+reference, batch {bs} (both bf16)",
                      "prompts_identical": sum(p == q for p, q in zip(a, b)), "prompts": len(a),
                      "tokens_changed": sum(x != y for p, q in zip(a, b) for x, y in zip(p, q))}))
P
  else
    echo "{\"impl\": \"transformers+reference\", \"skipped\": \"$(tr -d '"\n' < "$out/reference_import.err" | tail -c 200)\"}" >> "$results"
  fi
fi

python3 - "$results" "$out/bench_generate.json" "$out/bench_generate.md" <<'P'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump(rows, open(sys.argv[2], "w"), indent=1)
speed = {(r["impl"], r["batch_size"]): r["tokens_per_s"] for r in rows if "tokens_per_s" in r}
with open(sys.argv[3], "w") as f:
    f.write("| implementation | batch | tokens/s | forwards per prompt | vs reference |\n|---|---|---|---|---|\n")
    for r in rows:
        if "tokens_per_s" not in r:
            continue
        ref = speed.get(("transformers+reference", r["batch_size"]))
        ratio = "%.2fx" % (r["tokens_per_s"] / ref) if ref else ""
        forwards = r.get("forwards_per_prompt", r.get("forwards", ""))
        f.write(f"| {r['impl']} | {r['batch_size']} | {r['tokens_per_s']:.1f} | {forwards} | {ratio} |\n")
    for r in rows:
        if "agreement" in r:
            f.write(f"\n{r['agreement']}: {r['prompts_identical']}/{r['prompts']} prompts identical"
                    + (f", {r['tokens_changed']}/{r.get('tokens', '?')} tokens changed" if "tokens_changed" in r else ""))
        if "skipped" in r:
            f.write(f"\n{r['impl']}: skipped ({r['skipped']})")
    f.write("\n")
print(open(sys.argv[3]).read())
P
