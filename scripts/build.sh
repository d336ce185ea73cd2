#!/usr/bin/env bash
# Configures and builds megadlm into build/ (CUDA when a toolkit is found). Extra arguments go
# to cmake's configure step, e.g. scripts/build.sh -DMEGADLM_WITH_CUDA=OFF
# Uses ccache when it is installed (rebuilds after small changes, and builds of several
# worktrees, then share one cache); BUILD_DIR picks another build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
