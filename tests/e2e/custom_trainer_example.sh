#!/usr/bin/env bash
# Installs libmegadlm into a temporary prefix and builds examples/custom_trainer against it with
# find_package(megadlm), as a user would, then runs it (it exits 0 only if its loss fell).
set -euo pipefail
bin=$1; src=$2
build=$(dirname "$bin")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/examples/custom_trainer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/build" -j2 >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib:${LD_LIBRARY_PATH:-}" "$tmp/build/custom_trainer"
