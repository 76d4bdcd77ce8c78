#!/usr/bin/env bash
# Installs what DeepInfer needs from Debian packages, only what is missing. Idempotent.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  nlohmann-json3-dev libpcre2-dev libicu-dev
  libgtest-dev libbenchmark-dev
  python3-dev pybind11-dev
  nodejs npm
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node's own tarball installs bring node and npm without the Debian packages; accept those.
if command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=()
  for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]}")
fi

if ((${#missing[@]})); then
  echo "[deepinfer] installing: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[deepinfer] all Debian packages present"
fi
