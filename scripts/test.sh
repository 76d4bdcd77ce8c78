#!/usr/bin/env bash
# One command from a fresh clone: install what is missing, build, run every test (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
