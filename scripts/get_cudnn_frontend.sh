#!/usr/bin/env bash
# Puts cudnn-frontend's C++ headers (NVIDIA's header-only graph API for cuDNN, used for flash
# attention) in .cache/cudnn-frontend/include, from the pinned PyPI wheel (sha256-checked). Only
# the headers are used; nothing is installed into Python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/.cache/cudnn-frontend"
PYTHON="${PYTHON:-python3}"
VERSION=1.32.0
WHEEL="nvidia_cudnn_frontend-$VERSION-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"
SHA=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0

[[ -f "$OUT/include/cudnn_frontend.h" && "$(cat "$OUT/VERSION" 2>/dev/null)" == "$VERSION" ]] &&
  exit 0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.11 --implementation cp --platform manylinux_2_28_x86_64 \
  "nvidia-cudnn-frontend==$VERSION" -d "$tmp"
echo "$SHA  $tmp/$WHEEL" | sha256sum -c --status ||
  { echo "get_cudnn_frontend: $WHEEL has the wrong sha256" >&2; exit 1; }
"$PYTHON" -m zipfile -e "$tmp/$WHEEL" "$tmp/x"
rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
cp -r "$tmp/x/include" "$OUT.tmp/include"
echo "$VERSION" >"$OUT.tmp/VERSION"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
