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

# A small GPT-2-style model; the CPU backend runs it in a few minutes on 2 cores.
MODEL=(--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --openai-gelu
  --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 20
  --lr-decay-style cosine --lr-decay-iters 250 --data-path "$WORK/data/english_text_document"
  --split 98,2,0 "${VOCAB[@]}" --log-interval 10 --eval-interval 50 --eval-iters 4)
rm -rf "$WORK/ckpt_tp2" "$WORK/ckpt_pp2" "$WORK/hf"

step "5. Train 200 steps with tensor + sequence parallelism (2 processes, TP 2), saving at 100 and 200"
"$BIN/train" --nproc-per-node 2 --tensor-model-parallel-size 2 --sequence-parallel "${MODEL[@]}" \
  --train-iters 200 --save "$WORK/ckpt_tp2" --save-interval 100 2>&1 | tee "$WORK/train_tp2.log" \
  | grep -E "building|iteration +(10|100|200)/|validation loss at|saved checkpoint|\[Rank"

step "6. Reshard the checkpoint from TP 2 to PP 2 (optimizer state included)"
"$BIN/reshard_checkpoint" --load "$WORK/ckpt_tp2" --save "$WORK/ckpt_pp2" --target-tp 1 --target-pp 2
show "$BIN/inspect" checkpoint "$WORK/ckpt_pp2"

step "7. Resume from it with pipeline parallelism (2 stages, 1F1B) to step 250"
"$BIN/train" --nproc-per-node 2 --pipeline-model-parallel-size 2 "${MODEL[@]}" \
  --train-iters 250 --load "$WORK/ckpt_pp2" --save "$WORK/ckpt_pp2" --save-interval 250 2>&1 \
  | tee "$WORK/train_pp2.log" | grep -E "loaded|iteration +(210|250)/|validation loss at|saved checkpoint|\[Rank"

step "8. Export to HuggingFace (GPT2LMHeadModel, safetensors, true vocabulary size)"
mkdir -p "$WORK/hf_tokenizer"
cp "$LEANTRON_VOCAB_DIR/encoder.json" "$WORK/hf_tokenizer/vocab.json"
cp "$LEANTRON_VOCAB_DIR/vocab.bpe" "$WORK/hf_tokenizer/merges.txt"
"$BIN/convert_hf" --to-hf --load "$WORK/ckpt_pp2" --save "$WORK/hf" --copy-tokenizer-files \
  --tokenizer-dir "$WORK/hf_tokenizer"
ls -la "$WORK/hf"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print({k: c[k] for k in ('architectures','n_layer','n_embd','n_head','vocab_size','activation_function')})" "$WORK/hf/config.json"

step "9. The loss curve (train: every 10 steps; TP 2 for 1-200, resumed under PP 2 for 201-250)"
python3 - "$WORK/train_tp2.log" "$WORK/train_pp2.log" <<'PY'
import re, sys
points = []
for path in sys.argv[1:]:
    for line in open(path):
        m = re.search(r"iteration +(\d+)/.*\| lm loss: (\S+) \|", line)
        if m:
            points.append((int(m.group(1)), float(m.group(2))))
top = max(l for _, l in points)
for it, loss in points:
    if it % 20 == 0 or it > 200:
        print(f"{it:5d}  {loss:7.3f}  " + "#" * int(60 * loss / top))
PY

echo
echo "quickstart: done (outputs in $WORK)"
