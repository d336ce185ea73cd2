#!/usr/bin/env bash
# The repository explains itself: no file cites a document a reader of the repository does not
# have — the design notes and specifications it was written from (a folder named shared, their file
# names, style-guide paragraphs) or issue numbers of a tracker that is not published. A citation
# becomes the fact itself or a page of docs/ (docs/rules.md for rule ids). Fails naming each line.
set -uo pipefail
src=$2
cd "$src" || exit 1
command -v git >/dev/null && git rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
  { echo "SKIP: not a git work tree"; exit 77; }
self=tests/e2e/no_outside_references.sh
# Spec file names count only as bare names: docs/parallelism/fsdp.md is the repository's own.
# ([d]: the pattern does not match its own line, so a plain grep of the tree finds nothing.)
pattern='share[d]/|(^|[^/A-Za-z_])(megatron-compat|fsdp|diffusion-lm|block-diffusion|fp8|gpu-libraries|reliability-tests|style)\.md|ARCHITECTURE\.md|[Ii]ssues? #?[0-9]+|[Ii]ssue-[0-9]+'
# Lines another piece of work in flight still has to change (path:text); empty when none.
allowed=()
hits=$(git ls-files -- src include apps docs tests scripts configs examples README.md CMakeLists.txt cmake tools |
       grep -v -x -F "$self" | xargs -d '\n' grep -n -I -E -- "$pattern" 2>/dev/null)
bad=""
while IFS= read -r hit; do
  [ -n "$hit" ] || continue
  skip=0
  for a in "${allowed[@]}"; do
    file=${a%%:*}; text=${a#*:}
    [[ "$hit" == "$file:"* && "$hit" == *"$text"* ]] && skip=1
  done
  [ "$skip" = 1 ] || bad+="  $hit"$'\n'
done <<< "$hits"
if [ -n "$bad" ]; then
  printf 'FAIL: references to files or issues outside the repository (write the fact, or cite docs/):\n%s' "$bad"
  exit 1
fi
echo "OK: no references outside the repository"
