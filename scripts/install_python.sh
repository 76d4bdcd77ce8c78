#!/usr/bin/env bash
# Makes `import deepinfer` work for the interpreter the module was built for (Debian's /usr/bin/python3
# unless the build chose another): writes deepinfer.pth, pointing at <build>/python, into that
# interpreter's user site-packages (no root needed). Re-run after moving the checkout.
# Usage: install_python.sh [BUILD_DIR] (default build). DEEPINFER_PY_SITE=DIR writes the .pth there instead.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath "${1:-build}")
PY=$(sed -n 's/^Python3_EXECUTABLE:FILEPATH=//p' "$BUILD/CMakeCache.txt" 2>/dev/null || true)
if [[ -z "$PY" || ! -f "$BUILD/python/deepinfer/__init__.py" ]] || ! ls "$BUILD"/python/deepinfer/_deepinfer*.so >/dev/null 2>&1; then
  echo "[deepinfer] no Python module in $BUILD (needs pybind11-dev and python3-dev; see scripts/install_deps.sh)" >&2
  exit 1
fi
SITE=${DEEPINFER_PY_SITE:-$("$PY" -c 'import site; print(site.getusersitepackages() if site.ENABLE_USER_SITE else "")')}
if [[ -z "$SITE" ]]; then
  echo "[deepinfer] $PY has no user site-packages; set DEEPINFER_PY_SITE to a directory on its path" >&2
  exit 1
fi
mkdir -p "$SITE"
echo "$BUILD/python" > "$SITE/deepinfer.pth"
"$PY" -c "import site, sys; site.addsitedir(sys.argv[1]); import deepinfer; print('[deepinfer] Python module for', sys.executable, 'from', deepinfer.__file__)" "$SITE"
