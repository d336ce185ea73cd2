#!/usr/bin/env bash
# "Nothing lost, nothing silent", the cases a user meets on the command line:
#   1. a non-finite flag value (--min-lr nan) stops the run before training, naming the flag;
#   2. a failed preprocess_data leaves the previous dataset of the prefix untouched;
#   3. --load D --save D with iter_* folders but no latest_checkpointed_iteration.txt is refused
#      (naming the folders and --ckpt-step), nothing overwritten; a rewind below newer checkpoints
#      is refused naming them and --overwrite-checkpoints; an edited index fails --check and the
#      resume; two runs saving into one folder:
#      the second refuses naming the first's pid; a kill -9'd holder's lock is taken over;
#   4. an unusable --save (a regular file) is refused at start-up naming the flag;
#   5. (MPI) an invalid flag on rank 1 only is reported, naming the rank; an error on every rank
#      is printed once;
#   6. convert_checkpoint --help, preprocess_data --workers abc, --vocab-size 1, a model too
#      large for the host;
#   7. preprocess_data follows Megatron: an empty text is a document without sequences, a list
#      of strings one document with one sequence per non-empty element.
set -uo pipefail
bin=$1; src=$2
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
source "$src/tests/e2e/lib/expect.sh"
train() { "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --log-interval 1 \
            --lr-warmup-iters 1 --lr-decay-iters 20 "$@"; }

# ---- 1
expect 2 train --train-iters 4 --min-lr nan --save "$tmp/nan" --save-interval 2
has '`--min-lr nan` must be a finite number >= 0'
! grep -qE " iteration +[0-9]+/" <<< "$out" || fail "1: training started"
[ ! -e "$tmp/nan/latest_checkpointed_iteration.txt" ] || fail "1: a checkpoint was written"
echo "PASS 1: --min-lr nan is refused before training: $(grep -o '`--min-lr nan`[^[]*' <<< "$out")"

# ---- 2
printf '{"text": "1 2 3"}\n{"text": "4 5"}\n' > "$tmp/good.jsonl"
printf '{"text": "1 2 3"}\n{"txt": "4 5"}\n' > "$tmp/bad.jsonl"
pre() { "$bin/preprocess_data" --tokenizer-type NullTokenizer --vocab-size 100 --append-eod "$@"; }
expect 0 pre --input "$tmp/good.jsonl" --output-prefix "$tmp/corpus"
cp "$tmp/corpus_text_document.bin" "$tmp/before.bin"; cp "$tmp/corpus_text_document.idx" "$tmp/before.idx"
expect 2 pre --input "$tmp/bad.jsonl" --output-prefix "$tmp/corpus"
has "bad.jsonl:2"
cmp -s "$tmp/before.bin" "$tmp/corpus_text_document.bin" || fail "2: the failed run changed the .bin"
cmp -s "$tmp/before.idx" "$tmp/corpus_text_document.idx" || fail "2: the failed run changed the .idx"
[ -z "$(ls "$tmp" | grep '\.tmp-')" ] || fail "2: temporary files left behind: $(ls "$tmp")"
echo "PASS 2: a failed preprocess_data left the earlier dataset byte-identical and no temporary files"

# ---- 3a: iter_* folders without the latest pointer
expect 0 train --train-iters 6 --save "$tmp/ck" --save-interval 2
rm "$tmp/ck/latest_checkpointed_iteration.txt"
sums=$(cd "$tmp/ck" && find iter_* -type f -exec sha256sum {} + | sort)
expect 2 train --train-iters 10 --load "$tmp/ck" --save "$tmp/ck" --save-interval 2
has "has no latest_checkpointed_iteration.txt but holds the checkpoint(s) iter_0000002, iter_0000004, iter_0000006"
has "--ckpt-step 6"
[ "$sums" = "$(cd "$tmp/ck" && find iter_* -type f -exec sha256sum {} + | sort)" ] || fail "3a: checkpoint files changed"
[ ! -d "$tmp/ck/iter_0000008" ] || fail "3a: the refused run saved"
expect 0 train --train-iters 8 --load "$tmp/ck" --ckpt-step 6 --save "$tmp/ck" --save-interval 2
has "successfully loaded checkpoint from $tmp/ck/iter_0000006"
echo "PASS 3a: a missing latest pointer is refused naming the folders and --ckpt-step; --ckpt-step 6 resumes"
# A rewind below newer checkpoints of the folder would overwrite another trajectory's 6 and 8.
sums=$(cd "$tmp/ck" && find iter_* -type f -exec sha256sum {} + | sort)
expect 2 train --train-iters 8 --load "$tmp/ck" --ckpt-step 4 --save "$tmp/ck" --save-interval 2
has "also holds 2 newer checkpoint(s) of another trajectory: iter_0000006, iter_0000008 (latest_checkpointed_iteration.txt names 8)"
has "would overwrite iter_0000006, iter_0000008 and move latest back"
has "add --overwrite-checkpoints"
[ "$sums" = "$(cd "$tmp/ck" && find iter_* -type f -exec sha256sum {} + | sort)" ] || fail "3a: the refused rewind changed checkpoints"
echo "PASS 3a: a rewind (--ckpt-step 4) over another trajectory's 6 and 8 is refused naming them and --overwrite-checkpoints"
# An edited index (the data position) fails convert_checkpoint --check and the resume, naming the file.
expect 0 "$bin/convert_checkpoint" --check "$tmp/ck"
has "the index (its SHA-256) and"
cp "$tmp/ck/iter_0000008/metadata.json" "$tmp/metadata.saved"
sed -i 's/"consumed_samples": 64,/"consumed_samples": 864,/' "$tmp/ck/iter_0000008/metadata.json"
! cmp -s "$tmp/metadata.saved" "$tmp/ck/iter_0000008/metadata.json" || fail "3a: the index was not edited"
expect 2 "$bin/convert_checkpoint" --check "$tmp/ck"
has "$tmp/ck/iter_0000008/metadata.json was modified after it was saved"
expect 2 train --train-iters 10 --load "$tmp/ck" --save "$tmp/ck" --save-interval 2
has "metadata.json was modified after it was saved"
cp "$tmp/metadata.saved" "$tmp/ck/iter_0000008/metadata.json"
echo "PASS 3a: an edited consumed_samples fails --check and the resume, naming the file"
# ... and a fresh run into a folder of another run is refused too.
expect 2 train --train-iters 4 --save "$tmp/ck" --save-interval 2
has "already holds 4 checkpoint(s) of another run (newest: iter_0000008)"

# ---- 3b: two runs, one folder
exec_train() { exec "$bin/pretrain_difflm" @"$src/configs/tiny_dlm.args" --device cpu --log-interval 1 --lr-warmup-iters 1 --lr-decay-iters 20 "$@"; }
exec_train --train-iters 100000 --save "$tmp/common" --save-interval 100000 --metrics-jsonl "$tmp/a.jsonl" > "$tmp/a.log" 2>&1 &
a=$!; pids+=("$a")
for _ in $(seq 600); do [ -s "$tmp/a.jsonl" ] && break; sleep 0.05; done
[ -s "$tmp/a.jsonl" ] || fail "3b: the first run did not start: $(tail -3 "$tmp/a.log")"
expect 2 train --train-iters 4 --save "$tmp/common" --save-interval 2
has "is in use by another run: pid $a on host $(hostname)"
kill -9 "$a"; wait "$a" 2>/dev/null
expect 0 train --train-iters 2 --save "$tmp/common" --save-interval 2
has "took over the lock $tmp/common/megadlm.lock of pid $a"
[ ! -e "$tmp/common/megadlm.lock" ] || fail "3b: the lock was not released at the end"
echo "PASS 3b: a second run into one folder is refused naming pid $a; after kill -9 its lock is taken over"

# ---- 4
touch "$tmp/a_file"
expect 2 train --train-iters 4 --save "$tmp/a_file" --save-interval 2
has "\`--save $tmp/a_file\` cannot be used: $tmp/a_file exists and is not a directory"
! grep -qE " iteration +[0-9]+/" <<< "$out" || fail "4: training started"
expect 2 train --train-iters 4 --data-cache-path "$tmp/a_file/cache"
has "\`--data-cache-path $tmp/a_file/cache\` cannot be used"
echo "PASS 4: an unusable --save / --data-cache-path is refused at start-up, naming the flag"

# ---- 5 (MPI)
if [ -x "$bin/comm_timeout_probe" ] && "$bin/comm_timeout_probe" --mpi-compiled && command -v mpirun > /dev/null; then
  flags=()
  version=$(mpirun --version 2>&1 || true)
  if grep -q "Open MPI" <<< "$version"; then
    flags+=(--oversubscribe)
    [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
  fi
  base=(@"$src/configs/tiny_dlm.args" --device cpu --train-iters 2)
  expect 2 timeout 120 mpirun "${flags[@]}" -np 1 "$bin/pretrain_difflm" "${base[@]}" : \
    -np 1 "$bin/pretrain_difflm" "${base[@]}" --hidden-size 0
  has "error: invalid configuration on rank 1:"
  has '`--hidden-size 0` must be between 1 and'
  expect 2 timeout 120 mpirun "${flags[@]}" -np 2 "$bin/pretrain_difflm" "${base[@]}" --adam-beta1 2
  has "error: invalid configuration on every rank:"
  [ "$(grep -c 'adam-beta1 2.0' <<< "$out")" -eq 1 ] || fail "5: the common error was not printed once: $out"
  echo "PASS 5: rank 1's invalid flag is reported naming the rank; an error of every rank is printed once"
else
  echo "SKIP 5: no MPI in this build or no mpirun"
fi

# ---- 6
expect 0 "$bin/convert_checkpoint" --help
has "usage:"
expect 2 pre --input "$tmp/good.jsonl" --output-prefix "$tmp/x" --workers abc
has '`--workers abc`: invalid value; valid: an integer'
expect 2 train --train-iters 2 --vocab-size 1 --mask-token 0
has '`--vocab-size 1` is too small for `--mock-data`'
expect 2 train --train-iters 2 --hidden-size 1000000 --ffn-hidden-size 4000000
has "the model does not fit:"
has "--hidden-size 1000000"
echo "PASS 6: --help, --workers abc, --vocab-size 1 and an oversized model are refused by flag"

# ---- 7: Megatron's documents (NullTokenizer: text = token ids; EOD = 99)
printf '{"text": "1 2"}\n{"text": ""}\n{"text": ["3 4", "", "5"]}\n' > "$tmp/docs.jsonl"
expect 0 pre --input "$tmp/docs.jsonl" --output-prefix "$tmp/docs"
# .idx: 9 bytes magic, u64 version, u8 dtype, u64 sequences N, u64 document entries D, i32[N] lengths
read -r n d <<< "$(od -An -t u8 -j 18 -N 16 "$tmp/docs_text_document.idx" | xargs)"
lengths=$(od -An -t d4 -j 34 -N $((4 * n)) "$tmp/docs_text_document.idx" | xargs)
docs=$(od -An -t d8 -j $((34 + 12 * n)) -N $((8 * d)) "$tmp/docs_text_document.idx" | xargs)
[ "$n $d" = "3 4" ] || fail "7: $n sequences and $d document entries, expected 3 and 4 (3 documents)"
[ "$lengths" = "3 2 2" ] || fail "7: sequence lengths $lengths, expected 3 2 2 ([1 2 EOD] [3 4] [5 EOD])"
[ "$docs" = "0 1 1 3" ] || fail "7: document index $docs, expected 0 1 1 3 (the empty text has no sequence)"
echo "PASS 7: empty text = a document without sequences; a list = one sequence per non-empty element"
echo "PASS: reliability_cli"
