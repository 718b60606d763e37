"""Shared helpers for the tests that compare Leantron's tokenizers with their reference libraries
(HF tokenizers, sentencepiece, tiktoken): real text from Debian's documentation, random Unicode,
and running `tokenize` on many texts at once through its JSONL mode."""
import json
import random
import subprocess
import sys

from tiktoken_ref import BIN, ROOT


def make_corpora(out_dir, megabytes=1.5, names=("english", "multilingual", "code")):
    subprocess.run([sys.executable, str(ROOT / "scripts/make_corpora.py"), "--out", str(out_dir),
                    "--megabytes", str(megabytes), *names], check=True, capture_output=True)
    docs = {}
    for name in names:
        with open(out_dir / f"{name}.jsonl", encoding="utf-8") as f:
            docs[name] = [json.loads(line)["text"] for line in f]
    return docs


def split_corpora(docs):
    """Training text (the first documents of English and multilingual) and test text (the rest,
    and code): the tokenizers are compared on text they were not trained on."""
    train = docs["english"][: len(docs["english"]) // 2] + \
        docs["multilingual"][: len(docs["multilingual"]) // 3]
    test = docs["english"][len(docs["english"]) // 2:] + \
        docs["multilingual"][len(docs["multilingual"]) // 3:] + docs["code"]
    return train, test


WHITESPACE = [chr(c) for c in [9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x1680, 0x2000, 0x2028, 0x202F,
                               0x3000, 0x180E, 0x200B]]


def random_unicode(rng, n, specials=()):
    """Text mixing ASCII, white space of every kind, contractions, digits, combining marks and
    code points from the whole Unicode range (including ones assigned after Unicode 14)."""
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.15:
            out.append(rng.choice(WHITESPACE))
        elif r < 0.3:
            out.append(rng.choice(["'s", "'S", "'ll", "'Re", "'ſ", "'t", "0", "12", "345", "٣",
                                   "\r\n", "\n\n", "  ", "▁", "<", "|", ">", "\u0301", "ǅ"]))
        elif r < 0.45:
            out.append(chr(rng.randrange(0x20, 0x7F)))
        elif r < 0.5 and specials:
            out.append(rng.choice(specials))
        else:
            while True:
                c = rng.choice([rng.randrange(0x80, 0x800), rng.randrange(0x800, 0x10000),
                                rng.randrange(0x10000, 0x110000), rng.randrange(0x1C80, 0x1CC0)])
                if not 0xD800 <= c <= 0xDFFF:
                    break
            out.append(chr(c))
    return "".join(out)


def random_texts(seed, count, max_len=300, specials=()):
    rng = random.Random(seed)
    return [random_unicode(rng, rng.randrange(0, max_len), specials) for _ in range(count)]


def run_tool(name, args, stdin=b"", check=True):
    proc = subprocess.run([str(BIN / name), *args], input=stdin, capture_output=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} {' '.join(map(str, args))} failed ({proc.returncode}): "
                             f"{proc.stderr.decode(errors='replace')}")
    return proc


def encode_many(tokenizer_args, texts, *extra):
    """Ids of each text, through `tokenize encode --jsonl` (one process for all texts)."""
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    out = run_tool("tokenize", ["encode", "--jsonl", "--threads", "2", *tokenizer_args, *extra],
                   data).stdout.decode()
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) == len(texts) + 1
    return [[int(x) for x in line.split()] for line in lines[:-1]]


def decode_many(tokenizer_args, id_lists):
    data = "".join(" ".join(map(str, ids)) + "\n" for ids in id_lists).encode()
    out = run_tool("tokenize", ["decode", "--jsonl", *tokenizer_args], data).stdout.decode()
    return [json.loads(line)["text"] for line in out.split("\n")[:-1]]


def first_difference(ours, ref, texts, describe=None):
    """A readable message for the first text whose ids differ (None when all agree)."""
    assert len(ours) == len(ref)
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            j = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            msg = (f"{sum(x != y for x, y in zip(ours, ref))} of {len(ref)} texts differ; text {i} "
                   f"({texts[i][:60]!r}) at id {j}: ours {a[max(0, j - 3):j + 4]} reference "
                   f"{b[max(0, j - 3):j + 4]}")
            if describe:
                msg += f" ({describe(b[max(0, j - 3):j + 4])})"
            return msg
    return None
