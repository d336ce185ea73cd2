#!/usr/bin/env bash
# Generation benchmark on one GPU: tokens/s of megadlm's sampler for the MegaDLMs 1.7B
# architecture at gen length 256, block 32, 256 steps, batch 1 and 16 — the exact LLaDA sampler
# and the fast options (confidence threshold, Fast-dLLM's key/value cache, both), with how often
# each fast option changes the exact result — and transformers + LLaDA's sampler in PyTorch
# (scripts/bench_generate_reference.py) on the same model exported to Hugging Face. The megadlm
# rows come from one process (apps/generate_bench: one model load, an untimed warm-up batch per
# row). Writes OUT_DIR/bench_generate.json and OUT_DIR/bench_generate.md.
#
#   scripts/bench_generate.sh BIN_DIR OUT_DIR [CHECKPOINT_DIR]
# Without a checkpoint, a randomly initialised 1.7B model is saved first (one step on mock data,
# weights only): the speed does not depend on the weights, the agreement numbers do (a random
# model's confidences are flat: the threshold rarely fires and the cache's changes are those of
# an untrained model). Needs python3 with torch + transformers for the reference rows; without
# them, or if they fail, those rows say why and the rest stands.
# Knobs: PROMPTS (16), BATCH1_PROMPTS (all: how many of them batch size 1 times), PROMPT_LEN (32),
# THRESHOLD (0.9), MODES (exact,threshold,prefix,dual,dual+threshold), SKIP_REFERENCE=1; a smoke
# run on the CPU: CONFIG=configs/tiny_dlm.args DEVICE=cpu GEN_LENGTH=32 BLOCK_LENGTH=8 STEPS=32.
set -euo pipefail
bin=${1:?usage: bench_generate.sh BIN_DIR OUT_DIR [CHECKPOINT_DIR]}
out=${2:?usage: bench_generate.sh BIN_DIR OUT_DIR [CHECKPOINT_DIR]}
ckpt=${3:-}
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
n_prompts=${PROMPTS:-16}; batch1=${BATCH1_PROMPTS:-$n_prompts}; prompt_len=${PROMPT_LEN:-32}
threshold=${THRESHOLD:-0.9}; modes=${MODES:-exact,threshold,prefix,dual,dual+threshold}
config=${CONFIG:-configs/megadlms_1.7b.args}; device=${DEVICE:-cuda}
g_len=${GEN_LENGTH:-256}; k_len=${BLOCK_LENGTH:-32}; steps=${STEPS:-256}

if [ -z "$ckpt" ]; then
  ckpt="$out/ckpt"
  if [ ! -f "$ckpt/latest_checkpointed_iteration.txt" ]; then
    echo "== saving a randomly initialised checkpoint of $config to $ckpt"
    "$bin/pretrain_difflm" @"$src/$config" --mock-data --device "$device" --train-iters 1 \
      --global-batch-size 4 --lr-warmup-iters 0 --lr-decay-iters 10 --lr-wsd-decay-iters 1 --log-interval 1 --eval-iters 0 \
      --save "$ckpt" --save-interval 1 --no-save-optim > "$out/save.log" 2>&1
  fi
