"""SentencePieceTokenizer / Llama2Tokenizer / GPTSentencePieceTokenizer against the sentencepiece
library: BPE models trained here on Debian's documentation (Llama 2's options: identity
normalization, byte fallback, split digits, white-space-only pieces; the default NFKC charsmap;
unknown characters without byte fallback and user-defined symbols; white space as a suffix with
NFKC + case folding), compared id for id on other real text and random Unicode, decoded, and
written by preprocess_data as Megatron's pipeline writes them."""
import io
import json
import math
import re

import numpy as np
import pytest
import sentencepiece as spm

from megatron_data_ref import NumpyIndexedDatasetBuilder
from tokenizer_testlib import (decode_many, encode_many, first_difference, make_corpora,
                               random_texts, run_tool, split_corpora)

CONFIGS = {
    "llama2": dict(byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
                   remove_extra_whitespaces=False, split_digits=True,
                   allow_whitespace_only_pieces=True),
    "nmt_nfkc": dict(byte_fallback=True),
    "unknown_chars": dict(character_coverage=0.98, user_defined_symbols=["<sep>", "foo"]),
    "suffix_nfkc_cf": dict(byte_fallback=True, treat_whitespace_as_suffix=True,
                           normalization_rule_name="nmt_nfkc_cf"),
}
EXTRA = ["", " ", "  a  b  ", "\t\tx\n", "<sep> x<sep>y foofoo", "ｘｙｚ ①② ﬁ", "▁▁a", "123456",
         "<s></s><unk>"]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    return split_corpora(make_corpora(tmp_path_factory.mktemp("corpora"), megabytes=1.2))


@pytest.fixture(scope="module")
def models(corpora, tmp_path_factory):
    train, _ = corpora
    lines = [line for doc in train for line in doc.split("\n") if line.strip()]
    out = tmp_path_factory.mktemp("sp")
    paths = {}
    for name, cfg in CONFIGS.items():
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf,
                                       model_type="bpe", vocab_size=2500, minloglevel=2, **cfg)
        paths[name] = out / f"{name}.model"
        paths[name].write_bytes(buf.getvalue())
    return paths


def args_for(path, type_="SentencePieceTokenizer"):
    return ["--tokenizer-type", type_, "--tokenizer-model", str(path)]


@pytest.mark.parametrize("name", CONFIGS)
def test_ids_match_on_real_text_and_random_unicode(models, corpora, name):
    _, test = corpora
    texts = test + random_texts(seed=1, count=1200, specials=["<sep>", "foo", "▁", "<s>"]) + EXTRA
    sp = spm.SentencePieceProcessor(model_file=str(models[name]))
    ours = encode_many(args_for(models[name]), texts)
    ref = [sp.encode_as_ids(t) for t in texts]
    assert first_difference(ours, ref, texts, lambda ids: [sp.id_to_piece(i) for i in ids]) is None


def test_cjk_text_cut_between_characters(tmp_path):
    # Text is cut between two characters that no piece holds side by side. A model trained on
    # Japanese and Chinese holds thousands of multi-character pieces, so the cuts fall inside CJK
    # runs and segments of every length merge (one character, the scan, the tree, byte fallback
    # for characters outside the vocabulary).
    docs = make_corpora(tmp_path / "corpora", megabytes=1.0, names=["cjk"])["cjk"]
    train, test = docs[: len(docs) // 2], docs[len(docs) // 2:]
    lines = [line for doc in train for line in doc.split("\n") if line.strip()]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf,
                                   model_type="bpe", vocab_size=6000, minloglevel=2,
                                   **CONFIGS["llama2"])
    path = tmp_path / "cjk.model"
    path.write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_file=str(path))
    multi = sum(1 for i in range(sp.get_piece_size())
                if sum(ord(c) >= 0x3000 for c in sp.id_to_piece(i)) >= 2)
    assert multi > 1000, multi  # pieces spanning two or more CJK characters
    texts = test + random_texts(seed=5, count=200)
    ref = [sp.encode_as_ids(t) for t in texts]
    assert any(sp.is_byte(i) for ids in ref for i in ids)  # some characters fall back to bytes
    ours = encode_many(args_for(path), texts)
    assert first_difference(ours, ref, texts, lambda ids: [sp.id_to_piece(i) for i in ids]) is None


@pytest.mark.parametrize("type_", ["Llama2Tokenizer", "GPTSentencePieceTokenizer"])
def test_the_three_megatron_types_share_the_encoding(models, corpora, type_):
    _, test = corpora
    sp = spm.SentencePieceProcessor(model_file=str(models["llama2"]))
    assert encode_many(args_for(models["llama2"], type_), test[:50]) == \
        [sp.encode_as_ids(t) for t in test[:50]]


@pytest.mark.parametrize("name", CONFIGS)
def test_decode_matches(models, corpora, name):
    _, test = corpora
    sp = spm.SentencePieceProcessor(model_file=str(models[name]))
    texts = test[:80] + random_texts(seed=2, count=300) + EXTRA
    ids = [sp.encode_as_ids(t) for t in texts]
    ids += [[5, 3, 4], list(range(300, 320)), [sp.piece_to_id("<0xE3>"), 400]]  # byte pieces apart
    ours = decode_many(args_for(models[name]), ids)
    ref = [sp.decode_ids(i) for i in ids]
    bad = [i for i in range(len(ids)) if ours[i] != ref[i]]
    assert not bad, f"{len(bad)} differ; first {ids[bad[0]][:10]}: {ours[bad[0]][:60]!r} vs " \
                    f"{ref[bad[0]][:60]!r}"


