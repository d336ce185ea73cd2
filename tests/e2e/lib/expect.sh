# shellcheck shell=bash
# Sourced by end-to-end tests that run a program and check how it ends:
#   fail MESSAGE...       prints "FAIL: MESSAGE" and ends the test
#   expect RC CMD...      runs CMD (a program or a function), keeps its stdout and stderr in $out,
#                         fails unless it exits with RC (works with and without `set -e`)
#   has TEXT...           fails unless each TEXT appears verbatim in $out
#   refuses TEXT CMD...   CMD exits 2 (refused) and says TEXT
fail() { echo "FAIL: $*"; exit 1; }
expect() {
  local want=$1 rc=0
  shift
  out=$("$@" 2>&1) || rc=$?
  [ "$rc" -eq "$want" ] || fail "exit $rc (expected $want): $* :: $(tail -5 <<< "$out")"
}
has() {
  local text
  for text in "$@"; do
    grep -qF -- "$text" <<< "$out" || fail "output lacks \"$text\": $(tail -5 <<< "$out")"
  done
}
refuses() {
  local text=$1
  shift
  expect 2 "$@"
  has "$text"
}
