#!/usr/bin/env python3
"""End-to-end preprocess_data throughput beside a Python peer doing Megatron's pipeline
(bench/megatron_peer_preprocess.py), on the same corpus, with the same worker counts. Checks the
outputs are byte-identical, and prints a Markdown table (MB/s of JSONL, docs/s, peak RSS).

  python3 bench/make_text_corpus.py --output /tmp/corpus_1g.jsonl --size-mb 1024
  python3 bench/preprocess_bench.py --corpus /tmp/corpus_1g.jsonl --workers 1 2

Peak RSS is GNU time's %M: the largest single process (for the peer: its main process or one
worker, whichever is larger; each worker holds a tokenizer). Needs /usr/bin/time (Debian: time).
"""
import argparse
import filecmp
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def vocab_dir():
    for c in [os.environ.get("LEANTRON_VOCAB_DIR"), ROOT / ".cache/gpt2", ROOT / "../shared/gpt2"]:
        if c and (pathlib.Path(c) / "encoder.json").exists():
            return pathlib.Path(c).resolve()
    raise SystemExit("GPT-2 vocabulary not found: run scripts/get_gpt2_vocab.sh")


def run(cmd):
    """Wall seconds and peak RSS (MiB) of the command's largest process, measured by GNU time
    (a fork of this Python process would start with this process's RSS as its high-water mark)."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M", *cmd], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed:\n{err}")
    return wall, int(err.rsplit("maxrss_kb=", 1)[1].split()[0]) / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--bin", default=os.environ.get("LEANTRON_BIN", ROOT / "build/bin"))
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--peers", nargs="+", choices=["hf", "tiktoken"], default=["hf", "tiktoken"],
                    help="peer tokenizers: hf = HuggingFace tokenizers (Megatron's HF-based "
                         "path), tiktoken = the fastest Python GPT-2 tokenizer")
    args = ap.parse_args()
    vocab = vocab_dir()
    size = os.path.getsize(args.corpus)
    with open(args.corpus, "rb") as f:
        docs = sum(1 for _ in f)
    rows = []
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(args.corpus))) as tmp:
        for w in args.workers:
            ours = f"{tmp}/leantron{w}"
            wall, rss = run([f"{args.bin}/preprocess_data", "--input", args.corpus, "--output-prefix",
                             ours, "--vocab-file", f"{vocab}/encoder.json", "--merge-file",
                             f"{vocab}/vocab.bpe", "--append-eod", "--workers", str(w),
                             "--log-interval", "100000000"])
            rows.append(("Leantron preprocess_data", w, wall, rss))
            if args.skip_peer:
                continue
            for tokenizer in args.peers:
                peer = f"{tmp}/peer{tokenizer}{w}"
                wall, rss = run([sys.executable, str(ROOT / "bench/megatron_peer_preprocess.py"),
                                 "--input", args.corpus, "--output-prefix", peer, "--vocab-dir",
                                 str(vocab), "--workers", str(w), "--log-interval", "100000000",
                                 "--tokenizer", tokenizer])
                label = "HF tokenizers" if tokenizer == "hf" else "tiktoken"
                rows.append((f"Python peer (json + {label} + numpy)", w, wall, rss))
                for ext in [".bin", ".idx"]:
                    if not filecmp.cmp(f"{ours}_text_document{ext}", f"{peer}_text_document{ext}",
                                       shallow=False):
                        raise SystemExit(f"outputs differ ({ext}) with {w} workers ({tokenizer})")
            for p in pathlib.Path(tmp).glob(f"*{w}_text_document.*"):
                p.unlink()
    print(f"corpus: {args.corpus}, {size / 2**20:.1f} MiB, {docs} documents; cores: {os.cpu_count()}")
    print("| program | workers | wall s | MB/s (JSONL) | docs/s | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, w, wall, rss in rows:
        print(f"| {name} | {w} | {wall:.2f} | {size / 2**20 / wall:.1f} | {docs / wall:,.0f} | {rss:.0f} |")
    if not args.skip_peer:
        print("outputs byte-identical: yes")


if __name__ == "__main__":
    main()
