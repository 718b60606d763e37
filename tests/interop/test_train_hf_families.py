"""The float32 trainer on checkpoints converted from tiny HF Llama 3 (grouped-query, untied),
Llama 3.1 (rope scaling "llama3"), Llama 3.2 (tied, scaling factor 32), Mistral and Qwen2 (q/k/v
biases, tied) folders: `train --finetune` loads them, its first loss is the float64 numpy forward's
loss of the HF folder on the same tokens (HF's scaled frequencies written out in ckpt_testlib), and
a few steps stay finite.
What it saves remembers the HF class, so `convert_hf --to-hf` gives Mistral back as Mistral; a
Llama 3.1 checkpoint needs the matching --use-rope-scaling flags."""
import json
import math

import numpy as np
import pytest
from safetensors.numpy import load_file

from ckpt_testlib import llama_forward_hf, make_llama, megatron_forward, read_hf, run, write_hf
from train_testlib import mock_sample, parse_log, run_train

SEED, SEQ, VOCAB, GBS = 1234, 32, 256, 4
SHAPE = dict(layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=VOCAB, positions=64)
LLAMA31_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
FAMILIES = {
    "llama3": dict(overrides={"rope_theta": 500000.0}),
    # Scaling changes wavelengths above 2048 only: a small base puts several of the head's 4
    # frequencies there (10^6: wavelengths 6, 199, 6283, 198692).
    "llama31": dict(overrides={"rope_theta": 1000000.0, "rope_scaling": LLAMA31_SCALING}),
    "llama32": dict(tied=True, overrides={"rope_theta": 1000000.0,
                                          "rope_scaling": dict(LLAMA31_SCALING, factor=32.0)}),
    "mistral": dict(model_type="mistral", overrides={"rope_theta": 1000000.0}),
    "qwen2": dict(model_type="qwen2", qkv_bias=True, tied=True,
                  overrides={"rope_theta": 1000000.0, "rms_norm_eps": 1e-6}),
}


def train_flags(cfg):
    """The flags that describe the HF model to `train` (CheckSameModel compares every one)."""
    flags = ["--num-layers", cfg["num_hidden_layers"], "--hidden-size", cfg["hidden_size"],
             "--num-attention-heads", cfg["num_attention_heads"], "--group-query-attention",
             "--num-query-groups", cfg["num_key_value_heads"],
             "--ffn-hidden-size", cfg["intermediate_size"], "--seq-length", SEQ,
             "--max-position-embeddings", cfg["max_position_embeddings"],
             "--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
             "--rotary-base", cfg["rope_theta"], "--norm-epsilon", cfg["rms_norm_eps"],
             "--disable-bias-linear", "--tokenizer-type", "NullTokenizer",
             "--vocab-size", cfg["vocab_size"] - 1,  # + NullTokenizer's EOD
             "--hidden-dropout", "0", "--attention-dropout", "0", "--mock-data",
             "--micro-batch-size", 2, "--global-batch-size", GBS, "--log-interval", 1,
             "--eval-iters", 0, "--seed", SEED]
    if cfg.get("rope_scaling"):
        flags += ["--use-rope-scaling", "--rope-scaling-factor", cfg["rope_scaling"]["factor"]]
    if cfg["model_type"] == "qwen2":
        flags.append("--add-qkv-bias")
    if not cfg["tie_word_embeddings"]:
        flags.append("--untie-embeddings-and-output-weights")
    return flags


