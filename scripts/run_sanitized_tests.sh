#!/usr/bin/env bash
# CI's sanitizer pass: the parser fuzzers (tests/unit/fuzz: thousands of mutated .idx,
# safetensors, checkpoint metadata, tokenizer.json and flag files, fixed seed) and the rendezvous
# tests (garbage, half-open, slow and oversized connections on the loopback), built with the
# address and undefined-behaviour sanitizers. A read out of bounds, a leak or undefined
# behaviour fails the run (UBSan halts instead of printing and going on).
#   scripts/run_sanitized_tests.sh            (build folder: $SANITIZE_BUILD_DIR, default build-asan)
# CPU only, no MPI: neither is what these tests exercise, and Open MPI's own allocations would be
# reported as leaks. ccache is shared with the other builds when installed.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${SANITIZE_BUILD_DIR:-build-asan}"
launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEGADLM_SANITIZE=ON \
  -DMEGADLM_WITH_CUDA=OFF -DMEGADLM_WITH_MPI=OFF -DMEGADLM_BUILD_APPS=OFF "${launcher[@]}" >/dev/null
cmake --build "$build_dir" -j"$(nproc)" --target unit_fuzz unit_comm
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
"$build_dir/bin/unit_fuzz"
"$build_dir/bin/unit_comm" --gtest_filter='TcpRendezvous.*:CollectiveRecord.*'
echo "sanitized tests passed (ASan + UBSan): unit_fuzz, unit_comm TcpRendezvous.* CollectiveRecord.*"
