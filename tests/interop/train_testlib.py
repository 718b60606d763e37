"""Helpers for the trainer's pytest files (test_train_*.py): running `train` (one process or
several through --nproc-per-node), parsing Megatron's log lines, a small real dataset (byte tokens
of the Debian licence texts every Debian system ships), and a float64 numpy GPT-2 forward/loss.
Not a test file."""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_data_ref import NumpyIndexedDatasetBuilder  # noqa: E402

ROOT = Path(os.environ.get("LEANTRON_ROOT", Path(__file__).resolve().parents[2]))
BIN = Path(os.environ.get("LEANTRON_BIN", ROOT / "build" / "bin"))
TRAIN = BIN / "train"

LINE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?learning rate: (\S+) \|.*?lm loss: (\S+) \|"
                  r".*?grad norm: (\S+) \| number of skipped iterations:\s+(\d+) \|")
VALID = re.compile(r"validation loss at iteration (\d+) \| lm loss value: (\S+) \|")

# 255 byte ids + NullTokenizer's EOD = 256 = padded vocabulary for TP 1 and 2 (divisor 128).
TINY = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "32", "--max-position-embeddings", "32",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "255"]
# The GPU tests' small model: head dim 64 (what cuDNN's flash attention is built for), every
# dimension a multiple of 16 (FP8 products).
SMALL = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "2",
         "--seq-length", "64", "--max-position-embeddings", "64",
         "--tokenizer-type", "NullTokenizer", "--vocab-size", "255"]


def checkpoint_files(ck, iteration):
    """{path: bytes} of every safetensors file a checkpoint saved at `iteration`."""
    d = Path(ck) / f"iter_{iteration:07d}"
    return {p.relative_to(d): p.read_bytes() for p in d.rglob("*.safetensors")}


def run_train(args, nproc=None, ok=True, timeout=300, env=None):
    assert TRAIN.exists(), f"{TRAIN} not built"
    cmd = [str(TRAIN), *map(str, args)]
    if nproc:
        cmd += ["--nproc-per-node", str(nproc)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if ok:
        assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return proc


def parse_log(stdout):
    """{iteration: (lr, loss, grad_norm, skipped)} and {iteration: validation loss}."""
    train = {int(m[1]): (float(m[2]), float(m[3]), float(m[4]), int(m[5]))
             for m in LINE.finditer(stdout)}
    valid = {int(m[1]): float(m[2]) for m in VALID.finditer(stdout)}
    return train, valid


# Settings of the TP 2 x PP 2 model that the HF-export tests train, and where its validation
# samples are (the mock dataset numbers validation samples from 1000003).
EXPORT_SEED, EXPORT_SEQ, EXPORT_VOCAB, EXPORT_GBS = 1234, 32, 256, 4
EXPORT_FIRST_VALID_SAMPLE = 1000003


def train_tp2pp2_and_export_hf(tmp_path):
    """Trains the tiny GPT-2 for 6 iterations with TP 2 x PP 2 (4 processes), exports the
    checkpoint with convert_hf --to-hf to tmp_path/"hf", and returns the validation loss at 6."""
    proc = run_train(TINY + ["--mock-data", "--openai-gelu", "--micro-batch-size", "1",
                             "--global-batch-size", EXPORT_GBS, "--train-iters", "6", "--lr",
                             "3e-3", "--log-interval", "1", "--eval-interval", "6",
                             "--eval-iters", "1", "--tensor-model-parallel-size", "2",
                             "--pipeline-model-parallel-size", "2", "--save", tmp_path / "ck",
                             "--seed", EXPORT_SEED], nproc=4)
    _, valid = parse_log(proc.stdout)
    subprocess.run([str(BIN / "convert_hf"), "--to-hf", "--load", str(tmp_path / "ck"),
                    "--save", str(tmp_path / "hf")], check=True, capture_output=True)
    return valid[6]


def export_validation_samples():
    return [mock_sample(EXPORT_FIRST_VALID_SAMPLE + i, EXPORT_SEED, EXPORT_VOCAB, EXPORT_SEQ)
            for i in range(EXPORT_GBS)]


def licence_dataset(prefix, eod=None):
    """Byte tokens (clipped to 0..254) of the licence texts, one document per paragraph. With
    `eod` (NullTokenizer's, 255 for --vocab-size 255): short documents instead, each paragraph cut
    into pieces of 3 to 20 bytes, each ending with the EOD token (as preprocess_data --append-eod
    writes them), so that a 32-token sample packs several documents."""
    builder = NumpyIndexedDatasetBuilder(str(prefix), np.uint16)
    texts = sorted(Path("/usr/share/common-licenses").glob("*"))
    assert texts, "no /usr/share/common-licenses texts"
    rng = np.random.default_rng(7)
    for path in texts:
        if not path.is_file():
            continue
        for para in path.read_bytes().split(b"\n\n"):
            tokens = np.minimum(np.frombuffer(para, np.uint8), 254).astype(np.uint16)
            if tokens.size < 4:
                continue
            pieces = [tokens]
            if eod is not None:
                cuts = np.cumsum(rng.integers(3, 21, size=tokens.size))
                pieces = [np.append(tokens[a:b], np.uint16(eod))
                          for a, b in zip(np.r_[0, cuts], cuts) if a < tokens.size]
            for piece in pieces:
                builder.add_item(piece)
                builder.end_document()
    builder.finalize()
    return str(prefix)


# ---------------------------------------------------------------- mock samples, as train makes them
MASK = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def mock_sample(i, seed, vocab, seq):
    h = splitmix64(seed ^ splitmix64(i))
    start, stride = h % vocab, 1 + (h >> 32) % 3
    return np.array([(start + stride * t) % vocab for t in range(seq + 1)], np.int64)


# ---------------------------------------------------------------- float64 GPT-2 (Megatron names)
def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x, tanh):
    if tanh:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2)))


