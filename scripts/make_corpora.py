#!/usr/bin/env python3
"""Builds text corpora from real documents that Debian packages ship (see docs/benchmarks.md).

english      Debian Reference (en), the New Maintainers' Guide, the Linux kernel's English docs
multilingual Debian Reference in de/fr/es/ja/zh-cn and the kernel docs' translations
cjk          Debian Reference in Japanese and Chinese, and the kernel docs' zh/ja translations
code         C/C++ headers under /usr/include and the Python standard library

Each corpus is written as <out>/<name>.txt (documents separated by blank lines) and
<out>/<name>.jsonl ({"text": document} per line), stopping at --megabytes. Files are read in
sorted order, so the output is deterministic. Nothing here is committed: it is rebuilt on demand.
"""
import argparse
import glob
import gzip
import json
import os
import sys
import sysconfig

DOCS = "/usr/share/doc/linux-doc-6.1/Documentation"
REF = "/usr/share/debian-reference"


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace")


def paragraphs(text, max_chars=20000):
    """Splits a document into paragraph groups of at most max_chars: one JSONL record each."""
    out, cur = [], []
    size = 0
    for para in text.split("\n\n"):
        if size + len(para) > max_chars and cur:
            out.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(para)
        size += len(para) + 2
    if cur:
        out.append("\n\n".join(cur))
    return [p for p in out if p.strip()]


def sources(name):
    if name == "english":
        yield f"{REF}/debian-reference.en.txt.gz"
        yield "/usr/share/doc/maint-guide/maint-guide.en.txt.gz"
        for p in sorted(glob.glob(f"{DOCS}/**/*.rst.gz", recursive=True)):
            if "/translations/" not in p:
                yield p
    elif name == "multilingual":
        langs = ["de", "fr", "es", "ja", "zh-cn"]
        paths = [f"{REF}/debian-reference.{l}.txt.gz" for l in langs]
        paths += sorted(glob.glob(f"{DOCS}/translations/**/*.rst.gz", recursive=True))
        yield from (p for p in paths if os.path.exists(p))
    elif name == "cjk":
        paths = [f"{REF}/debian-reference.{l}.txt.gz" for l in ["ja", "zh-cn"]]
        for lang in ["ja_JP", "zh_CN", "zh_TW"]:
            paths += sorted(glob.glob(f"{DOCS}/translations/{lang}/**/*.rst.gz", recursive=True))
        yield from (p for p in paths if os.path.exists(p))
    elif name == "code":
        yield from sorted(glob.glob("/usr/include/**/*.h", recursive=True))
        stdlib = sysconfig.get_paths()["stdlib"]
        yield from sorted(glob.glob(f"{stdlib}/*.py"))
    else:
        raise SystemExit(f"unknown corpus {name}")


def build(name, out_dir, megabytes):
    limit = int(megabytes * 1e6)
    docs, total = [], 0
    for path in sources(name):
        if not os.path.exists(path):
            continue
        for doc in paragraphs(read(path)):
            docs.append(doc)
            total += len(doc.encode("utf-8"))
            if total >= limit:
                break
        if total >= limit:
            break
    if total == 0:
        raise SystemExit(f"make_corpora: no text for {name}: are the packages installed?")
    with open(f"{out_dir}/{name}.txt", "w", encoding="utf-8") as f:
        f.write("\n\n".join(docs))
    with open(f"{out_dir}/{name}.jsonl", "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--megabytes", type=float, default=32)
    ap.add_argument("names", nargs="*", default=["english", "multilingual", "code"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name in args.names:
        size = build(name, args.out, args.megabytes)
        print(f"{name}: {size / 1e6:.1f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
