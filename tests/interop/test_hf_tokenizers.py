"""HuggingFaceTokenizer against the `tokenizers` library: tokenizers shaped like Llama 3, Qwen2,
GPT-NeoX, SmolLM, GPT-2 with a prefix space, Llama 2 (SentencePiece-converted), Mistral's
Metaspace, o200k-style splitting and a mix of rarer components are trained here on Debian's
documentation (hf_fixtures.py), then every id is compared on other real text in several
languages, on code and on random Unicode; plus decoding, special tokens, streaming, the files
preprocess_data writes (Megatron's pipeline with the HF tokenizer) and what `train` reads."""
import json
import math
import re

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, models

import hf_fixtures
from megatron_data_ref import NumpyIndexedDatasetBuilder
from tokenizer_testlib import (decode_many, encode_many, first_difference, make_corpora,
                               random_texts, run_tool, split_corpora)

FLAVORS = hf_fixtures.FLAVORS
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|endoftext|>",
            "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", "[BRK]", "<mask>", "debian",
            "Ｋernel", "<0x41>"]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    docs = make_corpora(tmp_path_factory.mktemp("corpora"), megabytes=1.2)
    return split_corpora(docs)


@pytest.fixture(scope="module")
def trained(corpora, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    train, _ = corpora
    return {f: hf_fixtures.build(f, train, out, vocab_size=2500) for f in FLAVORS}


def args_for(folder):
    return ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(folder)]


def reference(folder):
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def describe(tok):
    return lambda ids: [tok.id_to_token(i) for i in ids]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_ids_match_on_real_text(trained, corpora, flavor):
    _, test = corpora
    tok = reference(trained[flavor])
    ours = encode_many(args_for(trained[flavor]), test)
    ref = [e.ids for e in tok.encode_batch(test)]
    assert first_difference(ours, ref, test, describe(tok)) is None


@pytest.mark.parametrize("flavor", FLAVORS)
def test_ids_match_on_random_unicode(trained, flavor):
    texts = random_texts(seed=FLAVORS.index(flavor), count=1500, specials=SPECIALS)
    texts += ["", " ", "\n", "  leading", "trailing  ", "a\u0301\u0323 ǆ ﬁ ①", "<|eot_id|>",
              " <mask> debian debianx", "ＫERNEL Ｋernel"]
    tok = reference(trained[flavor])
    ours = encode_many(args_for(trained[flavor]), texts)
    ref = [e.ids for e in tok.encode_batch(texts)]
    assert first_difference(ours, ref, texts, describe(tok)) is None


@pytest.mark.parametrize("flavor", ["llama3", "qwen2", "llama2", "mixed"])
def test_special_tokens_as_text_and_without_the_post_processor(trained, flavor):
    texts = random_texts(seed=7, count=400, specials=SPECIALS) + ["<|begin_of_text|>x<|eot_id|>"]
    tok = reference(trained[flavor])
    ours = encode_many(args_for(trained[flavor]), texts, "--no-allow-special",
                       "--tokenizer-hf-no-include-special-tokens")
    tok.encode_special_tokens = True
    ref = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    assert first_difference(ours, ref, texts, describe(tok)) is None


@pytest.mark.parametrize("flavor", FLAVORS)
def test_one_long_text_streamed_in_blocks_and_threads(trained, corpora, flavor):
    _, test = corpora
    text = "\n\n".join(test[:40])
    tok = reference(trained[flavor])
    out = run_tool("tokenize", ["encode", *args_for(trained[flavor]), "--threads", "3",
                                "--block-bytes", "4096"], text.encode()).stdout
    assert [int(x) for x in out.split()] == tok.encode(text).ids
    count = run_tool("tokenize", ["count", *args_for(trained[flavor])], text.encode()).stdout
    assert int(count) == len(tok.encode(text).ids)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_decode_matches(trained, corpora, flavor):
    _, test = corpora
    texts = test[:60] + random_texts(seed=11, count=200)
    tok = reference(trained[flavor])
    ids = [e.ids for e in tok.encode_batch(texts)]
    ours = decode_many(args_for(trained[flavor]), ids)
    ref = [tok.decode(i, skip_special_tokens=False) for i in ids]
    bad = [i for i in range(len(ids)) if ours[i] != ref[i]]
    assert not bad, f"{len(bad)} differ; first: {ours[bad[0]][:80]!r} vs {ref[bad[0]][:80]!r}"


