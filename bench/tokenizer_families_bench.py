#!/usr/bin/env python3
"""Single-thread throughput of HuggingFaceTokenizer, SentencePiece and TikTokenizer beside their
reference libraries, on the same documents with the same tokenizer files, in the same run.

Tokenizers (built once into --cache, never committed):
  gpt2_hf       GPT-2's tokenizer.json, made from GPT-2's own vocab.bpe/encoder.json
                (scripts/get_gpt2_vocab.sh): what GPT2TokenizerFast loads
  llama3_32k    a byte-level BPE with Llama 3's pre-tokenizer, ignore_merges and BOS, 32000
                tokens trained here on the corpora (tests/interop/hf_fixtures.py)
  sp_llama2_32k a SentencePiece BPE with Llama 2's options (identity normalization, byte
                fallback, split digits, white-space-only pieces), 32000 pieces trained here
  gpt2_tiktoken GPT-2's gpt2.tiktoken read by TikTokenizer with the gpt2 pattern
References: HF tokenizers encode_batch(docs) with RAYON_NUM_THREADS=1; sentencepiece
encode(docs, num_threads=1); tiktoken encode_ordinary per document. Leantron:
bench_tokenizer_families (a fresh encoder per repetition: caches start cold). Token counts must
agree. Corpora: scripts/make_corpora.py (english, multilingual, cjk, code). MB = 10^6 bytes of
UTF-8 text; best of --repeat.

  python3 bench/tokenizer_families_bench.py [--megabytes 8] [--repeat 3]
      [--tokenizers sp_llama2_32k,...] [--only-corpora cjk,...]
"""
import argparse
import io
import json
import os
import pathlib
import subprocess
import sys
import time

if "--build-only" not in sys.argv:
    os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: one thread

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests" / "interop"))
from tiktoken_ref import BIN, vocab_dir  # noqa: E402

CORPORA = ["english", "multilingual", "cjk", "code"]


