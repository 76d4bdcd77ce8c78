#!/usr/bin/env bash
# Builds self-contained `deepinfer` and `gpu_tests` (sm_90a, static PCRE2/ICU/libstdc++/cudart) on
# this machine, for a GPU machine that has the NVIDIA driver but none of our Debian dependencies,
# and packs them into build-gpu/bin.tar.xz (small enough to travel with the working tree).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/install_deps.sh
export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_CUDA=ON -DDEEPINFER_PORTABLE=ON >/dev/null
cmake --build build-gpu -j"$(nproc)" --target deepinfer gpu_tests op_bench
strip build-gpu/deepinfer build-gpu/tests/gpu_tests build-gpu/bench/op_bench
XZ_OPT=-9 tar -C build-gpu -cJf build-gpu/bin.tar.xz deepinfer tests/gpu_tests bench/op_bench
ls -la build-gpu/bin.tar.xz