@pytest.mark.parametrize("flavor", ["llama3", "smollm", "o200k_like"])
def test_byte_level_round_trip_and_invalid_utf8(trained, flavor):
    # Valid text: HF's byte-level decoding gives the text back; so does ours.
    texts = random_texts(seed=3, count=200)
    ids = encode_many(args_for(trained[flavor]), texts, "--tokenizer-hf-no-include-special-tokens",
                      "--no-allow-special")
    assert decode_many(args_for(trained[flavor]), ids) == texts
    # Bytes that are not UTF-8 (HF never sees them) come back byte for byte.
    rng = np.random.default_rng(5)
    for _ in range(20):
        raw = bytes(rng.integers(0, 256, size=int(rng.integers(1, 200)), dtype=np.uint8))
        out = run_tool("tokenize", ["encode", *args_for(trained[flavor]),
                                    "--tokenizer-hf-no-include-special-tokens"], raw).stdout
        back = run_tool("tokenize", ["decode", *args_for(trained[flavor])], out).stdout
        assert back == raw


def megatron_peer(lines, prefix, tok, eod, dtype):
    """Megatron's preprocess_data with its HuggingFaceTokenizer: tokenize(sentence) is
    tokenizer(sentence).input_ids (post-processor included), EOD = eos_token's id."""
    builder = NumpyIndexedDatasetBuilder(f"{prefix}_text_document", dtype)
    for line in lines:
        text = json.loads(line)["text"]
        sentences = text if isinstance(text, list) else [text]
        doc, lens = [], []
        for s in sentences:
            ids = tok.encode(s).ids
            if ids:
                doc += ids
                lens.append(len(ids))
        if doc:
            doc.append(eod)
            lens[-1] += 1
        builder.add_document(doc, lens)
    builder.finalize()


@pytest.mark.parametrize("flavor", ["llama3", "qwen2", "llama2", "gpt2_prefix"])
def test_preprocess_data_matches_megatron_with_hf(trained, corpora, tmp_path, flavor):
    _, test = corpora
    lines = [json.dumps({"text": t}) for t in test[:150]]
    lines += [json.dumps({"text": ["First.", "", "Second <|endoftext|> <s>"]}),
              json.dumps({"text": ""})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    folder = trained[flavor]
    run_tool("preprocess_data", ["--input", str(tmp_path / "in.jsonl"), "--output-prefix",
                                 str(tmp_path / "ours"), *args_for(folder), "--append-eod",
                                 "--workers", "2"])
    tok = reference(folder)
    eos = json.loads((folder / "tokenizer_config.json").read_text())["eos_token"]
    eos = eos["content"] if isinstance(eos, dict) else eos
    peer = tmp_path / "peer"
    megatron_peer(lines, str(peer), tok, tok.token_to_id(eos), np.uint16)
    for ext in ("bin", "idx"):
        assert (tmp_path / f"ours_text_document.{ext}").read_bytes() == \
            (tmp_path / f"peer_text_document.{ext}").read_bytes(), ext


def test_large_vocabulary_is_written_as_int32(trained, tmp_path):
    # Megatron's rule: uint16 below 65500 ids, int32 from there. 64000 added tokens push the
    # Llama-3-shaped tokenizer past it; text holding some of them gives ids above 65535.
    data = json.loads((trained["llama3"] / "tokenizer.json").read_text())
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_tokens([AddedToken(f"<extra_{i}>", normalized=False) for i in range(64000)])
    big = tmp_path / "big"
    big.mkdir()
    tok.save(str(big / "tokenizer.json"))
    (big / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end_of_text|>"}))
    assert tok.get_vocab_size(with_added_tokens=True) >= 65500
    lines = [json.dumps({"text": f"word <extra_{i * 997 % 64000}> more <extra_63999>"})
             for i in range(200)]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    run_tool("preprocess_data", ["--input", str(tmp_path / "in.jsonl"), "--output-prefix",
                                 str(tmp_path / "ours"), *args_for(big), "--append-eod"])
    megatron_peer(lines, str(tmp_path / "peer"), tok, tok.token_to_id("<|end_of_text|>"),
                  np.int32)
    for ext in ("bin", "idx"):
        assert (tmp_path / f"ours_text_document.{ext}").read_bytes() == \
            (tmp_path / f"peer_text_document.{ext}").read_bytes(), ext
    assert (tmp_path / "ours_text_document.idx").read_bytes()[17] == 4  # Megatron's int32 code


@pytest.mark.parametrize("flavor", ["llama3", "mixed"])
def test_train_takes_the_vocabulary_size_from_the_tokenizer(trained, flavor):
    tok = reference(trained[flavor])
    vocab = tok.get_vocab_size(with_added_tokens=True)
    out = run_tool("train", [*args_for(trained[flavor]), "--mock-data", "--num-layers", "1",
                             "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length",
                             "8", "--micro-batch-size", "1", "--global-batch-size", "1",
                             "--train-iters", "1", "--lr", "1e-3"]).stdout.decode()
    padded = int(re.search(r"padded vocab (\d+)", out).group(1))
    assert padded == math.ceil(vocab / 128) * 128


def edited(folder, tmp_path, edit):
    data = json.loads((folder / "tokenizer.json").read_text())
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    Tokenizer.from_file(str(path))  # a file HF itself loads: a feature, not a broken file
    return path


@pytest.mark.parametrize("edit,named", [
    (lambda d: d.update(normalizer={"type": "Lowercase"}), "Lowercase"),
    (lambda d: d["model"].update(dropout=0.1), "dropout"),
    (lambda d: d.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": r"\w+"},
                                       "behavior": "Isolated", "invert": False}), r"\w"),
    (lambda d: d.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": r"\p{Han}+"},
                                       "behavior": "Isolated", "invert": False}), "Han"),
    (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "Whitespace"),
    (lambda d: d.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        {"type": "Digits", "individual_digits": True}]}), "ByteLevel pre-tokenizer followed"),
    (lambda d: d.update(truncation={"direction": "Right", "max_length": 8, "strategy":
                                    "LongestFirst", "stride": 0}), "truncation"),
    (lambda d: d.update(decoder={"type": "WordPiece", "prefix": "##", "cleanup": True}),
     "WordPiece"),
])
def test_unimplemented_features_are_refused_by_name(trained, tmp_path, edit, named):
    path = edited(trained["llama3"], tmp_path, edit)
    p = run_tool("tokenize", ["encode", *args_for(path)], b"x", check=False)
    assert p.returncode == 2, p.stderr
    assert named in p.stderr.decode() and "not implemented" in p.stderr.decode(), p.stderr


