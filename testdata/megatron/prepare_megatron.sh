#!/usr/bin/env bash
# Runs HERE (the build machine), before make_fixtures.sh / resume_check.sh run on the GPU machine:
# exports the part of a Megatron-LM git checkout that pretrain_gpt.py needs into
# .cache/megatron-lm (ignored by git; carried to the device by name), and builds Megatron's dataset
# helpers (megatron/core/datasets/helpers.cpp, a pybind11 module) for the device's Python 3.12,
# which has no compiler headers of its own. Megatron runs `make` in that folder at start-up; the
# scripts put a no-op `make` first on PATH there, so the prebuilt module is used as it is.
#
#   testdata/megatron/prepare_megatron.sh GIT_DIR [COMMIT]
#     GIT_DIR: a Megatron-LM clone (its .git directory or a bare repository); COMMIT: default HEAD.
#   env PYTHON312: a Python 3.12 with headers (default: pyenv's 3.12.x, else python3.12 on PATH).
#
# What the device needs besides: torch, numpy, packaging, einops, pybind11-free (the module is
# built here), safetensors is not needed. Megatron's top-level imports for a
# `--transformer-impl local` GPT run are all guarded (TransformerEngine, Apex, flash-attn, ...) or
# in the device image's package list (torch, numpy, packaging, typing_extensions, triton, einops),
# so no wheels travel.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
GIT_DIR="${1:?usage: prepare_megatron.sh GIT_DIR [COMMIT]}"
COMMIT="${2:-HEAD}"
DEST="$ROOT/.cache/megatron-lm"
PY="${PYTHON312:-}"
if [[ -z "$PY" ]]; then
  for candidate in "$HOME"/.pyenv/versions/3.12.*/bin/python3 "$(command -v python3.12 || true)"; do
    [[ -x "$candidate" ]] && PY="$candidate" && break
  done
fi
[[ -n "$PY" ]] || { echo "prepare_megatron: no Python 3.12 (set PYTHON312)" >&2; exit 1; }
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version'

commit=$(git --git-dir="$GIT_DIR" rev-parse "$COMMIT^{commit}")
rm -rf "$DEST"
mkdir -p "$DEST"
# megatron/ and the three top-level modules pretrain_gpt.py imports (gpt_builders, model_provider).
git --git-dir="$GIT_DIR" archive "$commit" megatron pretrain_gpt.py gpt_builders.py model_provider.py \
  | tar -x -C "$DEST"
echo "$commit" >"$DEST/COMMIT"

# Megatron's dataset helpers for Python 3.12 (pybind11's headers from PyPI, into a scratch folder).
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$PY" -m pip install -q --disable-pip-version-check --target "$scratch/pybind11" "pybind11>=2.13"
includes=$(PYTHONPATH="$scratch/pybind11" "$PY" -m pybind11 --includes)
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
datasets="$DEST/megatron/core/datasets"
# shellcheck disable=SC2086
g++ -O3 -Wall -shared -std=c++17 -fPIC $includes "$datasets/helpers.cpp" -o "$datasets/helpers_cpp$suffix"
mkdir -p "$DEST/bin"
printf '#!/bin/sh\n# Megatron runs make in megatron/core/datasets; the helpers are prebuilt.\nexit 0\n' \
  >"$DEST/bin/make"
chmod +x "$DEST/bin/make"
echo "$DEST: Megatron-LM $commit, $(du -sh "$DEST" | cut -f1), helpers_cpp$suffix built with $("$PY" --version)"
