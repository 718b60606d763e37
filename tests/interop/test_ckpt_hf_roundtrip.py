"""HF -> ours at TP2/PP2 -> reshard TP4/PP1 -> TP1/PP4 -> TP1/PP1 -> HF is bitwise, for GPT-2 (tied,
biases, LayerNorm) and Llama (GQA, SwiGLU, untied); tensors in between match an independent
numpy implementation of Megatron's layout."""
import json

import numpy as np
import pytest

from ckpt_testlib import (make_gpt2, make_llama, padded_vocab, raw_read, raw_write, read_hf, read_ours,
                          run, to_bf16_bytes)

CHAIN = [(4, 1, 1), (1, 4, 1), (1, 2, 2), (1, 1, 1)]


def megatron_from_hf_gpt2(t, cfg, tp, prefix="transformer."):
    """Independent HF -> Megatron mapping (spec §3): Conv1D transposes, c_attn to [np, 3, hn]."""
    h, nh = cfg["n_embd"], cfg["n_head"]
    hn, v = h // nh, cfg["vocab_size"]
    vp = padded_vocab(v, tp)
    out = {}
    wte = np.zeros((vp, h), np.float32)
    wte[:v] = t[prefix + "wte.weight"]
    out["embedding.word_embeddings.weight"] = wte
    out["embedding.position_embeddings.weight"] = t[prefix + "wpe.weight"]
    for i in range(cfg["n_layer"]):
        p, q = f"decoder.layers.{i}.", f"{prefix}h.{i}."
        w = t[q + "attn.c_attn.weight"].T.reshape(3, nh, hn, h).transpose(1, 0, 2, 3).reshape(3 * h, h)
        b = t[q + "attn.c_attn.bias"].reshape(3, nh, hn).transpose(1, 0, 2).reshape(3 * h)
        out.update({p + "input_layernorm.weight": t[q + "ln_1.weight"], p + "input_layernorm.bias": t[q + "ln_1.bias"],
                    p + "self_attention.linear_qkv.weight": w, p + "self_attention.linear_qkv.bias": b,
                    p + "self_attention.linear_proj.weight": t[q + "attn.c_proj.weight"].T,
                    p + "self_attention.linear_proj.bias": t[q + "attn.c_proj.bias"],
                    p + "pre_mlp_layernorm.weight": t[q + "ln_2.weight"], p + "pre_mlp_layernorm.bias": t[q + "ln_2.bias"],
                    p + "mlp.linear_fc1.weight": t[q + "mlp.c_fc.weight"].T, p + "mlp.linear_fc1.bias": t[q + "mlp.c_fc.bias"],
                    p + "mlp.linear_fc2.weight": t[q + "mlp.c_proj.weight"].T, p + "mlp.linear_fc2.bias": t[q + "mlp.c_proj.bias"]})
    out["decoder.final_layernorm.weight"] = t[prefix + "ln_f.weight"]
    out["decoder.final_layernorm.bias"] = t[prefix + "ln_f.bias"]
    return out


def megatron_from_hf_llama(t, cfg, tp):
    """Independent HF -> Megatron mapping (spec §4): q/k/v grouped per query group, [gate; up]."""
    h, nh, ng, hn, v = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                        cfg["head_dim"], cfg["vocab_size"])
    vp = padded_vocab(v, tp)

    def pad(a):
        out = np.zeros((vp, h), np.float32)
        out[:v] = a
        return out

    out = {"embedding.word_embeddings.weight": pad(t["model.embed_tokens.weight"])}
    for i in range(cfg["num_hidden_layers"]):
        p, q = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = np.concatenate([t[q + "self_attn.q_proj.weight"].reshape(ng, nh // ng * hn, h),
                              t[q + "self_attn.k_proj.weight"].reshape(ng, hn, h),
                              t[q + "self_attn.v_proj.weight"].reshape(ng, hn, h)], axis=1).reshape(-1, h)
        out.update({p + "input_layernorm.weight": t[q + "input_layernorm.weight"],
                    p + "self_attention.linear_qkv.weight": qkv,
                    p + "self_attention.linear_proj.weight": t[q + "self_attn.o_proj.weight"],
                    p + "pre_mlp_layernorm.weight": t[q + "post_attention_layernorm.weight"],
                    p + "mlp.linear_fc1.weight": np.concatenate([t[q + "mlp.gate_proj.weight"],
                                                                 t[q + "mlp.up_proj.weight"]]),
                    p + "mlp.linear_fc2.weight": t[q + "mlp.down_proj.weight"]})
    out["decoder.final_layernorm.weight"] = t["model.norm.weight"]
    if "lm_head.weight" in t:
        out["output_layer.weight"] = pad(t["lm_head.weight"])
    return out


def check_ours(path, expected, tp):
    meta, ours = read_ours(path)
    assert meta["parallel"]["tensor_model_parallel_size"] == tp
    params = {k: v for k, v in ours[""].items() if k in expected}
    extra = set(ours[""]) - set(expected)
    assert extra <= {"output_layer.weight"}, extra  # Only the tied copy on the last stage.
    assert set(params) == set(expected)
    for name, array in expected.items():
        got = params[name]
        assert got.shape == array.shape, name
        assert np.array_equal(got, array), name


def chain(tmp_path, hf, expected_fn, from_tp=2, from_pp=2):
    ours = tmp_path / "ours_tp2pp2"
    run("convert_hf", "--from-hf", hf, "--save", ours, "--target-tp", from_tp, "--target-pp", from_pp)
    check_ours(ours, expected_fn(from_tp), from_tp)
    prev = ours
    for tp, pp, vpp in CHAIN:
        nxt = tmp_path / f"ours_tp{tp}pp{pp}vpp{vpp}"
        run("reshard_checkpoint", "--load", prev, "--save", nxt, "--target-tp", tp, "--target-pp", pp,
            "--target-vpp", vpp)
        check_ours(nxt, expected_fn(tp), tp)
        prev = nxt
    out = tmp_path / "hf_out"
    run("convert_hf", "--to-hf", "--load", prev, "--save", out)
    return out


def assert_same_tensors(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k


def test_gpt2_round_trip_is_bitwise(tmp_path):
    hf = tmp_path / "hf"
    cfg, tensors = make_gpt2(hf, buffers=True)
    out = chain(tmp_path, hf, lambda tp: megatron_from_hf_gpt2(tensors, cfg, tp))
    expected = {k: v for k, v in tensors.items() if not k.endswith(".attn.bias")}
    assert_same_tensors(read_hf(out), expected)
    back = json.loads((out / "config.json").read_text())
    for key in ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size", "activation_function",
                "bos_token_id", "eos_token_id", "model_type", "architectures"):
        assert back[key] == cfg[key], key
    assert back["tie_word_embeddings"] is True
    assert "lm_head.weight" not in read_hf(out)


def test_llama_round_trip_is_bitwise(tmp_path):
    hf = tmp_path / "hf"
    cfg, tensors = make_llama(hf)
    out = chain(tmp_path, hf, lambda tp: megatron_from_hf_llama(tensors, cfg, tp))
    assert_same_tensors(read_hf(out), tensors)
    back = json.loads((out / "config.json").read_text())
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "rope_theta",
                "rms_norm_eps", "bos_token_id", "eos_token_id", "model_type", "architectures"):
        assert back[key] == cfg[key], key


