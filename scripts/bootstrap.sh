#!/usr/bin/env bash
# One command from a fresh clone: install what is missing, build, run the main job on the
# embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
./build/deepinfer generate --prompt "The capital of France is" --max-tokens 32 "$@"
