#!/usr/bin/env python3
"""The Python peer for bench/preprocess_bench.py: what Megatron's tools/preprocess_data.py does
for GPT-2. Worker processes (multiprocessing.Pool, imap with chunksize 32, as Megatron) run
json.loads and a GPT-2 tokenizer; the main process writes Megatron's .bin/.idx with numpy,
keeping lengths and document boundaries in lists until the end, as Megatron's
IndexedDatasetBuilder does. The tokenizer is either
  hf        HuggingFace's `tokenizers` byte-level BPE (what GPT2TokenizerFast runs, the HF-based
            path of current Megatron; `pip install tokenizers`), or
  tiktoken  tiktoken's gpt2 encode_ordinary: the fastest GPT-2 tokenizer Python has.
Both give the same ids; the benchmark checks the output files byte for byte.

  python3 bench/megatron_peer_preprocess.py --input C.jsonl --output-prefix P --vocab-dir D \
      --workers 2 --tokenizer hf
"""
import argparse
import json
import multiprocessing
import os
import struct
import sys
import time

import numpy as np

_ENCODE = None


def init(vocab_dir, tokenizer):
    global _ENCODE
    if tokenizer == "hf":
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        tok = Tokenizer(models.BPE.from_file(f"{vocab_dir}/encoder.json", f"{vocab_dir}/vocab.bpe"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        _ENCODE = lambda text: tok.encode(text).ids  # noqa: E731
    else:
        import tiktoken
        import tiktoken_ext.openai_public as openai_public
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks
        ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=f"{vocab_dir}/vocab.bpe",
                                                encoder_json_file=f"{vocab_dir}/encoder.json")
        enc = tiktoken.Encoding(name="gpt2", pat_str=openai_public.r50k_pat_str,
                                mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256},
                                explicit_n_vocab=50257)
        _ENCODE = enc.encode_ordinary


def encode(line):
    text = json.loads(line)["text"]
    sentences = text if isinstance(text, list) else [text]
    ids, lens = [], []
    for s in sentences:
        t = _ENCODE(s)
        if t:
            ids.extend(t)
            lens.append(len(t))
    if ids:
        ids.append(50256)
        lens[-1] += 1
    return ids, lens, len(line)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--output-prefix", required=True)
    ap.add_argument("--vocab-dir", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--log-interval", type=int, default=100000)
    ap.add_argument("--tokenizer", choices=["hf", "tiktoken"], default="hf")
    args = ap.parse_args()
    start = time.time()
    pool = multiprocessing.Pool(args.workers, initializer=init,
                                initargs=(args.vocab_dir, args.tokenizer))
    lengths, doc_index = [], [0]
    total = 0
    prefix = f"{args.output_prefix}_text_document"
    with open(args.input, encoding="utf-8") as fin, open(prefix + ".bin", "wb") as bin_:
        for count, (ids, lens, nbytes) in enumerate(pool.imap(encode, fin, 32), start=1):
            total += nbytes
            bin_.write(np.array(ids, dtype=np.uint16).tobytes(order="C"))
            lengths.extend(lens)
            doc_index.append(len(lengths))
            if count % args.log_interval == 0:
                elapsed = time.time() - start
                print(f"Processed {count} documents ({count / elapsed} docs/s, "
                      f"{total / elapsed / 1024 / 1024} MB/s).", file=sys.stderr)
    pool.close()
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if lengths:
        pointers[1:] = np.cumsum(np.array(lengths[:-1], dtype=np.int64) * 2)
    with open(prefix + ".idx", "wb") as idx:
        idx.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
        idx.write(struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_index)))
        idx.write(np.array(lengths, dtype=np.int32).tobytes())
        idx.write(pointers.tobytes())
        idx.write(np.array(doc_index, dtype=np.int64).tobytes())


if __name__ == "__main__":
    main()
