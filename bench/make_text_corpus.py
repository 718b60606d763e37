#!/usr/bin/env python3
"""Builds a JSONL corpus of real human-written text from Debian documentation packages, for the
preprocess_data benchmark. The text is never committed; run this on the machine that benchmarks.

Sources: linux-doc-6.1 (English kernel docs, .rst/.txt, gzipped) and debian-reference-* (HTML in
ten languages, tags stripped). Each source file is cut into documents of a few paragraphs. To reach
the requested size the documents are written again in further passes, each pass regrouping the
paragraphs differently (seeded), so documents are not verbatim repeats.

  python3 bench/make_text_corpus.py --output /tmp/corpus_1g.jsonl --size-mb 1024
"""
import argparse
import glob
import gzip
import html
import json
import os
import random
import re

SOURCES = [
    "/usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz",
    "/usr/share/doc/linux-doc-6.1/Documentation/**/*.txt.gz",
    "/usr/share/doc/linux-doc-6.1/Documentation/**/*.rst",
    "/usr/share/doc/linux-doc-6.1/Documentation/**/*.txt",
    "/usr/share/debian-reference/*.html",
    "/usr/share/doc/maint-guide*/**/*.html",
    "/usr/share/common-licenses/*",
]


def read_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        text = f.read()
    if ".html" in path:
        text = re.sub(r"(?is)<(script|style).*?</\1>", " ", text)
        text = re.sub(r"(?s)<[^>]+>", "", text)
        text = html.unescape(text)
    return text


def paragraphs_by_file():
    files = sorted({p for pattern in SOURCES for p in glob.glob(pattern, recursive=True)
                    if os.path.isfile(p)})
    out = []
    for path in files:
        paras = [p.strip("\n") for p in re.split(r"\n\s*\n", read_text(path)) if p.strip()]
        if paras:
            out.append(paras)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    ap.add_argument("--size-mb", type=float, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    corpus = paragraphs_by_file()
    if not corpus:
        raise SystemExit("no Debian documentation found (apt-get install linux-doc-6.1 debian-reference-en)")
    target = int(args.size_mb * 1024 * 1024)
    rng = random.Random(args.seed)
    written = docs = passes = 0
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        while written < target:
            passes += 1
            for paras in corpus:
                i = 0
                while i < len(paras) and written < target:
                    n = rng.randint(2, 12) if passes > 1 else 6
                    line = json.dumps({"text": "\n\n".join(paras[i : i + n]), "id": docs},
                                      ensure_ascii=False) + "\n"
                    out.write(line)
                    written += len(line.encode("utf-8"))
                    docs += 1
                    i += n
                if written >= target:
                    break
            rng.shuffle(corpus)
    os.replace(tmp, args.output)
    print(f"{args.output}: {docs} documents, {written / 2**20:.1f} MiB, {passes} passes")


if __name__ == "__main__":
    main()
