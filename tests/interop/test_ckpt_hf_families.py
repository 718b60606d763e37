"""The Llama family through convert_hf: Llama 2 (multi-head), Llama 3 (grouped-query), Llama 3.1
(rope scaling "llama3"), Llama 3.2 (tied, scaled), Mistral (no sliding window), Qwen2 (q/k/v
biases) and a transformers-5 config (rope_parameters). HF -> ours TP2/PP2 -> TP1/PP1 -> HF gives
every tensor back bitwise and the config's fields back; the checkpoint in between matches an
independent numpy implementation of Megatron's layout. What the trainer cannot compute is refused
with one precise line."""
import json

import numpy as np
import pytest

from ckpt_testlib import make_llama, padded_vocab, read_hf, read_ours, run

LLAMA31_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA32_SCALING = dict(LLAMA31_SCALING, factor=32.0)

# name: make_llama keyword arguments.
FAMILIES = {
    "llama2": dict(kv_heads=8, overrides={"bos_token_id": 1, "eos_token_id": 2}),
    "llama3": dict(overrides={"rope_theta": 500000.0, "bos_token_id": 128000,
                              "eos_token_id": 128001}),
    "llama31": dict(overrides={"rope_theta": 500000.0, "rope_scaling": LLAMA31_SCALING,
                               "max_position_embeddings": 131072,
                               "eos_token_id": [128001, 128008, 128009]}),
    "llama32": dict(tied=True, kv_heads=2, overrides={"rope_theta": 500000.0,
                                                      "rope_scaling": LLAMA32_SCALING}),
    "mistral": dict(model_type="mistral", overrides={"rope_theta": 1000000.0}),
    "qwen2": dict(model_type="qwen2", qkv_bias=True, tied=True,
                  overrides={"rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "head_dim": None,
                             "max_window_layers": 4, "eos_token_id": 151643,
                             "bos_token_id": None,
                             "layer_types": ["full_attention"] * 4}),
    # transformers 5 writes rope_theta and the scaling into one rope_parameters object.
    "llama31_v5": dict(overrides={"rope_theta": None, "rope_parameters": dict(
        LLAMA31_SCALING, rope_theta=500000.0)}),
}


def megatron_from_hf(t, cfg, tp):
    """Independent HF -> Megatron mapping (spec §4): q/k/v (and Qwen2's biases) grouped per query
    group [q heads of the group; k; v], fc1 = [gate; up], vocabulary rows padded with zeros."""
    h, nh, ng = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hn, v = h // nh, cfg["vocab_size"]
    vp = padded_vocab(v, tp)

    def pad(a):
        out = np.zeros((vp, h), np.float32)
        out[:v] = a
        return out

    def grouped(q, k, v_, *rest):
        return np.concatenate([q.reshape(ng, nh // ng * hn, *rest), k.reshape(ng, hn, *rest),
                               v_.reshape(ng, hn, *rest)], axis=1).reshape(-1, *rest)

    out = {"embedding.word_embeddings.weight": pad(t["model.embed_tokens.weight"])}
    for i in range(cfg["num_hidden_layers"]):
        p, q = f"decoder.layers.{i}.", f"model.layers.{i}.self_attn."
        out[p + "self_attention.linear_qkv.weight"] = grouped(
            t[q + "q_proj.weight"], t[q + "k_proj.weight"], t[q + "v_proj.weight"], h)
        if q + "q_proj.bias" in t:
            out[p + "self_attention.linear_qkv.bias"] = grouped(
                t[q + "q_proj.bias"], t[q + "k_proj.bias"], t[q + "v_proj.bias"])
        m = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": t[m + "input_layernorm.weight"],
                    p + "self_attention.linear_proj.weight": t[q + "o_proj.weight"],
                    p + "pre_mlp_layernorm.weight": t[m + "post_attention_layernorm.weight"],
                    p + "mlp.linear_fc1.weight": np.concatenate([t[m + "mlp.gate_proj.weight"],
                                                                 t[m + "mlp.up_proj.weight"]]),
                    p + "mlp.linear_fc2.weight": t[m + "mlp.down_proj.weight"]})
    out["decoder.final_layernorm.weight"] = t["model.norm.weight"]
    if "lm_head.weight" in t:
        out["output_layer.weight"] = pad(t["lm_head.weight"])
    return out


