"""`tokenize` against the real tiktoken package: real text in many languages, random Unicode,
every code point, special tokens, decode, pathological inputs, threads, and bad input."""
import hashlib
import json
import random
import subprocess
import sys

import pytest

from tiktoken_ref import BIN, ROOT, parse_ids, reference, run_tool, tokenize, vocab_dir

CORPORA = ["english", "multilingual", "code"]


@pytest.fixture(scope="session")
def corpora(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpora")
    subprocess.run([sys.executable, str(ROOT / "scripts/make_corpora.py"), "--out", str(out),
                    "--megabytes", "3"], check=True)
    return out


# --- vocabulary files -------------------------------------------------------------------------

def test_export_vocab_reproduces_openai_files_byte_for_byte(tmp_path):
    # sha256 of OpenAI's files as tiktoken checks them (specs/tokenizer.md).
    expected = {
        "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
        "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
        "gpt2.tiktoken": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    }
    d = vocab_dir()
    source = ["--tiktoken-file", str(d / "gpt2.tiktoken")] if (d / "gpt2.tiktoken").exists() else \
        ["--vocab-file", str(d / "encoder.json"), "--merge-file", str(d / "vocab.bpe")]
    run_tool("tokenize", ["export-vocab", *source, "--output-dir", str(tmp_path)])
    for name, sha in expected.items():
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == sha, name


def test_both_vocabulary_forms_give_the_same_ids(tmp_path):
    run_tool("tokenize", ["export-vocab", "--vocab-file", str(vocab_dir() / "encoder.json"),
                          "--merge-file", str(vocab_dir() / "vocab.bpe"), "--output-dir",
                          str(tmp_path)])
    text = "Tiktoken’s ranks and Megatron's merges: 同じ IDs 😀".encode()
    a = run_tool("tokenize", ["encode", "--tiktoken-file", str(tmp_path / "gpt2.tiktoken")], text)
    b = tokenize("encode", text)
    assert a.stdout == b.stdout
    assert parse_ids(a.stdout) == reference().encode_ordinary(text.decode())


def test_corrupt_and_mismatched_vocabularies_are_clear_errors(tmp_path):
    d = vocab_dir()
    merges = (d / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges[10], merges[11] = merges[11], merges[10]
    (tmp_path / "swapped.bpe").write_text("\n".join(merges), encoding="utf-8")
    p = run_tool("tokenize", ["encode", "--vocab-file", str(d / "encoder.json"), "--merge-file",
                              str(tmp_path / "swapped.bpe")], b"x", check=False)
    assert p.returncode == 2 and b"mismatched files" in p.stderr
    (tmp_path / "bad.tiktoken").write_bytes(b"IQ== 0\nnot base64! 1\n")
    p = run_tool("tokenize", ["encode", "--tiktoken-file", str(tmp_path / "bad.tiktoken")], b"x",
                 check=False)
    assert p.returncode == 2 and b"bad.tiktoken:2" in p.stderr
    p = run_tool("tokenize", ["encode", "--tiktoken-file", str(tmp_path / "missing")], b"x",
                 check=False)
    assert p.returncode == 2 and b"missing" in p.stderr


# --- test vectors and real text ---------------------------------------------------------------

@pytest.mark.parametrize("text,ids", [
    ("hello world", [31373, 995]),
    ("0" * 8, [8269]),
    ("0" * 16, [25645]),
    ("0" * 17, [8269, 10535, 830]),
])
def test_tiktoken_test_vectors(text, ids):
    assert parse_ids(tokenize("encode", text.encode()).stdout) == ids
    assert reference().encode_ordinary(text) == ids


@pytest.mark.parametrize("name", CORPORA)
@pytest.mark.parametrize("threads,block", [(1, None), (2, None), (3, 4096)])
def test_real_text_as_one_stream(corpora, name, threads, block):
    text = (corpora / f"{name}.txt").read_bytes()
    extra = ["--threads", str(threads)] + (["--block-bytes", str(block)] if block else [])
    out = tokenize("encode", text, *extra).stdout
    assert out.endswith(b"\n") and out.count(b"\n") == 1
    assert parse_ids(out) == reference().encode_ordinary(text.decode())


@pytest.mark.parametrize("name", CORPORA)
def test_real_text_as_jsonl(corpora, name):
    data = (corpora / f"{name}.jsonl").read_bytes()
    docs = [json.loads(line)["text"] for line in data.splitlines()]
    lines = tokenize("encode", data, "--jsonl", "--threads", "2").stdout.split(b"\n")
    assert lines[-1] == b"" and len(lines) == len(docs) + 1
    assert [parse_ids(l) for l in lines[:-1]] == reference().encode_ordinary_batch(docs)
    counts = tokenize("count", data, "--jsonl").stdout.split()
    assert [int(c) for c in counts] == [len(parse_ids(l)) for l in lines[:-1]]


# --- random and exhaustive Unicode ------------------------------------------------------------

WHITESPACE = [chr(c) for c in [9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                               0x2028, 0x2029, 0x202F, 0x205F, 0x3000]]
NOT_WHITESPACE_CONTROLS = [chr(c) for c in [0, 1, 0x1C, 0x1D, 0x1E, 0x1F, 0x7F, 0x200B, 0xFEFF]]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "’s", "''", "'"]
RANGES = {
    "ascii": (0x21, 0x7E), "latin1": (0xA1, 0xFF), "latin_ext": (0x100, 0x24F),
    "combining": (0x300, 0x36F), "greek": (0x370, 0x3FF), "cyrillic": (0x400, 0x4FF),
    "hebrew": (0x591, 0x5F4), "arabic": (0x600, 0x6FF), "devanagari": (0x900, 0x97F),
    "thai": (0xE01, 0xE5B), "hangul": (0xAC00, 0xD7A3), "hiragana": (0x3041, 0x309F),
    "katakana": (0x30A0, 0x30FF), "cjk": (0x4E00, 0x9FFF), "fullwidth": (0xFF01, 0xFF65),
    "emoji": (0x1F300, 0x1F6FF), "emoji2": (0x1F900, 0x1F9FF), "symbols": (0x2190, 0x23FF),
    "math_alnum": (0x1D400, 0x1D7FF), "private": (0xE000, 0xE0FF), "astral": (0x10000, 0x10FFFF),
}
DIGITS = "0123456789٠١٢٣٤٥٦٧٨٩०१२३४५६७८९０１２３４５６７８９²³¹¼½¾ⅠⅡⅫ"


def random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 40)):
        kind = rng.random()
        if kind < 0.15:
            parts.append("".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 6))))
        elif kind < 0.25:
            parts.append(" " * rng.randint(1, 5))
        elif kind < 0.33:
            parts.append(rng.choice(CONTRACTIONS))
        elif kind < 0.43:
            parts.append("".join(rng.choice(DIGITS) for _ in range(rng.randint(1, 12))))
        elif kind < 0.48:
            parts.append(rng.choice(NOT_WHITESPACE_CONTROLS))
        elif kind < 0.53:  # emoji with ZWJ, skin tone, variation selector, flags
            parts.append(rng.choice(["👩‍👩‍👧", "👍🏽", "❤️", "🇫🇷", "🏳️‍🌈", "😀😀😀"]))
        elif kind < 0.60:
            parts.append(rng.choice(["Hello", " world", "don't", "ÉCOLE", "naïve", "Straße",
                                     "中文字符", "日本語のテキスト", "한국어", "Ελληνικά"]))
        else:
            lo, hi = RANGES[rng.choice(list(RANGES))]
            chars = []
            for _ in range(rng.randint(1, 10)):
                c = rng.randint(lo, hi)
                chars.append(chr(c) if not 0xD800 <= c <= 0xDFFF else "?")
            parts.append("".join(chars))
    return "".join(parts)


