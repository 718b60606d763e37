#!/usr/bin/env bash
# Packs build/bin programs and the shared libraries the device machine lacks (Abseil, simdjson,
# ICU 72, Gloo, ...) into .bundle/leantron.tar.gz, for the device tool's `carry`. Extra files
# (corpora, vocabularies) can be added with --add PATH (stored under data/); --quickstart-data adds
# the quickstart's English corpus preprocessed with GPT-2's tokenizer (data/quickstart/, for
# tests/gpu/test_gpu_fp8.py; built once into .cache/quickstart-data); --torchao adds the torchao
# wheel from PyPI (wheels/, for bench_train.py --peer torchao; scripts/device_check.sh installs it).
#   scripts/device_bundle.sh [--add PATH]... [--quickstart-data] [--torchao] [--name NAME]
#                            [PROGRAM...]
#     (default: every program in $BUILD_DIR/bin, into .bundle/leantron.tar.gz or .bundle/NAME.tar.gz)
# On the device:  mkdir -p /tmp/lt && tar -xzf .bundle/leantron.tar.gz -C /tmp/lt &&
#                 export PATH=/tmp/lt/bin:$PATH LD_LIBRARY_PATH=/tmp/lt/lib
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${BUILD_DIR:-$ROOT/build}/bin"
OUT="$ROOT/.bundle"
extra=()
wheels=()
programs=()
name=leantron
while (($#)); do
  case "$1" in
    --add) extra+=("$2"); shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --quickstart-data)
      q="$ROOT/.cache/quickstart-data/quickstart"
      if [[ ! -f "$q/english_text_document.idx" ]]; then
        mkdir -p "$q"
        export LEANTRON_VOCAB_DIR="${LEANTRON_VOCAB_DIR:-$ROOT/.cache/gpt2}"
        LEANTRON_BIN="$BIN" bash "$ROOT/scripts/get_gpt2_vocab.sh" >/dev/null
        python3 "$ROOT/scripts/make_corpora.py" --out "$q.corpus" --megabytes 8 english >/dev/null
        "$BIN/preprocess_data" --input "$q.corpus/english.jsonl" \
          --output-prefix "$q/english" --tokenizer-type GPT2BPETokenizer \
          --vocab-file "$LEANTRON_VOCAB_DIR/encoder.json" \
          --merge-file "$LEANTRON_VOCAB_DIR/vocab.bpe" --append-eod --workers 2 >/dev/null
      fi
      extra+=("$q"); shift ;;
    --torchao)
      w="$ROOT/.cache/wheels"
      ls "$w"/torchao-0.18.0-*.whl >/dev/null 2>&1 ||
        python3 -m pip download --no-deps torchao==0.18.0 -d "$w" >/dev/null
      wheels+=("$w"/torchao-0.18.0-*.whl); shift ;;
    *) programs+=("$1"); shift ;;
  esac
done
((${#programs[@]})) || mapfile -t programs < <(cd "$BIN" && ls)
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/data" "$OUT"
# The device machine has glibc, libstdc++, CUDA, cuDNN and NCCL of its own.
system='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libgcc_s\.|libstdc\+\+\.|libcuda\.|libcudart\.|libcublas|libcublasLt\.|libcudnn|libnccl\.|libnvrtc|libz\.)'
for p in "${programs[@]}"; do
  cp "$BIN/$p" "$stage/bin/"
  strip --strip-debug "$stage/bin/$p"  # debug info would dominate the 64 MiB a device call carries
  ldd "$BIN/$p" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $system ]] || cp -Ln "$path" "$stage/lib/$name"
  done
done
for f in "${extra[@]}"; do cp -r "$f" "$stage/data/"; done
if ((${#wheels[@]})); then mkdir -p "$stage/wheels" && cp "${wheels[@]}" "$stage/wheels/"; fi
tar -czf "$OUT/$name.tar.gz" -C "$stage" .
echo "$OUT/$name.tar.gz: $(du -h "$OUT/$name.tar.gz" | cut -f1) (${#programs[@]} programs, $(ls "$stage/lib" | wc -l) libraries)"