def best(repeat, fn):
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def build_tokenizers(cache, corpora):
    import hf_fixtures
    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    cache.mkdir(parents=True, exist_ok=True)
    v = vocab_dir()
    if not (cache / "gpt2_hf" / "tokenizer.json").exists():
        (cache / "gpt2_hf").mkdir(exist_ok=True)
        tok = Tokenizer(models.BPE.from_file(str(v / "encoder.json"), str(v / "vocab.bpe")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.save(str(cache / "gpt2_hf" / "tokenizer.json"))
    texts = [d for name in ["english", "multilingual", "code"] for d in corpora[name]]
    if not (cache / "llama3_32k" / "tokenizer.json").exists():
        print("training llama3_32k ...", file=sys.stderr)
        folder = hf_fixtures.build("llama3", texts, cache / "tmp", vocab_size=32000)
        folder.rename(cache / "llama3_32k")
    if not (cache / "sp_llama2_32k.model").exists():
        print("training sp_llama2_32k ...", file=sys.stderr)
        lines = [line for d in texts for line in d.split("\n") if line.strip()]
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=buf, model_type="bpe", vocab_size=32000,
            byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
            remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
            minloglevel=2, input_sentence_size=2_000_000, shuffle_input_sentence=False,
            num_threads=os.cpu_count())
        (cache / "sp_llama2_32k.model").write_bytes(buf.getvalue())


def ours(args, path, repeat):
    out = subprocess.run([str(BIN / "bench_tokenizer_families"), *args, "--repeat", str(repeat),
                          str(path)], check=True, capture_output=True, text=True).stdout
    header, row = out.splitlines()[0].split("\t"), out.splitlines()[1].split("\t")
    r = dict(zip(header, row))
    return float(r["encode_MBps"]), int(r["tokens"])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megabytes", type=float, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--corpora", default=str(ROOT / ".cache" / "corpora-tf"))
    ap.add_argument("--cache", default=str(ROOT / ".cache" / "bench-tokenizers"))
    ap.add_argument("--skip-build", action="store_true", help="reuse --corpora as they are")
    ap.add_argument("--tokenizers", default="",
                    help="comma-separated rows to run (gpt2_hf, llama3_32k, sp_llama2_32k, "
                    "gpt2_tiktoken, gpt2); all when empty")
    ap.add_argument("--only-corpora", default="",
                    help=f"comma-separated corpora to time ({', '.join(CORPORA)}); all when empty")
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    corpora_dir = pathlib.Path(args.corpora)
    if not args.skip_build:
        subprocess.run([sys.executable, str(ROOT / "scripts/make_corpora.py"), "--out",
                        str(corpora_dir), "--megabytes", str(args.megabytes), *CORPORA],
                       check=True)
    corpora = {n: [json.loads(line)["text"] for line in open(corpora_dir / f"{n}.jsonl",
                                                             encoding="utf-8")] for n in CORPORA}
    cache = pathlib.Path(args.cache)
    if args.build_only:
        build_tokenizers(cache, corpora)
        return
    # Training uses every core; it runs in a child process, because HF tokenizers sizes its
    # thread pool once per process and the timed encode_batch must run on one thread.
    subprocess.run([sys.executable, __file__, "--skip-build", "--build-only", "--corpora",
                    str(corpora_dir), "--cache", str(cache)], check=True,
                   env={**os.environ, "RAYON_NUM_THREADS": str(os.cpu_count())})

    import sentencepiece as spm
    import tiktoken
    import tokenizers
    from tokenizers import Tokenizer
    from tiktoken_ref import reference
    print(f"tokenizers {tokenizers.__version__}, sentencepiece {spm.__version__}, tiktoken "
          f"{tiktoken.__version__}, {os.cpu_count()} CPUs", file=sys.stderr)
    hf = {n: Tokenizer.from_file(str(cache / n / "tokenizer.json"))
          for n in ["gpt2_hf", "llama3_32k"]}
    sp = spm.SentencePieceProcessor(model_file=str(cache / "sp_llama2_32k.model"))
    enc = reference()
    setups = [
        ("gpt2_hf", "HF tokenizers",
         ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
          str(cache / "gpt2_hf")],
         lambda docs: sum(len(e.ids) for e in hf["gpt2_hf"].encode_batch(
             docs, add_special_tokens=False))),
        ("llama3_32k", "HF tokenizers",
         ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
          str(cache / "llama3_32k")],
         lambda docs: sum(len(e.ids) for e in hf["llama3_32k"].encode_batch(
             docs, add_special_tokens=False))),
        ("sp_llama2_32k", "sentencepiece",
         ["--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model",
          str(cache / "sp_llama2_32k.model")],
         lambda docs: sum(len(x) for x in sp.encode(docs, num_threads=1))),
        ("gpt2_tiktoken", "tiktoken",
         ["--tokenizer-type", "TikTokenizer", "--tokenizer-model",
          str(vocab_dir() / "gpt2.tiktoken"), "--tiktoken-pattern", "gpt2"],
         lambda docs: sum(len(enc.encode_ordinary(d)) for d in docs)),
        ("gpt2 (GPT2BPETokenizer)", "tiktoken",
         ["--tiktoken-file", str(vocab_dir() / "gpt2.tiktoken")],
         lambda docs: sum(len(enc.encode_ordinary(d)) for d in docs)),
    ]
    only = set(filter(None, args.tokenizers.split(",")))
    wanted = set(filter(None, args.only_corpora.split(",")))
    unknown = (only - {name.split(" ")[0] for name, *_ in setups}) | (wanted - set(CORPORA))
    if unknown:
        sys.exit(f"unknown tokenizer or corpus names: {', '.join(sorted(unknown))} (tokenizers: "
                 f"{', '.join(n.split(' ')[0] for n, *_ in setups)}; corpora: {', '.join(CORPORA)})")
    timed = [c for c in CORPORA if c in wanted or not wanted]
    print("| tokenizer | corpus | MB | reference | reference MB/s | Leantron MB/s | × |")
    print("|---|---|---:|---|---:|---:|---:|")
    for name, ref_name, ours_args, ref_fn in setups:
        if only and name.split(" ")[0] not in only:
            continue
        for corpus in timed:
            docs = corpora[corpus]
            mb = sum(len(d.encode()) for d in docs) / 1e6
            ref_s, ref_tokens = best(args.repeat, lambda: ref_fn(docs))
            our_mbps, our_tokens = ours(ours_args, corpora_dir / f"{corpus}.jsonl", args.repeat)
            assert our_tokens == ref_tokens, (name, corpus, our_tokens, ref_tokens)
            ref_mbps = mb / ref_s
            print(f"| {name} | {corpus} | {mb:.1f} | {ref_name} | {ref_mbps:.1f} | "
                  f"{our_mbps:.1f} | {our_mbps / ref_mbps:.1f}× |", flush=True)
            print("load average %.2f %.2f %.2f" % os.getloadavg(), file=sys.stderr)


if __name__ == "__main__":
    main()