def compare_jsonl(texts, *extra):
    data = "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts).encode()
    lines = tokenize("encode", data, "--jsonl", *extra).stdout.split(b"\n")[:-1]
    expected = reference().encode_ordinary_batch(texts)
    mismatches = [(t, parse_ids(l), e) for t, l, e in zip(texts, lines, expected)
                  if parse_ids(l) != e]
    assert len(lines) == len(texts)
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]!r}"


@pytest.mark.parametrize("seed", range(24))
def test_random_unicode_strings(seed):
    rng = random.Random(seed)
    compare_jsonl([random_text(rng) for _ in range(2000)], "--threads", str(1 + seed % 2))


def test_every_code_point_is_classified_as_tiktoken_does():
    # Each scalar value in positions where its class decides the split: after a letter, after
    # a space, beside digits, doubled, before a newline and at the end.
    texts = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        texts.append(f"a{c}{c}b {c}1{c}.{c}\n{c} ")
    compare_jsonl(texts, "--threads", "2")


# --- special tokens, decode, invalid UTF-8 ----------------------------------------------------

@pytest.mark.parametrize("text", [
    "hello <|endoftext|>", "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>",
    "x <|endoftext|> y  <|endoftext|>\n", "<|endoftext", "<|endoftext|>'s",
])
def test_special_tokens(text):
    ours = parse_ids(tokenize("encode", text.encode(), "--allow-special").stdout)
    assert ours == reference().encode(text, allowed_special="all")
    ordinary = parse_ids(tokenize("encode", text.encode()).stdout)
    assert ordinary == reference().encode_ordinary(text)
    assert 50256 not in ordinary