def gpt_loss(t, layers, heads, tokens, labels, tanh_gelu):
    """Mean cross-entropy over the (padded) vocabulary, Megatron-Core GPT without dropout."""
    g = {k: v.astype(np.float64) for k, v in t.items()}
    s = len(tokens)
    x = g["embedding.word_embeddings.weight"][tokens] + g["embedding.position_embeddings.weight"][:s]
    h = x.shape[1]
    hn = h // heads
    mask = np.tril(np.ones((s, s), bool))
    for i in range(layers):
        p = f"decoder.layers.{i}."
        y = layer_norm(x, g[p + "input_layernorm.weight"], g[p + "input_layernorm.bias"])
        qkv = y @ g[p + "self_attention.linear_qkv.weight"].T + g[p + "self_attention.linear_qkv.bias"]
        qkv = qkv.reshape(s, heads, 3, hn)  # per head q, k, v (Megatron's layout, ng = np)
        q, k, v = (qkv[:, :, j].transpose(1, 0, 2) for j in range(3))
        sc = np.where(mask, q @ k.transpose(0, 2, 1) / math.sqrt(hn), -np.inf)
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        ctx = (sc @ v).transpose(1, 0, 2).reshape(s, h)
        x = x + ctx @ g[p + "self_attention.linear_proj.weight"].T + g[p + "self_attention.linear_proj.bias"]
        y = layer_norm(x, g[p + "pre_mlp_layernorm.weight"], g[p + "pre_mlp_layernorm.bias"])
        y = gelu(y @ g[p + "mlp.linear_fc1.weight"].T + g[p + "mlp.linear_fc1.bias"], tanh_gelu)
        x = x + y @ g[p + "mlp.linear_fc2.weight"].T + g[p + "mlp.linear_fc2.bias"]
    x = layer_norm(x, g["decoder.final_layernorm.weight"], g["decoder.final_layernorm.bias"])
    logits = x @ g["embedding.word_embeddings.weight"].T
    mx = logits.max(-1, keepdims=True)
    lse = (mx + np.log(np.exp(logits - mx).sum(-1, keepdims=True)))[:, 0]
    return float(np.mean(lse - logits[np.arange(s), labels]))
