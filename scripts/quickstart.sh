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
# Shows the first lines of a command's output, each cut to 300 columns, without SIGPIPE.
show() { "$@" >"$WORK/.show" && sed -n '1,30p' "$WORK/.show" | cut -c1-300; }

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
echo "First ids: $(cut -c1-80 "$WORK/english.ids") ..."
echo -n "hello world" | "$BIN/tokenize" count "${VOCAB[@]}" | sed 's/^/"hello world" has tokens: /'

step "3. Preprocess into Megatron's .bin/.idx (byte-identical to Megatron's preprocess_data.py)"
mkdir -p "$WORK/data"
"$BIN/preprocess_data" --input "$WORK/corpus/english.jsonl" --output-prefix "$WORK/data/english" \
  --tokenizer-type GPT2BPETokenizer "${VOCAB[@]}" --append-eod --workers "$(nproc)"
"$BIN/preprocess_data" --input "$WORK/corpus/multilingual.jsonl" \
  --output-prefix "$WORK/data/multilingual" "${VOCAB[@]}" --append-eod --workers "$(nproc)"
show "$BIN/inspect" dataset "$WORK/data/english_text_document" --document 0 "${VOCAB[@]}"

step "4. Merge them, and show GPT sample 0 of a 70/30 blend in Megatron's sample order"
rm -rf "$WORK/parts" && mkdir -p "$WORK/parts" && cp "$WORK"/data/*_text_document.{bin,idx} "$WORK/parts/"
"$BIN/merge_datasets" --input "$WORK/parts" --output-prefix "$WORK/data/all"
show "$BIN/inspect" dataset "$WORK/data/all"
"$BIN/inspect" dataset 0.7 "$WORK/data/english_text_document" 0.3 "$WORK/data/multilingual_text_document" \
  --seq-length 1024 --split 949,50,1 --seed 1234 --num-samples 8000 880 80 --sample 0 \
  "${VOCAB[@]}" >"$WORK/.show"
sed -n '/^train samples/,$p' "$WORK/.show" | cut -c1-300

echo
echo "quickstart: done (outputs in $WORK)"