def test_malformed_files_are_clear_errors(trained, tmp_path):
    text = (trained["qwen2"] / "tokenizer.json").read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    p = run_tool("tokenize", ["encode", *args_for(tmp_path / "cut.json")], b"x", check=False)
    assert p.returncode == 2 and b"cut.json" in p.stderr and b"JSON" in p.stderr
    data = json.loads(text)
    data["model"]["merges"].append("nosuchtoken alsonot")
    (tmp_path / "merge.json").write_text(json.dumps(data))
    p = run_tool("tokenize", ["encode", *args_for(tmp_path / "merge.json")], b"x", check=False)
    assert p.returncode == 2 and b"nosuchtoken" in p.stderr
    p = run_tool("tokenize", ["encode", *args_for(tmp_path / "missing.json")], b"x", check=False)
    assert p.returncode == 2 and b"missing.json" in p.stderr
    # A post-processor naming an id outside the vocabulary (HF would emit it anyway).
    data = json.loads((trained["llama3"] / "tokenizer.json").read_text())
    template = data["post_processor"]["processors"][1]
    template["special_tokens"]["<|begin_of_text|>"]["ids"] = [999999]
    (tmp_path / "post.json").write_text(json.dumps(data))
    p = run_tool("tokenize", ["encode", *args_for(tmp_path / "post.json")], b"x", check=False)
    assert p.returncode == 2 and b"post_processor: id 999999" in p.stderr


@pytest.mark.parametrize("ignore_merges", [False, True])
def test_merges_rank_pairs_not_concatenations(tmp_path, ignore_merges):
    # "abc" is a token but no merge makes it from "ab" + "c": HF's BPE gives [ab, c] (tiktoken's
    # rule, ranking concatenated bytes, would give [abc]); with ignore_merges the whole piece is
    # looked up first.
    data = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "post_processor": None, "decoder": None,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"\S+"},
                              "behavior": "Isolated", "invert": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
                      "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, " ": 6},
                      "merges": ["a b", "b c", "a bc"]}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    texts = ["abc", "abc bc abcabc", "cab", "x abc"]
    tok = Tokenizer.from_file(str(path))
    ours = encode_many(args_for(path), texts)
    assert ours == [e.ids for e in tok.encode_batch(texts)]
    assert ours[0] == ([5] if ignore_merges else [3, 2])


def test_added_tokens_are_found_in_two_passes(tmp_path):
    # HF extracts non-normalized added tokens from the raw text first, then normalized ones from
    # what is left, even without a normalizer: in "xab", "ab" wins over the earlier "xa".
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate("abcx<>")}, merges=[]))
    tok.add_tokens([AddedToken("xa", normalized=True), AddedToken("ab", normalized=False),
                    AddedToken("<ab>", normalized=True, special=True)])
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = ["xab", "xxab", "abxa", "xaab", "<ab>x", "x<ab>", "<xab>"]
    for extra in ([], ["--no-allow-special"]):
        if extra:
            tok.encode_special_tokens = True
        ours = encode_many(args_for(tmp_path / "tokenizer.json"), texts, *extra)
        assert ours == [e.ids for e in tok.encode_batch(texts)]
