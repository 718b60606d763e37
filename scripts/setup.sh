#!/usr/bin/env bash
# Installs everything the build, the tests and the quickstart need on a fresh Debian 12 machine,
# then configures and builds Leantron into build/. Safe to run again: it skips what is there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

packages=()
while read -r pkg; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || packages+=("$pkg")
done < scripts/apt-packages.txt
if ((${#packages[@]})); then
  echo "setup: installing ${packages[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${packages[@]}"
fi

PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install -q --disable-pip-version-check -r scripts/requirements-test.txt

# The CUDA backend's attention uses cudnn-frontend's headers (only needed when nvcc is there).
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  bash scripts/get_cudnn_frontend.sh
fi

BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
