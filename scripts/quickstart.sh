#!/usr/bin/env bash
# The README's first command: install dependencies, build, and train the tiny diffusion LM on
# built-in mock data (on the GPU when one is visible, else on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
./build/bin/pretrain_difflm @configs/tiny_dlm.args --metrics-jsonl build/tiny_dlm_metrics.jsonl
