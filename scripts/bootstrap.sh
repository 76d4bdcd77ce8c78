#!/usr/bin/env bash
# One command from a fresh clone: install what is missing, build, make `import deepinfer` work for
# /usr/bin/python3, run the main job on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
bash scripts/install_python.sh build
./build/deepinfer generate --prompt "The capital of France is" --max-tokens 32 "$@"
