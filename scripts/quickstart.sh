#!/usr/bin/env bash
# The main job on a fresh machine: install, build, get GPT-2's vocabulary, and run the tools on
# real text (Debian's documentation). Each later stage runs when its tool exists in build/bin.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
export LEANTRON_VOCAB_DIR="${LEANTRON_VOCAB_DIR:-$ROOT/.cache/gpt2}"
bash scripts/get_gpt2_vocab.sh >/dev/null
BIN="$ROOT/build/bin"
WORK="${QUICKSTART_DIR:-$ROOT/out/quickstart}"
mkdir -p "$WORK"
VOCAB=(--vocab-file "$LEANTRON_VOCAB_DIR/encoder.json" --merge-file "$LEANTRON_VOCAB_DIR/vocab.bpe")
step() { printf '\n== %s\n' "$*"; }

step "1. A real corpus from Debian's documentation"
python3 scripts/make_corpora.py --out "$WORK/corpus" --megabytes 8 english multilingual
ls -la "$WORK/corpus"

step "2. Tokenize it (exactly tiktoken's GPT-2 ids)"
head -c 200 "$WORK/corpus/english.txt"; echo " ..."
start=$(date +%s%N)
"$BIN/tokenize" encode "${VOCAB[@]}" --threads "$(nproc)" <"$WORK/corpus/english.txt" >"$WORK/english.ids"
end=$(date +%s%N)
tokens=$(wc -w <"$WORK/english.ids")
bytes=$(stat -c %s "$WORK/corpus/english.txt")
python3 -c "import sys; b,t,s=int(sys.argv[1]),int(sys.argv[2]),int(sys.argv[3])/1e9; print(f'{b/1e6:.1f} MB -> {t} tokens in {s:.2f} s ({b/1e6/s:.0f} MB/s, whole process)')" \
  "$bytes" "$tokens" "$((end - start))"
"$BIN/tokenize" decode "${VOCAB[@]}" <"$WORK/english.ids" | cmp - "$WORK/corpus/english.txt" \
  && echo "decode(encode(text)) == text"
echo "First ids: $(head -c 80 "$WORK/english.ids") ..."
echo -n "hello world" | "$BIN/tokenize" count "${VOCAB[@]}" | sed 's/^/"hello world" has tokens: /'

echo
echo "quickstart: done (outputs in $WORK)"
