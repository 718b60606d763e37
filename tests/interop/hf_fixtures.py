"""Small tokenizers trained here with HuggingFace `tokenizers` on real text (Debian's
documentation, scripts/make_corpora.py), each shaped like a real model family's tokenizer.json:
the tests compare Leantron's ids with the library's on other text. Nothing is downloaded."""
import json
import pathlib

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])

FLAVORS = ["llama3", "qwen2", "neox", "smollm", "gpt2_prefix", "llama2", "metaspace", "mixed",
           "o200k_like"]


def _byte_level_trainer(vocab_size, specials):
    return trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def _train(tok, trainer, texts):
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def build(flavor, texts, out_dir: pathlib.Path, vocab_size=3000):
    """Trains `flavor` on `texts`; writes out_dir/<flavor>/tokenizer.json (and
    tokenizer_config.json where the family has one) and returns that folder."""
    d = out_dir / flavor
    d.mkdir(parents=True, exist_ok=True)
    config = None
    if flavor in ("llama3", "qwen2", "o200k_like"):
        pattern = {"llama3": LLAMA3_PATTERN, "qwen2": QWEN2_PATTERN,
                   "o200k_like": O200K_PATTERN}[flavor]
        tok = Tokenizer(models.BPE(ignore_merges=flavor == "llama3"))
        if flavor == "qwen2":
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        specials = (["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"] if flavor != "qwen2"
                    else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        _train(tok, _byte_level_trainer(vocab_size, specials), texts)
        if flavor == "llama3":
            bos = tok.token_to_id("<|begin_of_text|>")
            tok.post_processor = processors.Sequence([
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                              special_tokens=[("<|begin_of_text|>", bos)])])
            config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
        elif flavor == "qwen2":
            tok.post_processor = processors.ByteLevel(trim_offsets=False)
            config = {"eos_token": {"content": "<|endoftext|>", "special": True}}
    elif flavor in ("neox", "smollm", "gpt2_prefix"):
        tok = Tokenizer(models.BPE())
        if flavor == "neox":
            tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        elif flavor == "smollm":
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        specials = ["<|endoftext|>", "<|padding|>"] if flavor != "gpt2_prefix" else ["<s>", "</s>"]
        _train(tok, _byte_level_trainer(vocab_size, specials), texts)
        if flavor == "gpt2_prefix":
            tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                              ("<s>", tok.token_to_id("<s>")))
        config = {"eos_token": "<|endoftext|>" if flavor != "gpt2_prefix" else "</s>"}
    elif flavor in ("llama2", "metaspace"):
        # SentencePiece-converted shape: characters, <0xXX> byte fallback, unk fused, BOS.
        byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                      limit_alphabet=300)
        _train(tok, trainer, texts)
        data = json.loads(tok.to_str())
        # The byte tokens live in the model's vocab only, as in converted Llama 2 files.
        data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in
                                ("<unk>", "<s>", "</s>")]
        if flavor == "llama2":
            data["normalizer"] = {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
            data["pre_tokenizer"] = None
            data["decoder"] = {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
        else:
            data["decoder"] = {"type": "Sequence", "decoders": [
                {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                 "split": True}, {"type": "ByteFallback"}, {"type": "Fuse"}]}
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
        tok = Tokenizer.from_str(json.dumps(data))
        config = {"bos_token": "<s>", "eos_token": "</s>"}
    elif flavor == "mixed":
        # Less common components: NFKC and Strip normalizers, Split behaviors and inversion,
        # added tokens with lstrip/rstrip/single_word/normalized, no decoder.
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Strip(),
                                               normalizers.Replace(Regex(r"\d+"), "0")])
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
            pre_tokenizers.Split(Regex(r"[\p{P}\p{S}]"), behavior="merged_with_previous"),
            pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="contiguous", invert=True),
            pre_tokenizers.Split(Regex(r"[aeiou]"), behavior="merged_with_next")])
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      special_tokens=["[UNK]", "[CLS]", "[SEP]"])
        _train(tok, trainer, texts)
        tok.add_tokens([AddedToken("debian", single_word=True, normalized=True),
                        AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False),
                        AddedToken("Ｋernel", normalized=True)])
        tok.add_special_tokens([AddedToken("[BRK]", single_word=False, normalized=False)])
        tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                       ("[CLS]", tok.token_to_id("[CLS]")))
    else:
        raise ValueError(flavor)
    tok.save(str(d / "tokenizer.json"))
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d