def rope_of(cfg):
    """(theta, scaling or None) whether written by transformers 4 or 5."""
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    scaling = cfg.get("rope_scaling") or (params if params.get("rope_type") == "llama3" else None)
    if scaling:
        scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    return theta, scaling


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_round_trip_is_bitwise(tmp_path, family):
    hf = tmp_path / "hf"
    cfg, tensors = make_llama(hf, **FAMILIES[family])
    ours = tmp_path / "tp2pp2"
    run("convert_hf", "--from-hf", hf, "--save", ours, "--target-tp", 2, "--target-pp", 2)
    meta, merged = read_ours(ours)
    expected = megatron_from_hf(tensors, cfg, 2)
    tied_copy = {"output_layer.weight"} if cfg["tie_word_embeddings"] else set()
    assert set(merged[""]) == set(expected) | tied_copy
    for name, array in expected.items():
        assert np.array_equal(merged[""][name], array), name
    model = meta["model"]
    assert model["hf_architecture"] == cfg["architectures"][0]
    assert model["add_qkv_bias"] is (cfg["model_type"] == "qwen2")
    assert model["add_bias_linear"] is False
    assert model["untie_embeddings_and_output_weights"] is not cfg["tie_word_embeddings"]
    theta, scaling = rope_of(cfg)
    assert model["rotary_base"] == theta
    assert model.get("rope_scaling") == (dict(scaling) if scaling else None)
    assert meta["args"]["converted_from"] == cfg["architectures"][0]

    flat = tmp_path / "tp1pp1"
    run("reshard_checkpoint", "--load", ours, "--save", flat, "--target-tp", 1, "--target-pp", 1)
    out = tmp_path / "out"
    run("convert_hf", "--to-hf", "--load", flat, "--save", out)
    back_tensors = read_hf(out)
    assert set(back_tensors) == set(tensors)
    for name, array in tensors.items():
        assert back_tensors[name].dtype == array.dtype and np.array_equal(back_tensors[name], array), name
    back = json.loads((out / "config.json").read_text())
    for key in ("architectures", "model_type", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_act",
                "max_position_embeddings", "rms_norm_eps", "vocab_size", "tie_word_embeddings",
                "bos_token_id", "eos_token_id", "attention_bias", "mlp_bias", "sliding_window",
                "use_sliding_window", "head_dim"):
        if key in cfg:
            assert back.get(key) == cfg[key], key
    assert rope_of(back) == rope_of(cfg)
    if cfg["model_type"] == "qwen2":
        assert "head_dim" not in back  # Qwen2Config has no such field; hidden/heads it is
    if "bos_token_id" not in cfg:
        assert "bos_token_id" not in back


def test_inspect_shows_the_architecture(tmp_path):
    for family in ("llama32", "qwen2", "llama2"):
        cfg, _ = make_llama(tmp_path / family, **FAMILIES[family])
        run("convert_hf", "--from-hf", tmp_path / family, "--save", tmp_path / f"c_{family}")
    text = run("inspect", "checkpoint", tmp_path / "c_llama32").stdout
    assert "architecture: LlamaForCausalLM (recorded in the checkpoint)\n" in text
    assert ("  norm: RMSNorm, eps 1e-05 | MLP: swiglu, ffn 48 | positions: rope, base 500000, "
            "llama3 scaling (factor 32, low_freq_factor 1, high_freq_factor 4, "
            "original_max_position_embeddings 8192)\n") in text
    assert ("  attention: 8 heads / 2 query groups (grouped-query), head dim 4 | biases: none | "
            "embeddings: tied\n") in text
    text = run("inspect", "checkpoint", tmp_path / "c_qwen2").stdout
    assert "architecture: Qwen2ForCausalLM (recorded in the checkpoint)\n" in text
    assert "positions: rope, base 1e+06, no scaling\n" in text
    assert "(grouped-query), head dim 4 | biases: QKV only | embeddings: tied\n" in text
    text = run("inspect", "checkpoint", tmp_path / "c_llama2").stdout
    assert "  attention: 8 heads / 8 query groups (multi-head)" in text
    assert "embeddings: untied output layer\n" in text


