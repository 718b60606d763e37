"""TikTokenizer against tiktoken: rank files (.tiktoken, and Megatron's JSON list) made here from a
byte-level BPE trained on Debian's documentation, read with each named pattern (gpt2,
cl100k_base, o200k_base, llama3) and Megatron's v1/v2 scheme, and compared id for id with
tiktoken.Encoding on other real text and random Unicode; GPT-2's real rank file too."""
import base64
import json
import math
import re

import numpy as np
import pytest
import tiktoken
import tiktoken_ext.openai_public as openai_public

import hf_fixtures
from megatron_data_ref import NumpyIndexedDatasetBuilder
from tiktoken_ref import reference, vocab_dir
from tokenizer_testlib import (decode_many, encode_many, first_difference, make_corpora,
                               random_texts, run_tool, split_corpora)

O200K = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""",
    r"""\s+"""])
CL100K = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"""
          r""" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
# Megatron's TikTokenizer patterns (megatron/core/tokenizers/text/libraries/tiktoken_tokenizer.py).
V1 = r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
V2 = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
      r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
      r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MEGATRON_SPECIALS = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"]
LLAMA3_NAMES = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                "<|python_tag|>"]
LLAMA3_NAMES += [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA3_NAMES))]
SPECIAL_TEXTS = ["<|endoftext|>", "<|fim_prefix|>", "<|endofprompt|>", "<|begin_of_text|>",
                 "<|eot_id|>", "<s>", "</s>", "<SPECIAL_7>", "<unk>"]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    return split_corpora(make_corpora(tmp_path_factory.mktemp("corpora"), megabytes=1.2))


@pytest.fixture(scope="module")
def ranks(corpora, tmp_path_factory):
    """A rank file: the 256 bytes, then the merged tokens of a byte-level BPE trained here."""
    train, _ = corpora
    out = tmp_path_factory.mktemp("tt")
    folder = hf_fixtures.build("llama3", train, out, vocab_size=3000)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    byte_of = {}
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    n = 0
    for b in range(256):
        byte_of[chr(b if b in printable else 256 + n)] = b
        n += b not in printable
    tokens = [bytes([b]) for b in range(256)]
    for s, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        if len(s) > 1 and all(c in byte_of for c in s):
            tokens.append(bytes(byte_of[c] for c in s))
    (out / "ranks.tiktoken").write_text(
        "".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens)))
    (out / "ranks.json").write_text(json.dumps([
        {"rank": i, "token_bytes": base64.b64encode(t).decode(),
         "token_str": t.decode("utf-8", errors="replace")} for i, t in enumerate(tokens)]))
    return tokens, out


def texts_for(corpora):
    _, test = corpora
    return test[:200] + random_texts(seed=4, count=800, specials=SPECIAL_TEXTS) + \
        ["", "   ", "a\n\n  ", "x  \n", "1234567", "'S 'ſ 'LL"]


def named_encoding(name, tokens):
    rank_of = {t: i for i, t in enumerate(tokens)}
    pattern, specials = {
        "gpt2": (openai_public.r50k_pat_str, {"<|endoftext|>": 50256}),
        "cl100k_base": (CL100K, {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258,
                                 "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260,
                                 "<|endofprompt|>": 100276}),
        "o200k_base": (O200K, {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}),
        "llama3": (hf_fixtures.LLAMA3_PATTERN,
                   {t: len(tokens) + i for i, t in enumerate(LLAMA3_NAMES)}),
    }[name]
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=rank_of,
                             special_tokens=specials)


@pytest.mark.parametrize("name", ["gpt2", "cl100k_base", "o200k_base", "llama3"])
def test_named_patterns_match_tiktoken(ranks, corpora, name):
    tokens, out = ranks
    enc = named_encoding(name, tokens)
    texts = texts_for(corpora)
    args = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(out / "ranks.tiktoken"),
            "--tiktoken-pattern", name]
    ours = encode_many(args, texts)  # Megatron encodes with allowed_special="all"
    ref = [enc.encode(t, allowed_special="all") for t in texts]
    assert first_difference(ours, ref, texts) is None
    ours = encode_many(args, texts, "--no-allow-special")
    assert first_difference(ours, enc.encode_ordinary_batch(texts), texts) is None
    assert decode_many(args, ref[:300]) == [enc.decode(i) for i in ref[:300]]


def megatron_encoding(tokens, pattern, vocab_size, num_special=1000):
    """Megatron's TikTokenizer: special tokens first, ranks shifted by their count, the
    vocabulary cut to vocab_size - num_special ranks."""
    specials = MEGATRON_SPECIALS + [f"<SPECIAL_{i}>" for i in range(len(MEGATRON_SPECIALS),
                                                                     num_special)]
    inner = vocab_size - num_special
    ranks = {t: i + num_special for i, t in enumerate(tokens[:inner])}
    return tiktoken.Encoding("m", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens={t: i for i, t in enumerate(specials)})


@pytest.mark.parametrize("pattern", ["v1", "v2"])
@pytest.mark.parametrize("rank_file", ["ranks.json", "ranks.tiktoken"])
def test_megatron_scheme_matches(ranks, corpora, pattern, rank_file):
    tokens, out = ranks
    vocab_size = len(tokens) + 1000 - 200  # cuts the last 200 ranks, as Megatron does
    enc = megatron_encoding(tokens, {"v1": V1, "v2": V2}[pattern], vocab_size)
    texts = texts_for(corpora)
    args = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(out / rank_file),
            "--tiktoken-pattern", pattern, "--vocab-size", str(vocab_size)]
    ref = [enc.encode(t, allowed_special="all") for t in texts]
    assert first_difference(encode_many(args, texts), ref, texts) is None


def test_gpt2_rank_file_with_the_gpt2_pattern(corpora):
    texts = texts_for(corpora)
    args = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model",
            str(vocab_dir() / "gpt2.tiktoken"), "--tiktoken-pattern", "gpt2"]
    ref = [reference().encode(t, allowed_special="all") for t in texts]
    assert first_difference(encode_many(args, texts), ref, texts) is None


def test_preprocess_data_with_megatron_tiktokenizer(ranks, corpora, tmp_path):
    tokens, out = ranks
    vocab_size = len(tokens) + 1000
    enc = megatron_encoding(tokens, V2, vocab_size)
    _, test = corpora
    lines = [json.dumps({"text": t}) for t in test[:100]] + [json.dumps({"text": "a</s>b"})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    run_tool("preprocess_data", ["--input", str(tmp_path / "in.jsonl"), "--output-prefix",
                                 str(tmp_path / "ours"), "--tokenizer-type", "TikTokenizer",
                                 "--tokenizer-model", str(out / "ranks.json"), "--vocab-size",
                                 str(vocab_size), "--append-eod"])
    builder = NumpyIndexedDatasetBuilder(str(tmp_path / "peer_text_document"), np.uint16)
    for line in lines:
        ids = enc.encode(json.loads(line)["text"], allowed_special="all")
        if ids:
            ids.append(MEGATRON_SPECIALS.index("</s>"))  # Megatron's eod: </s>
        builder.add_document(ids, [len(ids)] if ids else [])
    builder.finalize()
    for ext in ("bin", "idx"):
        assert (tmp_path / f"ours_text_document.{ext}").read_bytes() == \
            (tmp_path / f"peer_text_document.{ext}").read_bytes(), ext
    out_train = run_tool("train", ["--tokenizer-type", "TikTokenizer", "--tokenizer-model",
                                   str(out / "ranks.json"), "--vocab-size", str(vocab_size),
                                   "--mock-data", "--num-layers", "1", "--hidden-size", "16",
                                   "--num-attention-heads", "2", "--seq-length", "8",
                                   "--micro-batch-size", "1", "--global-batch-size", "1",
                                   "--train-iters", "1", "--lr", "1e-3"]).stdout.decode()
    assert int(re.search(r"padded vocab (\d+)", out_train).group(1)) == \
        math.ceil(vocab_size / 128) * 128


def test_bad_settings_are_clear_errors(ranks):
    tokens, out = ranks
    base = ["encode", "--tokenizer-type", "TikTokenizer", "--tokenizer-model"]
    cases = [
        ([str(out / "ranks.tiktoken")], b"needs --tiktoken-pattern"),
        ([str(out / "ranks.tiktoken"), "--tiktoken-pattern", "p50k"], b"unknown --tiktoken-pattern"),
        ([str(out / "ranks.json"), "--tiktoken-pattern", "v2"], b"--vocab-size"),  # 131072 > ranks
        ([str(out / "ranks.json"), "--tiktoken-pattern", "cl100k_base"], b"v1 or v2"),
    ]
    for extra, message in cases:
        p = run_tool("tokenize", base + extra, b"x", check=False)
        assert p.returncode == 2 and message in p.stderr, (extra, p.stderr)
