#!/usr/bin/env bash
# Puts GPT-2's vocabulary in $LEANTRON_VOCAB_DIR (default .cache/gpt2): gpt2.tiktoken from the
# openai-whisper source package on PyPI, and encoder.json + vocab.bpe derived from it by
# `tokenize export-vocab`. Every file is checked against the sha256 that tiktoken checks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${LEANTRON_VOCAB_DIR:-$ROOT/.cache/gpt2}"
BIN="${LEANTRON_BIN:-$ROOT/build/bin}"
PYTHON="${PYTHON:-python3}"
WHISPER="openai-whisper==20250625"
declare -A SHA=(
  [gpt2.tiktoken]=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
  [encoder.json]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  [vocab.bpe]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
)
ok() { [[ -f "$OUT/$1" ]] && echo "${SHA[$1]}  $OUT/$1" | sha256sum -c --status; }

mkdir -p "$OUT"
if ! ok gpt2.tiktoken; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "$PYTHON" -m pip download -q --no-deps --no-binary :all: "$WHISPER" -d "$tmp"
  tar -xzf "$tmp"/openai_whisper-*.tar.gz -C "$tmp" --wildcards '*/whisper/assets/gpt2.tiktoken'
  cp "$tmp"/openai_whisper-*/whisper/assets/gpt2.tiktoken "$OUT/gpt2.tiktoken.tmp"
  mv "$OUT/gpt2.tiktoken.tmp" "$OUT/gpt2.tiktoken"
  ok gpt2.tiktoken || { echo "get_gpt2_vocab: $OUT/gpt2.tiktoken has the wrong sha256" >&2; exit 1; }
fi
if ! ok encoder.json || ! ok vocab.bpe; then
  "$BIN/tokenize" export-vocab --tiktoken-file "$OUT/gpt2.tiktoken" --output-dir "$OUT"
  for f in encoder.json vocab.bpe; do
    ok "$f" || { echo "get_gpt2_vocab: derived $OUT/$f has the wrong sha256" >&2; exit 1; }
  done
fi
echo "$OUT"
