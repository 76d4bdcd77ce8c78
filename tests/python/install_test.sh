#!/usr/bin/env bash
# scripts/install_python.sh writes a deepinfer.pth that makes the built package importable (into a
# temporary site dir here, not the user's).
# Usage: install_test.sh <build-dir>
set -euo pipefail
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
DEEPINFER_PY_SITE="$SITE" bash "$(dirname "$0")/../../scripts/install_python.sh" "$1"
grep -qx "$(realpath "$1")/python" "$SITE/deepinfer.pth"
echo "ok"