def test_one_long_text(models, corpora):
    # SentencePiece cannot be cut at spaces (white space is normalized): read whole, same ids.
    _, test = corpora
    text = "\n".join(test[:30])
    sp = spm.SentencePieceProcessor(model_file=str(models["llama2"]))
    out = run_tool("tokenize", ["encode", *args_for(models["llama2"]), "--threads", "2",
                                "--block-bytes", "1000"], text.encode()).stdout
    assert [int(x) for x in out.split()] == sp.encode_as_ids(text)


def test_preprocess_data_matches_megatron_with_sentencepiece(models, corpora, tmp_path):
    # Megatron's SentencePiece tokenizers: tokenize = encode_as_ids, EOD = eos_id, vocabulary =
    # piece count.
    _, test = corpora
    lines = [json.dumps({"text": t}) for t in test[:120]] + [json.dumps({"text": ["a", "", "b"]})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    run_tool("preprocess_data", ["--input", str(tmp_path / "in.jsonl"), "--output-prefix",
                                 str(tmp_path / "ours"), *args_for(models["llama2"],
                                                                   "Llama2Tokenizer"),
                                 "--append-eod", "--workers", "2"])
    sp = spm.SentencePieceProcessor(model_file=str(models["llama2"]))
    builder = NumpyIndexedDatasetBuilder(str(tmp_path / "peer_text_document"), np.uint16)
    for line in lines:
        text = json.loads(line)["text"]
        doc, lens = [], []
        for s in text if isinstance(text, list) else [text]:
            ids = sp.encode_as_ids(s)
            if ids:
                doc += ids
                lens.append(len(ids))
        if doc:
            doc.append(sp.eos_id())
            lens[-1] += 1
        builder.add_document(doc, lens)
    builder.finalize()
    for ext in ("bin", "idx"):
        assert (tmp_path / f"ours_text_document.{ext}").read_bytes() == \
            (tmp_path / f"peer_text_document.{ext}").read_bytes(), ext


def test_train_takes_the_piece_count(models):
    sp = spm.SentencePieceProcessor(model_file=str(models["nmt_nfkc"]))
    out = run_tool("train", [*args_for(models["nmt_nfkc"], "Llama2Tokenizer"), "--mock-data",
                             "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads",
                             "2", "--seq-length", "8", "--micro-batch-size", "1",
                             "--global-batch-size", "1", "--train-iters", "1", "--lr",
                             "1e-3"]).stdout.decode()
    assert int(re.search(r"padded vocab (\d+)", out).group(1)) == \
        math.ceil(sp.get_piece_size() / 128) * 128


def test_unigram_and_broken_models_are_refused(corpora, models, tmp_path):
    train, _ = corpora
    buf = io.BytesIO()
    lines = [line for doc in train[:100] for line in doc.split("\n") if line.strip()]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf,
                                   model_type="unigram", vocab_size=300, minloglevel=2,
                                   hard_vocab_limit=False)
    (tmp_path / "uni.model").write_bytes(buf.getvalue())
    p = run_tool("tokenize", ["encode", *args_for(tmp_path / "uni.model")], b"x", check=False)
    assert p.returncode == 2 and b"unigram" in p.stderr and b"not implemented" in p.stderr
    data = models["llama2"].read_bytes()
    (tmp_path / "cut.model").write_bytes(data[: len(data) // 2])
    p = run_tool("tokenize", ["encode", *args_for(tmp_path / "cut.model")], b"x", check=False)
    assert p.returncode == 2 and b"cut.model" in p.stderr and b"SentencePiece" in p.stderr


def _varint(data, i):
    v = shift = 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def _encode_varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def mark_unused(model_bytes, ids):
    """Rewrites ModelProto so that the pieces `ids` have type UNUSED (5): a plain protobuf edit
    (field 1 = pieces; inside, field 3 = type), as no trainer option makes such pieces."""
    out, i, index = bytearray(), 0, 0
    while i < len(model_bytes):
        key, j = _varint(model_bytes, i)
        if key & 7 != 2:
            raise AssertionError("unexpected wire type at top level")
        n, k = _varint(model_bytes, j)
        body = model_bytes[k:k + n]
        if key >> 3 == 1:
            if index in ids:
                piece, p = bytearray(), 0
                while p < len(body):  # drop any type field, then append type = UNUSED
                    f, q = _varint(body, p)
                    if f & 7 == 0:
                        _, r = _varint(body, q)
                    elif f & 7 == 5:
                        r = q + 4
                    else:
                        m, q = _varint(body, q)
                        r = q + m
                    if f >> 3 != 3:
                        piece += body[p:r]
                    p = r
                body = bytes(piece) + bytes([3 << 3 | 0, 5])
            index += 1
        out += _encode_varint(key) + _encode_varint(len(body)) + body
        i = k + n
    return bytes(out)


def test_unused_pieces_are_split_back_as_sentencepiece_does(models, corpora, tmp_path):
    # UNUSED pieces take part in merging but are split back into their parts; a model with them
    # is merged as one text (no cutting) so the split-back sees the whole merge history.
    _, test = corpora
    sp = spm.SentencePieceProcessor(model_file=str(models["nmt_nfkc"]))
    multi = [i for i in range(sp.get_piece_size())
             if not sp.is_control(i) and not sp.is_unknown(i) and not sp.is_byte(i)
             and len(sp.id_to_piece(i)) > 2][:40]
    path = tmp_path / "unused.model"
    path.write_bytes(mark_unused(models["nmt_nfkc"].read_bytes(), set(multi)))
    ref_sp = spm.SentencePieceProcessor(model_file=str(path))
    assert all(ref_sp.is_unused(i) for i in multi)
    texts = test[:60] + random_texts(seed=9, count=300) + EXTRA
    ref = [ref_sp.encode_as_ids(t) for t in texts]
    assert not any(i in multi for ids in ref for i in ids)
    ours = encode_many(args_for(path), texts)
    assert first_difference(ours, ref, texts) is None