# (model_type, config overrides, the error after "convert_hf: <hf>/config.json: ")
FULL = (" is not supported: Leantron computes full causal attention, which differs from "
        "sliding-window attention on sequences longer than the window")
SCALED = ("' is not supported (only unscaled rotary positions and Llama 3.1's 'llama3' scaling "
          "are implemented)")
REFUSED = [
    ("mistral", {"sliding_window": 4096},
     "sliding_window 4096" + FULL + ' (a config with "sliding_window": null converts)'),
    ("mistral", {"sliding_window": None},  # removed: MistralConfig's default is 4096
     "sliding_window is absent, which MistralForCausalLM reads as 4096; sliding_window" + FULL
     + ' (a config with "sliding_window": null converts)'),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4096},
     "use_sliding_window = true" + FULL),
    ("qwen2", {"layer_types": ["full_attention"] * 3 + ["sliding_attention"]},
     "layer_types[3] = 'sliding_attention'" + FULL),
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                "original_max_position_embeddings": 4096}},
     "rope_scaling of type 'yarn" + SCALED),
    ("llama", {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
     "rope_scaling of type 'dynamic" + SCALED),
    ("qwen2", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     "rope_scaling of type 'linear" + SCALED),
    ("mistral", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                     "rope_theta": 10000.0}},
     "rope_parameters of type 'dynamic" + SCALED),
    ("llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                   "short_factor": [1.0], "long_factor": [1.0]}},
     "rope_parameters of type 'longrope" + SCALED),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0}},
     "missing or mistyped 'rope_scaling.original_max_position_embeddings'"),
    ("llama", {"rope_scaling": dict(LLAMA31_SCALING, low_freq_factor=4.0, high_freq_factor=1.0)},
     "model config: llama3 rope_scaling needs factor > 0, 0 < low_freq_factor < "
     "high_freq_factor and original_max_position_embeddings > 0 (got 8, 4, 1, 8192)"),
    ("llama", {"partial_rotary_factor": 0.5},
     "partial_rotary_factor 0.5 is not supported (rotary positions on whole heads)"),
    ("llama", {"attention_bias": True}, "attention_bias = true is not supported"),
]


@pytest.mark.parametrize("model_type,overrides,message", REFUSED)
def test_what_the_trainer_cannot_compute_is_refused(tmp_path, model_type, overrides, message):
    hf = tmp_path / "hf"
    make_llama(hf, model_type=model_type, qkv_bias=model_type == "qwen2", overrides=overrides)
    proc = run("convert_hf", "--from-hf", hf, "--save", tmp_path / "ck", ok=False)
    assert proc.stderr == f"convert_hf: {hf / 'config.json'}: {message}\n"
    assert not (tmp_path / "ck").exists()


def test_an_unknown_model_type_is_named(tmp_path):
    hf = tmp_path / "hf"
    make_llama(hf, overrides={"model_type": "gemma"})
    proc = run("convert_hf", "--from-hf", hf, "--save", tmp_path / "ck", ok=False)
    assert proc.stderr == (f"convert_hf: {hf / 'config.json'}: model_type 'gemma' is not supported "
                           "(gpt2, llama, mistral, qwen2)\n")


def test_metadata_naming_an_architecture_that_does_not_fit_is_refused_at_export(tmp_path):
    make_llama(tmp_path / "hf")
    run("convert_hf", "--from-hf", tmp_path / "hf", "--save", tmp_path / "ck")
    meta_path = tmp_path / "ck" / "iter_0000000" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["model"]["hf_architecture"] = "Qwen2ForCausalLM"  # but no QKV bias
    meta_path.write_text(json.dumps(meta))
    proc = run("convert_hf", "--to-hf", "--load", tmp_path / "ck", "--save", tmp_path / "out", ok=False)
    assert proc.stderr == ("convert_hf: model config records hf_architecture Qwen2ForCausalLM but its "
                           "shape does not fit that class (RMSNorm, swiglu, rope positions, no "
                           "linear biases, no QKV bias)\n")
    meta["model"]["hf_architecture"] = "FalconForCausalLM"
    meta_path.write_text(json.dumps(meta))
    proc = run("convert_hf", "--to-hf", "--load", tmp_path / "ck", "--save", tmp_path / "out", ok=False)
    assert "hf_architecture must be GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM or " \
           "Qwen2ForCausalLM" in proc.stderr
