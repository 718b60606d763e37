"""The trainer's first-iteration loss equals a float64 numpy GPT-2 on the same weights and samples
(erf GELU and --openai-gelu), and training on mock data lowers the loss."""
import numpy as np
import pytest
from safetensors.numpy import load_file

from train_testlib import TINY, gpt_loss, mock_sample, parse_log, run_train


@pytest.mark.parametrize("openai_gelu", [False, True])
def test_first_loss_matches_numpy_float64(tmp_path, openai_gelu):
    seed, seq, vocab = 1234, 32, 256
    args = TINY + ["--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2",
                   "--train-iters", "1", "--lr", "1e-30", "--weight-decay", "0",
                   "--hidden-dropout", "0", "--attention-dropout", "0", "--init-method-std", "0.2",
                   "--log-interval", "1", "--eval-iters", "0", "--save", tmp_path / "ck",
                   "--seed", seed]
    if openai_gelu:
        args.append("--openai-gelu")
    proc = run_train(args)
    train, _ = parse_log(proc.stdout)
    # lr 1e-30 leaves the saved weights equal to the initial ones to float32 precision.
    t = load_file(str(tmp_path / "ck" / "iter_0000001" / "mp_rank_00" / "model.safetensors"))
    losses = []
    for i in range(2):
        text = mock_sample(i, seed, vocab, seq)
        losses.append(gpt_loss(t, 4, 4, text[:-1], text[1:], openai_gelu))
    want = np.mean(losses)
    assert train[1][1] == pytest.approx(want, rel=2e-6), (train[1][1], want)


def test_mock_training_lowers_the_loss():
    proc = run_train(TINY + ["--mock-data", "--micro-batch-size", "4", "--global-batch-size", "8",
                             "--train-iters", "60", "--lr", "3e-3", "--lr-warmup-iters", "5",
                             "--lr-decay-style", "cosine", "--log-interval", "10",
                             "--eval-interval", "30", "--eval-iters", "2"])
    train, valid = parse_log(proc.stdout)
    assert sorted(train) == [10, 20, 30, 40, 50, 60]
    assert train[60][1] < train[10][1] - 1.0
    assert sorted(valid) == [30, 60]
    assert train[60][0] == 0.0  # cosine decayed to --min-lr 0


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def fields(buf):
    """Decodes one protobuf message into [(field, value)] (wire types 0, 1, 2, 5)."""
    import struct
    out, i = [], 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = struct.unpack("<d", buf[i:i + 8])[0], i + 8
        elif wire == 5:
            v, i = struct.unpack("<f", buf[i:i + 4])[0], i + 4
        else:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        out.append((field, v))
    return out


def test_tensorboard_event_file(tmp_path):
    """TFRecord framing with valid masked CRC-32C, tensorflow.Event protos with the scalars
    Megatron writes, values equal to the log's."""
    import struct
    assert crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    proc = run_train(TINY + ["--mock-data", "--micro-batch-size", "2", "--global-batch-size", "4",
                             "--train-iters", "4", "--lr", "1e-3", "--log-interval", "1",
                             "--eval-interval", "2", "--eval-iters", "1",
                             "--tensorboard-dir", tmp_path / "tb"])
    train, valid = parse_log(proc.stdout)
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    data, i, events = path.read_bytes(), 0, []
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        assert struct.unpack("<I", data[i + 8:i + 12])[0] == masked(data[i:i + 8])
        body = data[i + 12:i + 12 + n]
        assert struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == masked(body)
        events.append(dict(fields(body)))
        i += 16 + n
    assert events[0][3] == b"brain.Event:2"
    scalars = {}
    for e in events[1:]:
        value = dict(fields(dict(fields(e[5]))[1]))
        scalars.setdefault(value[1].decode(), {})[e[2]] = value[2]
    assert set(scalars) >= {"lm loss", "learning-rate", "grad-norm", "batch-size",
                            "lm loss validation"}
    for it, (lr, loss, norm, _) in train.items():
        assert scalars["lm loss"][it] == pytest.approx(loss, rel=1e-6)
        assert scalars["grad-norm"][it] == pytest.approx(norm, abs=1e-3)
    assert scalars["lm loss validation"][2] == pytest.approx(valid[2], rel=1e-6)