fi
meta="$ckpt/iter_$(printf %07d "$(cat "$ckpt/latest_checkpointed_iteration.txt")")/metadata.json"
read -r mask vocab < <(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['run_config']
print(d['diffusion']['mask_token'], d['model']['vocab_size'])" "$meta")
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
echo "== megadlm: $modes at batch 1 ($batch1 prompts) and 16 ($n_prompts prompts)"
"$bin/generate_bench" --load "$ckpt" --prompts-jsonl "$out/prompts.jsonl" --gen-length "$g_len" --steps "$steps" \
  --block-length "$k_len" --device "$device" --batch-sizes 1,16 --batch1-prompts "$batch1" --modes "$modes" \
  --threshold "$threshold" --completions-dir "$out/completions" --output "$results" 2> "$out/generate_bench.log" \
  || { tail -5 "$out/generate_bench.log"; exit 1; }
python3 - "$out" "$batch1" >> "$results" <<'P'
import json, sys
out, n1 = sys.argv[1], int(sys.argv[2])
e1 = [json.loads(l)["token_ids"] for l in open(f"{out}/completions/exact.b1.jsonl")]
e16 = [json.loads(l)["token_ids"] for l in open(f"{out}/completions/exact.b16.jsonl")][:n1]
print(json.dumps({"agreement": "exact batch 16 vs batch 1 (bf16: cuBLASLt may pick other kernels per shape)",
                  "prompts_identical": sum(p == q for p, q in zip(e1, e16)), "prompts": len(e1)}))
P

if [ "${SKIP_REFERENCE:-0}" != 1 ]; then
  if python3 -c "import torch, transformers" 2> "$out/reference_import.err"; then
    [ -f "$out/hf/config.json" ] || "$bin/convert_checkpoint" --to-hf --load "$ckpt" --out "$out/hf" --dtype bf16 \
      > "$out/convert.log" 2>&1
    for bs in 1 16; do
      echo "== transformers + reference sampler, batch $bs"
      max=$([ "$bs" = 1 ] && echo "$batch1" || echo 0)
      if ! python3 "$src/scripts/bench_generate_reference.py" --model "$out/hf" --prompts-jsonl "$out/prompts.jsonl" \
          --mask-id "$mask" --gen-length "$g_len" --steps "$steps" --block-length "$k_len" --batch-size "$bs" \
          --max-prompts "$max" --output "$out/reference.b$bs.jsonl" > "$out/reference.b$bs.out" 2> "$out/reference.b$bs.err"; then
        echo "{\"impl\": \"transformers+reference\", \"batch_size\": $bs, \"skipped\": $(tail -c 300 "$out/reference.b$bs.err" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}" >> "$results"
        continue
      fi
      tail -1 "$out/reference.b$bs.out" | tee -a "$results"
      python3 - "$out" "$bs" >> "$results" <<'P'
import json, sys
out, bs = sys.argv[1], sys.argv[2]
b = [json.loads(l)["token_ids"] for l in open(f"{out}/reference.b{bs}.jsonl")]
a = [json.loads(l)["token_ids"] for l in open(f"{out}/completions/exact.b{bs}.jsonl")][:len(b)]
print(json.dumps({"agreement": f"megadlm exact vs transformers+reference, batch {bs} (both bf16)",
                  "prompts_identical": sum(p == q for p, q in zip(a, b)), "prompts": len(b),
                  "tokens_changed": sum(x != y for p, q in zip(a, b) for x, y in zip(p, q))}))
P
    done
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
    f.write("| implementation | batch | prompts | tokens/s | forwards per prompt | vs reference | vs megadlm exact |\n"
            "|---|---|---|---|---|---|---|\n")
    for r in rows:
        if "tokens_per_s" not in r:
            continue
        ref = speed.get(("transformers+reference", r["batch_size"]))
        exact = speed.get(("megadlm exact", r["batch_size"]))
        ratio = "%.2fx" % (r["tokens_per_s"] / ref) if ref else ""
        vs_exact = "%.2fx" % (r["tokens_per_s"] / exact) if exact else ""
        forwards = r.get("forwards_per_prompt", r.get("forwards", ""))
        f.write(f"| {r['impl']} | {r['batch_size']} | {r['prompts']} | {r['tokens_per_s']:.1f} | {forwards} | {ratio} | {vs_exact} |\n")
    for r in rows:
        if "agreement" in r:
            f.write(f"\n{r['agreement']}: {r['prompts_identical']}/{r['prompts']} prompts identical"
                    + (f", {r['tokens_changed']}/{r.get('tokens', '?')} tokens changed" if "tokens_changed" in r else ""))
        if "skipped" in r:
            f.write(f"\n{r['impl']} (batch {r.get('batch_size', 'all')}): skipped or failed ({r['skipped']})")
    f.write("\n")
print(open(sys.argv[3]).read())
P
