"""Shared helpers for tests that compare with tiktoken: where the binaries and the GPT-2
vocabulary are, the reference encoding built offline from local files, and a way to run tools."""
import os
import pathlib
import subprocess

import tiktoken
import tiktoken_ext.openai_public as openai_public
from tiktoken.load import data_gym_to_mergeable_bpe_ranks, load_tiktoken_bpe

ROOT = pathlib.Path(os.environ.get("LEANTRON_ROOT", pathlib.Path(__file__).resolve().parents[2]))
BIN = pathlib.Path(os.environ.get("LEANTRON_BIN", ROOT / "build" / "bin"))


def vocab_dir() -> pathlib.Path:
    """$LEANTRON_VOCAB_DIR (scripts/get_gpt2_vocab.sh), else .cache/gpt2, else ../shared/gpt2."""
    candidates = [os.environ.get("LEANTRON_VOCAB_DIR"), ROOT / ".cache/gpt2", ROOT / "../shared/gpt2"]
    for c in candidates:
        if c and (pathlib.Path(c) / "encoder.json").exists():
            return pathlib.Path(c)
    raise RuntimeError("GPT-2 vocabulary not found: run scripts/get_gpt2_vocab.sh")


def vocab_args():
    d = vocab_dir()
    return ["--vocab-file", str(d / "encoder.json"), "--merge-file", str(d / "vocab.bpe")]


_REF = None


def reference() -> tiktoken.Encoding:
    """tiktoken's gpt2 encoding, exactly as tiktoken_ext defines it, from local files."""
    global _REF
    if _REF is None:
        d = vocab_dir()
        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(d / "vocab.bpe"), encoder_json_file=str(d / "encoder.json"))
        if (d / "gpt2.tiktoken").exists():
            assert load_tiktoken_bpe(str(d / "gpt2.tiktoken")) == ranks
        _REF = tiktoken.Encoding(
            name="gpt2", pat_str=openai_public.r50k_pat_str, mergeable_ranks=ranks,
            special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
    return _REF


def run_tool(name, args, stdin=b"", check=True, timeout=600):
    proc = subprocess.run([str(BIN / name), *args], input=stdin, capture_output=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} {' '.join(args)} failed ({proc.returncode}): "
                             f"{proc.stderr.decode(errors='replace')}")
    return proc


def tokenize(mode, stdin, *extra, check=True):
    return run_tool("tokenize", [mode, *vocab_args(), *extra], stdin, check=check)


def parse_ids(line: bytes):
    return [int(x) for x in line.split()]
