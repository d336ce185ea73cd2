#!/usr/bin/env bash
# The README's second command (and CI's): build, then run the unit, layout and end-to-end tests.
# GPU tests (label gpu) are built too and run only where a GPU is visible:
#   ctest --test-dir build -L gpu --output-on-failure
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"
ctest --test-dir build -L 'unit|layout|e2e' -j"$(nproc)" --output-on-failure --timeout 900
