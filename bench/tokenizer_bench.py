#!/usr/bin/env python3
"""GPT-2 tokenizer throughput, Leantron next to tiktoken, on the same text in the same run.

Corpora are built from Debian documentation by scripts/make_corpora.py. For each corpus:
  tiktoken 1 thread   encode_ordinary(whole text), best of --repeat
  tiktoken 2 threads  encode_ordinary_batch(documents, num_threads=2), best of --repeat
  leantron            bench_tokenizer (in memory, cold piece cache each run), 1 and 2 threads
  leantron CLI        `tokenize encode` file -> /dev/null, 1 thread, whole process (load + I/O)
Prints a Markdown table (MB = 10^6 bytes of UTF-8 input).

  python3 bench/tokenizer_bench.py [--megabytes 32] [--repeat 3]
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "interop"))
from tiktoken_ref import BIN, reference, vocab_dir  # noqa: E402


def best(repeat, fn):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def ours(path, threads, repeat):
    out = subprocess.run([str(BIN / "bench_tokenizer"), "--tiktoken-file",
                          str(vocab_dir() / "gpt2.tiktoken"), "--threads", str(threads),
                          "--repeat", str(repeat), str(path)],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    header, row = out[0].split("\t"), out[1].split("\t")
    return dict(zip(header, row))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megabytes", type=float, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--corpora", default=str(ROOT / ".cache" / "corpora"))
    ap.add_argument("--skip-build", action="store_true",
                    help="use the corpora already in --corpora (e.g. carried to another machine)")
    args = ap.parse_args()
    corpora = pathlib.Path(args.corpora)
    if not args.skip_build:
        subprocess.run([sys.executable, str(ROOT / "scripts/make_corpora.py"), "--out",
                        str(corpora), "--megabytes", str(args.megabytes)], check=True)
    import tiktoken
    print(f"tiktoken {tiktoken.__version__}, {os.cpu_count()} CPUs", file=sys.stderr)
    enc = reference()
    rows = []
    for name in ["english", "multilingual", "code"]:
        path = corpora / f"{name}.txt"
        text = path.read_text(encoding="utf-8")
        docs = [json.loads(l)["text"] for l in (corpora / f"{name}.jsonl").open(encoding="utf-8")]
        mb = len(text.encode()) / 1e6
        tk1 = mb / best(args.repeat, lambda: enc.encode_ordinary(text))
        tk2 = mb / best(args.repeat, lambda: enc.encode_ordinary_batch(docs, num_threads=2))
        o1, o2 = ours(path, 1, args.repeat), ours(path, 2, args.repeat)
        assert int(o1["tokens"]) == len(enc.encode_ordinary(text)), "token counts differ"
        with open(path, "rb") as f, open(os.devnull, "wb") as null:
            cli = best(args.repeat, lambda: (f.seek(0), subprocess.run(
                [str(BIN / "tokenize"), "encode", "--tiktoken-file",
                 str(vocab_dir() / "gpt2.tiktoken")], stdin=f, stdout=null, check=True)))
        rows.append((name, mb, tk1, tk2, float(o1["encode_MBps"]), float(o2["encode_MBps"]),
                     mb / cli, float(o1["pretokenize_MBps"]), float(o1["lookup_MBps"]),
                     int(o1["whole_token_pieces"]) / int(o1["pieces"])))
    print("| corpus | MB | tiktoken 1T | tiktoken 2T | leantron 1T | leantron 2T | ×tiktoken 1T |"
          " ×tiktoken 2T | CLI 1T (load+I/O) | pre-tokenize only | + whole-piece lookup |"
          " pieces that are one token |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        name, mb, tk1, tk2, l1, l2, cli, pre, look, whole = r
        print(f"| {name} | {mb:.1f} | {tk1:.1f} | {tk2:.1f} | {l1:.1f} | {l2:.1f} | "
              f"{l1 / tk1:.1f}× | {l2 / tk2:.1f}× | {cli:.1f} | {pre:.0f} | {look:.0f} | "
              f"{whole:.0%} |")
    print("\nThroughput in MB/s of UTF-8 input; T = threads.")


if __name__ == "__main__":
    main()