def test_tied_llama_and_unprefixed_sharded_gpt2(tmp_path):
    hf = tmp_path / "llama_tied"
    cfg, tensors = make_llama(hf, tied=True, shards=3)
    out = tmp_path / "out_llama"
    run("convert_hf", "--from-hf", hf, "--save", tmp_path / "c1", "--target-tp", 2, "--target-pp", 4)
    meta, ours = read_ours(tmp_path / "c1")
    assert np.array_equal(ours[""]["output_layer.weight"], ours[""]["embedding.word_embeddings.weight"])
    run("convert_hf", "--to-hf", "--load", tmp_path / "c1", "--save", out, "--max-shard-size", 20000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in tensors.values())
    assert_same_tensors(read_hf(out), tensors)

    hf2 = tmp_path / "gpt2_bare"
    cfg2, tensors2 = make_gpt2(hf2, prefix="", shards=2, layers=2)
    run("convert_hf", "--from-hf", hf2, "--save", tmp_path / "c2")
    run("convert_hf", "--to-hf", "--load", tmp_path / "c2", "--save", tmp_path / "out2")
    back = read_hf(tmp_path / "out2")
    assert_same_tensors(back, {"transformer." + k: v for k, v in tensors2.items()})


def test_bf16_round_trip_and_tokenizer_files(tmp_path):
    hf = tmp_path / "hf"
    cfg, tensors = make_llama(hf, layers=2)
    raw = {k: ("BF16", v.shape, to_bf16_bytes(v)) for k, v in tensors.items()}
    (hf / "model.safetensors").unlink()
    raw_write(hf / "model.safetensors", raw, {"format": "pt"})
    (hf / "tokenizer.json").write_text('{"fake": "tokenizer"}')
    (hf / "tokenizer_config.json").write_text("{}")
    run("convert_hf", "--from-hf", hf, "--save", tmp_path / "c", "--target-tp", 2, "--copy-tokenizer-files")
    assert (tmp_path / "c" / "tokenizer" / "tokenizer.json").exists()
    run("reshard_checkpoint", "--load", tmp_path / "c", "--save", tmp_path / "d", "--target-tp", 1,
        "--target-pp", 2)
    out = tmp_path / "out"
    run("convert_hf", "--to-hf", "--load", tmp_path / "d", "--save", out, "--copy-tokenizer-files",
        "--tokenizer-dir", tmp_path / "c" / "tokenizer")
    assert raw_read(out / "model.safetensors") == raw
    assert (out / "tokenizer.json").read_text() == '{"fake": "tokenizer"}'
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_converter_refuses_bad_inputs(tmp_path):
    hf = tmp_path / "hf"
    cfg, tensors = make_llama(hf, layers=2)
    proc = run("convert_hf", "--from-hf", hf, "--save", tmp_path / "x", "--target-tp", 8, ok=False)
    assert "query groups" in proc.stderr
    assert not (tmp_path / "x" / "latest_checkpointed_iteration.txt").exists()
    bad = dict(tensors)
    bad["model.layers.0.mlp.up_proj.weight"] = bad["model.layers.0.mlp.up_proj.weight"][:, :-1].copy()
    from safetensors.numpy import save_file
    save_file(bad, str(hf / "model.safetensors"))
    proc = run("convert_hf", "--from-hf", hf, "--save", tmp_path / "y", ok=False)
    assert "model.layers.0.mlp.up_proj.weight" in proc.stderr and "shape" in proc.stderr
    bad = dict(tensors)
    bad["model.layers.0.extra.weight"] = np.zeros(3, np.float32)
    save_file(bad, str(hf / "model.safetensors"))
    proc = run("convert_hf", "--from-hf", hf, "--save", tmp_path / "z", ok=False)
    assert "model.layers.0.extra.weight" in proc.stderr
