#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs dependencies, builds, fetches the GPT-2
# vocabulary, runs every test through ctest, then a short fuzz run of every fuzz target.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export LEANTRON_VOCAB_DIR="${LEANTRON_VOCAB_DIR:-$ROOT/.cache/gpt2}"
bash scripts/get_gpt2_vocab.sh >/dev/null
ctest --test-dir "${BUILD_DIR:-$ROOT/build}" --output-on-failure -j"$(nproc)"
FUZZ_SECONDS="${FUZZ_SECONDS:-20}" FUZZ_SEED="${FUZZ_SEED:-1}" bash scripts/fuzz.sh
