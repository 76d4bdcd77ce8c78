#!/usr/bin/env bash
# Configures and builds DeepInfer into build/ (CUDA backend on when nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${CUDACXX:-}" && -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
