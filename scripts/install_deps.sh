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
  libopenmpi-dev openmpi-bin >/dev/null
echo "megadlm: dependencies installed"
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "megadlm: CUDA toolkit found at /usr/local/cuda: the CUDA backend will be built"
else
  echo "megadlm: no CUDA toolkit at /usr/local/cuda: CPU-only build"
fi