def test_decode_is_the_inverse(corpora):
    text = (corpora / "multilingual.txt").read_bytes()[:500_000]
    ids = reference().encode_ordinary(text.decode(errors="ignore"))
    out = tokenize("decode", " ".join(map(str, ids)).encode(), "--threads", "2",
                   "--block-bytes", "1000").stdout
    assert out == reference().decode_bytes(ids)
    rows = [reference().encode_ordinary(t) for t in ["a\n\"b\"", "日本", "\t\\x"]]
    data = "".join(" ".join(map(str, r)) + "\n" for r in rows).encode()
    out = tokenize("decode", data, "--jsonl").stdout.decode()
    assert [json.loads(l)["text"] for l in out.splitlines()] == ["a\n\"b\"", "日本", "\t\\x"]


def test_invalid_utf8_round_trips_byte_for_byte():
    rng = random.Random(5)
    for _ in range(50):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        ids = tokenize("encode", data).stdout
        assert tokenize("decode", ids).stdout == data
    # Valid text around invalid bytes is encoded as tiktoken encodes the valid parts alone when
    # the invalid byte sits where a piece boundary falls anyway.
    ids = parse_ids(tokenize("encode", b"hello world\xff").stdout)
    assert ids[:2] == reference().encode_ordinary("hello world")


# --- pathological inputs (correctness, with a generous time limit; not a timing test) -----------

@pytest.mark.parametrize("text", ["a" * 10_000_000, " " * 10_000_000, "😀" * 2_500_000,
                                  "ab" * 5_000_000, "中" * 3_000_000])
def test_pathological_inputs(text):
    data = text.encode()
    ours = run_tool("tokenize", ["encode", "--vocab-file", str(vocab_dir() / "encoder.json"),
                                 "--merge-file", str(vocab_dir() / "vocab.bpe")], data,
                    timeout=300).stdout
    assert parse_ids(ours) == reference().encode_ordinary(text)


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("line,message", [
    (b'{"text": "ok"}\n{"text": broken}\n', b"<stdin>:2: invalid JSON"),
    (b'{"text": "ok"}\n{"body": "x"}\n', b'<stdin>:2: no key "text"'),
    (b'{"text": 5}\n', b'<stdin>:1: "text" is not a string'),
    (b'["text"]\n', b"<stdin>:1: not a JSON object"),
    (b'{"text": "\xff"}\n', b"<stdin>:1: invalid JSON"),
])
def test_bad_jsonl_names_the_line(line, message):
    p = tokenize("encode", line, "--jsonl", check=False)
    assert p.returncode == 1 and message in p.stderr, p.stderr


def test_bad_ids_are_named():
    p = tokenize("decode", b"31373 99999 995", check=False)
    assert p.returncode == 1 and b"id 99999 at position 1" in p.stderr
    p = tokenize("decode", b"31373 x1 995", check=False)
    assert p.returncode == 1 and b'token 1: "x1" is not a token id' in p.stderr


def test_custom_json_key_and_empty_lines():
    data = b'{"body": "hello world", "text": 1}\n\n{"body": ""}\n'
    out = tokenize("encode", data, "--jsonl", "--json-key", "body").stdout
    assert out == b"31373 995\n\n\n"