def sharpen_low_frequencies(path, cfg, tensors, gain=8.0):
    """Rewrites the HF folder with the q/k rows of the rotary pairs i >= head_dim/4 (the lowest
    frequencies: rotate-half dims [d/4, d/2) and [3d/4, d)) times `gain`, so that Llama 3.1's
    scaling, which moves only those, changes the loss by far more than the tolerance."""
    hd = cfg["head_dim"]
    scale = np.ones(hd, np.float32)
    scale[hd // 4:hd // 2] = gain
    scale[3 * hd // 4:] = gain
    for name in list(tensors):
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            w = tensors[name]
            tensors[name] = (w.reshape(-1, hd, w.shape[-1]) * scale[None, :, None]).reshape(w.shape)
    write_hf(path, cfg, tensors)
    return tensors


def numpy_loss(tensors, cfg):
    """Mean cross-entropy of the HF model (float64) over the first global batch's mock samples."""
    losses = []
    for i in range(GBS):
        tokens = mock_sample(i, SEED, VOCAB, SEQ)
        logits = llama_forward_hf(tensors, cfg, tokens[:-1])
        top = logits.max(-1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
        losses.append(np.mean(lse - logits[np.arange(SEQ), tokens[1:]]))
    return float(np.mean(losses))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_converted_family_trains_from_the_hf_loss(tmp_path, family):
    cfg, tensors = make_llama(tmp_path / "hf", **SHAPE, **FAMILIES[family])
    if "rope_scaling" in cfg:
        tensors = sharpen_low_frequencies(tmp_path / "hf", cfg, tensors)
        unscaled = {k: v for k, v in cfg.items() if k != "rope_scaling"}
        # The comparison's power: ignoring the scaling would miss by 100 tolerances or more.
        assert abs(numpy_loss(tensors, unscaled) / numpy_loss(tensors, cfg) - 1) > 1e-3
    run("convert_hf", "--from-hf", tmp_path / "hf", "--save", tmp_path / "ck")
    proc = run_train(train_flags(cfg) + ["--load", tmp_path / "ck", "--finetune",
                                         "--train-iters", 3, "--lr", "1e-3"])
    train, _ = parse_log(proc.stdout)
    assert sorted(train) == [1, 2, 3]
    assert all(math.isfinite(train[i][1]) and math.isfinite(train[i][2]) for i in train)
    expected = numpy_loss(tensors, cfg)
    print(family, "train", train[1][1], "numpy float64", expected)
    assert train[1][1] == pytest.approx(expected, rel=1e-5)


def test_a_finetuned_mistral_exports_as_mistral(tmp_path):
    cfg, _ = make_llama(tmp_path / "hf", **SHAPE, **FAMILIES["mistral"])
    run("convert_hf", "--from-hf", tmp_path / "hf", "--save", tmp_path / "ck")
    run_train(train_flags(cfg) + ["--load", tmp_path / "ck", "--finetune", "--train-iters", 2,
                                  "--lr", "1e-3", "--save", tmp_path / "tuned"])
    it = tmp_path / "tuned" / "iter_0000002"
    model = json.loads((it / "metadata.json").read_text())["model"]
    assert model["hf_architecture"] == "MistralForCausalLM"
    run("convert_hf", "--to-hf", "--load", tmp_path / "tuned", "--save", tmp_path / "out")
    back = json.loads((tmp_path / "out" / "config.json").read_text())
    assert back["architectures"] == ["MistralForCausalLM"] and back["model_type"] == "mistral"
    assert back["sliding_window"] is None and back["rope_theta"] == 1000000.0
    # The exported folder computes what the trained checkpoint computes (float64 on both sides).
    ours = load_file(str(it / "mp_rank_00" / "model.safetensors"))
    tokens = mock_sample(7, SEED, VOCAB, SEQ)[:-1]
    np.testing.assert_allclose(llama_forward_hf(read_hf(tmp_path / "out"), back, tokens),
                               megatron_forward(ours, model, tokens), rtol=1e-10, atol=1e-10)


def test_a_model_trained_here_with_qkv_bias_exports_as_qwen2(tmp_path):
    cfg = {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 32,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
           "max_position_embeddings": SEQ, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
           "vocab_size": VOCAB, "tie_word_embeddings": False}
    run_train(train_flags(cfg) + ["--train-iters", 1, "--lr", "1e-3", "--save", tmp_path / "ck"])
    model = json.loads((tmp_path / "ck" / "iter_0000001" / "metadata.json").read_text())["model"]
    assert "hf_architecture" not in model  # not recorded: chosen by the shape
    run("convert_hf", "--to-hf", "--load", tmp_path / "ck", "--save", tmp_path / "out")
    back = json.loads((tmp_path / "out" / "config.json").read_text())
    assert back["architectures"] == ["Qwen2ForCausalLM"] and back["model_type"] == "qwen2"
    assert "model.layers.1.self_attn.v_proj.bias" in read_hf(tmp_path / "out")


def test_a_llama31_checkpoint_needs_the_rope_scaling_flags(tmp_path):
    cfg, _ = make_llama(tmp_path / "hf", **SHAPE, **FAMILIES["llama31"])
    run("convert_hf", "--from-hf", tmp_path / "hf", "--save", tmp_path / "ck")
    flags = [f for f in train_flags(cfg) if f not in ("--use-rope-scaling", "--rope-scaling-factor",
                                                      8.0)]
    flags += ["--load", tmp_path / "ck", "--finetune", "--train-iters", 1, "--lr", "1e-3"]
    proc = run_train(flags, ok=False)
    assert proc.returncode == 1
    assert ("checkpoint has rope_scaling llama3 (factor 8, low_freq_factor 1, high_freq_factor 4, "
            "original_max_position_embeddings 8192) but this run has none (--use-rope-scaling, "
            "--rope-scaling-factor)") in proc.stderr, proc.stderr
    proc = run_train(flags + ["--use-rope-scaling", "--rope-scaling-factor", "32"], ok=False)
    assert "but this run has llama3 (factor 32," in proc.stderr, proc.stderr
    # Megatron's flag fixes the other three numbers: a checkpoint with others says so.
    meta_path = tmp_path / "ck" / "iter_0000000" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["model"]["rope_scaling"]["original_max_position_embeddings"] = 4096
    meta_path.write_text(json.dumps(meta))
    proc = run_train(flags + ["--use-rope-scaling"], ok=False)
    assert ("; --use-rope-scaling gives low_freq_factor 1, high_freq_factor 4 and "
            "original_max_position_embeddings 8192 as Megatron's does") in proc.stderr, proc.stderr
    meta["model"]["rope_scaling"]["original_max_position_embeddings"] = 8192
    meta_path.write_text(json.dumps(meta))
    proc = run_train(flags + ["--use-rope-scaling"])
    train, _ = parse_log(proc.stdout)
    assert math.isfinite(train[1][1])