def test_trained_checkpoint_exports_to_huggingface(tmp_path):
    """Train with TP2 x PP2, export with convert_hf --to-hf, and the HF GPT-2 (numpy float64,
    transformers' layout: Conv1D weights, fused c_attn) gives the final validation loss."""
    import json

    from ckpt_testlib import gpt2_forward_hf, read_hf
    from train_testlib import export_validation_samples, train_tp2pp2_and_export_hf
    valid_loss = train_tp2pp2_and_export_hf(tmp_path)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["activation_function"] == "gelu_new"
    t = read_hf(tmp_path / "hf")
    losses = []
    for text in export_validation_samples():
        logits = gpt2_forward_hf(t, cfg, text[:-1])
        mx = logits.max(-1, keepdims=True)
        lse = mx[:, 0] + np.log(np.exp(logits - mx).sum(-1))
        losses.append(np.mean(lse - logits[np.arange(len(text) - 1), text[1:]]))
    assert valid_loss == pytest.approx(np.mean(losses), rel=5e-6)


def test_log_line_is_megatrons():
    import re
    proc = run_train(TINY + ["--mock-data", "--micro-batch-size", "2", "--global-batch-size", "4",
                             "--train-iters", "2", "--lr", "1e-3", "--log-interval", "1",
                             "--eval-iters", "0"])
    line = re.compile(
        r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration {8}\d/ {7}2 \| consumed samples: +\d+ \| "
        r"elapsed time per iteration \(ms\): \d+\.\d \| learning rate: \d\.\d{6}E[+-]\d\d \| "
        r"global batch size: {5}4 \| lm loss: \d\.\d{6}E[+-]\d\d \| loss scale: 1\.0 \| "
        r"grad norm: \d+\.\d{3} \| number of skipped iterations: {3}0 \| "
        r"number of nan iterations: {3}0 \|$")
    lines = [x for x in proc.stdout.splitlines() if " iteration " in x]
    assert len(lines) == 2 and all(line.match(x) for x in lines), lines


LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--group-query-attention", "--num-query-groups", "2",
         "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--ffn-hidden-size", "48"]


def test_llama_style_first_loss_matches_numpy_float64(tmp_path):
    """RMSNorm, SwiGLU, RoPE, grouped-query attention, untied output, no biases: against the
    checkpoint tests' float64 Megatron-Core forward (ckpt_testlib.megatron_forward)."""
    import json

    from ckpt_testlib import megatron_forward
    seed, seq, vocab = 1234, 32, 256
    run_train(TINY + LLAMA + ["--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2",
                              "--train-iters", "1", "--lr", "1e-30", "--weight-decay", "0",
                              "--hidden-dropout", "0", "--attention-dropout", "0",
                              "--init-method-std", "0.2", "--log-interval", "1", "--eval-iters", "0",
                              "--save", tmp_path / "ck", "--seed", seed])
    it = tmp_path / "ck" / "iter_0000001"
    model = json.loads((it / "metadata.json").read_text())["model"]
    t = load_file(str(it / "mp_rank_00" / "model.safetensors"))
    assert "output_layer.weight" in t and "embedding.position_embeddings.weight" not in t
    assert not any(k.endswith(".bias") for k in t)
    losses = []
    for i in range(2):
        text = mock_sample(i, seed, vocab, seq)
        logits = megatron_forward(t, model, text[:-1])
        mx = logits.max(-1, keepdims=True)
        lse = mx[:, 0] + np.log(np.exp(logits - mx).sum(-1))
        losses.append(np.mean(lse - logits[np.arange(seq), text[1:]]))
    proc_loss = parse_log(run_train(TINY + LLAMA + [
        "--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "1",
        "--lr", "1e-30", "--weight-decay", "0", "--hidden-dropout", "0", "--attention-dropout", "0",
        "--init-method-std", "0.2", "--log-interval", "1", "--eval-iters", "0",
        "--seed", seed]).stdout)[0][1][1]
    assert proc_loss == pytest.approx(np.mean(losses), rel=2e-6)
