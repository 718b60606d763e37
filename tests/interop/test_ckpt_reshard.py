"""Optimizer state survives every reshard bitwise; checkpoints written from Python in the documented
format load in the C++ tools; a model converted from HF and resharded computes the same logits
(float64 numpy forward, HF form vs Megatron-Core form); `inspect checkpoint` reports the same
norms for every layout."""
import json
import re

import numpy as np
import pytest

from safetensors.numpy import load_file

from ckpt_testlib import (gpt2_forward_hf, llama_forward_hf, make_gpt2, make_llama, megatron_forward,
                          padded_vocab, read_hf, read_ours, run, shard_dir_name, stage_of, write_ours,
                          bf16_round)

GPT2_MODEL = {"num_layers": 4, "hidden_size": 32, "ffn_hidden_size": 128, "num_attention_heads": 4,
              "num_query_groups": 4, "kv_channels": 8, "vocab_size": 300, "max_position_embeddings": 64,
              "make_vocab_size_divisible_by": 128, "normalization": "LayerNorm", "norm_epsilon": 1e-5,
              "activation": "gelu_tanh", "position_embedding_type": "learned_absolute",
              "rotary_base": 10000, "add_bias_linear": True, "add_qkv_bias": True,
              "untie_embeddings_and_output_weights": False, "params_dtype": "F32"}
LLAMA_MODEL = dict(GPT2_MODEL, ffn_hidden_size=48, num_attention_heads=8, num_query_groups=4, kv_channels=4,
                   normalization="RMSNorm", activation="swiglu", position_embedding_type="rope",
                   add_bias_linear=False, add_qkv_bias=False, untie_embeddings_and_output_weights=True)


def full_shapes(m, tp):
    """Megatron-Core names and full shapes (spec §2), vocabulary padded for `tp`."""
    h, f, v = m["hidden_size"], m["ffn_hidden_size"], padded_vocab(m["vocab_size"], tp)
    qkv = (m["num_attention_heads"] + 2 * m["num_query_groups"]) * m["kv_channels"]
    swiglu, bias, ln = m["activation"] == "swiglu", m["add_bias_linear"], m["normalization"] == "LayerNorm"
    s = {"embedding.word_embeddings.weight": (v, h)}
    if m["position_embedding_type"] == "learned_absolute":
        s["embedding.position_embeddings.weight"] = (m["max_position_embeddings"], h)
    for i in range(m["num_layers"]):
        p = f"decoder.layers.{i}."
        s[p + "input_layernorm.weight"] = (h,)
        s[p + "self_attention.linear_qkv.weight"] = (qkv, h)
        s[p + "self_attention.linear_proj.weight"] = (h, m["num_attention_heads"] * m["kv_channels"])
        s[p + "pre_mlp_layernorm.weight"] = (h,)
        s[p + "mlp.linear_fc1.weight"] = ((2 if swiglu else 1) * f, h)
        s[p + "mlp.linear_fc2.weight"] = (h, f)
        if ln:
            s[p + "input_layernorm.bias"] = s[p + "pre_mlp_layernorm.bias"] = (h,)
        if m["add_qkv_bias"]:
            s[p + "self_attention.linear_qkv.bias"] = (qkv,)
        if bias:
            s[p + "self_attention.linear_proj.bias"] = s[p + "mlp.linear_fc2.bias"] = (h,)
            s[p + "mlp.linear_fc1.bias"] = ((2 if swiglu else 1) * f,)
    s["decoder.final_layernorm.weight"] = (h,)
    if ln:
        s["decoder.final_layernorm.bias"] = (h,)
    if m["untie_embeddings_and_output_weights"]:
        s["output_layer.weight"] = (v, h)
    return s


def random_state(m, tp, seed):
    rng = np.random.default_rng(seed)
    vocab = m["vocab_size"]

    def tensor(shape, name):
        a = rng.standard_normal(shape).astype(np.float32)
        if name.endswith("word_embeddings.weight") or name == "output_layer.weight":
            a[vocab:] = 0  # Padding rows: a reshard that changes the padding zero-fills them.
        return a

    shapes = full_shapes(m, tp)
    opt = {kind: {k: tensor(v, k) for k, v in shapes.items()} for kind in ("main_param", "exp_avg", "exp_avg_sq")}
    # The model weights are the fp32 main weights rounded to bf16, as in a bf16 run: close enough
    # for a verified load, different enough that a swap of the two would show.
    params = {k: bf16_round(v) for k, v in opt["main_param"].items()}
    return params, opt


def rows(a, n):
    return a[:n] if a.ndim == 2 else a


def assert_stages(path, model, tp, pp, vpp, first=0, last=0):
    """Every rank's model file holds exactly the tensors stage_of puts on its pipeline stage."""
    it_dir = path / f"iter_{int((path / 'latest_checkpointed_iteration.txt').read_text()):07d}"
    names = list(full_shapes(model, tp))
    if pp > 1 and not model["untie_embeddings_and_output_weights"]:
        names.append("output_layer.weight")
    for p in range(pp):
        want = {n for n in names if stage_of(n, model["num_layers"], pp, vpp, first, last) == p}
        for t in range(tp):
            got = set(load_file(str(it_dir / shard_dir_name(t, p, pp) / "model.safetensors")))
            assert got == want, (p, t, sorted(got ^ want))


@pytest.mark.parametrize("model", [GPT2_MODEL, LLAMA_MODEL], ids=["gpt2", "llama"])
def test_optimizer_state_survives_every_reshard(tmp_path, model):
    params, opt = random_state(model, 2, seed=7)
    src = tmp_path / "py_tp2pp2"
    write_ours(src, model, 2, 2, 1, params, opt, iteration=250, step=250)
    prev = src
    # (tp, pp, vpp, first, last): the last two are --target-decoder-first/last-pipeline-num-layers
    # (0: not given, an even split).
    for tp, pp, vpp, first, last in [(4, 1, 1, 0, 0), (1, 4, 1, 0, 0), (2, 3, 1, 0, 2),
                                     (2, 2, 2, 0, 0), (1, 3, 1, 1, 1), (1, 1, 1, 0, 0)]:
        nxt = tmp_path / f"tp{tp}pp{pp}vpp{vpp}f{first}l{last}"
        uneven = []
        if first:
            uneven += ["--target-decoder-first-pipeline-num-layers", first]
        if last:
            uneven += ["--target-decoder-last-pipeline-num-layers", last]
        run("reshard_checkpoint", "--load", prev, "--save", nxt, "--target-tp", tp, "--target-pp", pp,
            "--target-vpp", vpp, *uneven)
        meta, ours = read_ours(nxt)
        assert meta["iteration"] == 250 and meta["optimizer"]["step"] == 250
        assert meta["consumed_samples"] == 12345 and meta["args"]["note"] == "from python"
        assert meta["parallel"]["virtual_pipeline_model_parallel_size"] == vpp
        assert meta["parallel"].get("decoder_first_pipeline_num_layers", 0) == first
        assert meta["parallel"].get("decoder_last_pipeline_num_layers", 0) == last
        assert_stages(nxt, model, tp, pp, vpp, first, last)
        vp = padded_vocab(model["vocab_size"], tp)
        for kind, expected in [("", params)] + [(k + ".", opt[k]) for k in opt]:
            for name, array in expected.items():
                got = ours[kind][name]
                if name.endswith("word_embeddings.weight") or name == "output_layer.weight":
                    assert got.shape == (vp, array.shape[1])
                    n = min(vp, array.shape[0])
                    assert np.array_equal(got[:n], array[:n]), (kind, name)
                    assert not got[n:].any()
                else:
                    assert np.array_equal(got, array), (kind, name)
        prev = nxt


def test_impossible_layouts_are_refused(tmp_path):
    params, opt = random_state(LLAMA_MODEL, 1, seed=3)
    write_ours(tmp_path / "src", LLAMA_MODEL, 1, 1, 1, params, opt, iteration=1, step=1)
    cases = [((8, 1, 1), "query groups"), ((1, 3, 1), "layers"), ((1, 1, 2), "PP > 1"),
             ((3, 1, 1), "not divisible by TP 3")]
    for (tp, pp, vpp), message in cases:
        proc = run("reshard_checkpoint", "--load", tmp_path / "src", "--save", tmp_path / "dst",
                   "--target-tp", tp, "--target-pp", pp, "--target-vpp", vpp, ok=False)
        assert message in proc.stderr, proc.stderr
        assert not (tmp_path / "dst").exists()
    proc = run("reshard_checkpoint", "--load", tmp_path / "src", "--save", tmp_path / "dst",
               "--target-tp", 1, "--target-pp", 1, "--iteration", 2, ok=False)
    assert "iter_0000002" in proc.stderr
    # Uneven pipeline splits (4 layers): a remainder that does not divide, PP 1, VPP.
    for pp, vpp, flag, n, message in [
            (3, 1, "last", 1, "leave 3 layers, which do not split evenly over the other 2"),
            (1, 1, "first", 2, "decoder_first_pipeline_num_layers 2 needs PP > 1"),
            (2, 2, "first", 1, "does not work with virtual pipeline chunks")]:
        proc = run("reshard_checkpoint", "--load", tmp_path / "src", "--save", tmp_path / "dst",
                   "--target-tp", 1, "--target-pp", pp, "--target-vpp", vpp,
                   f"--target-decoder-{flag}-pipeline-num-layers", n, ok=False)
        assert message in proc.stderr, proc.stderr
        assert not (tmp_path / "dst").exists()


def test_uneven_checkpoint_written_from_python_loads(tmp_path):
    """The documented keys, written by Python (layers placed by stage_of), load in the C++ tools."""
    params, opt = random_state(GPT2_MODEL, 2, seed=11)
    write_ours(tmp_path / "src", GPT2_MODEL, 2, 3, 1, params, opt, iteration=7, step=7, first=2)
    assert_stages(tmp_path / "src", GPT2_MODEL, 2, 3, 1, first=2)
    out = run("inspect", "checkpoint", tmp_path / "src").stdout
    assert "decoder_first_pipeline_num_layers 2" in out
    assert "stage 0: layers [0, 2)" in out and "stage 1: layers [2, 3)" in out
    assert "stage 2: layers [3, 4)" in out
    run("reshard_checkpoint", "--load", tmp_path / "src", "--save", tmp_path / "dst",
        "--target-tp", 1, "--target-pp", 2, "--target-decoder-last-pipeline-num-layers", 1)
    assert_stages(tmp_path / "dst", GPT2_MODEL, 1, 2, 1, last=1)
    _, ours = read_ours(tmp_path / "dst")
    for kind, expected in [("", params)] + [(k + ".", opt[k]) for k in opt]:
        for name, array in expected.items():
            got = ours[kind][name]
            assert np.array_equal(rows(got, GPT2_MODEL["vocab_size"]),
                                  rows(array, GPT2_MODEL["vocab_size"])), (kind, name)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_resharded_model_computes_the_same_logits(tmp_path, arch):
    hf = tmp_path / "hf"
    if arch == "gpt2":
        cfg, tensors = make_gpt2(hf)
    else:
        cfg, tensors = make_llama(hf)
    run("convert_hf", "--from-hf", hf, "--save", tmp_path / "a", "--target-tp", 2, "--target-pp", 2)
    run("reshard_checkpoint", "--load", tmp_path / "a", "--save", tmp_path / "b", "--target-tp", 4,
        "--target-pp", 1)
    run("reshard_checkpoint", "--load", tmp_path / "b", "--save", tmp_path / "c", "--target-tp", 1,
        "--target-pp", 4)
    # Imported straight into an uneven pipeline split (4 layers: 2 on the first stage, 1 + 1).
    run("convert_hf", "--from-hf", hf, "--save", tmp_path / "d", "--target-tp", 2, "--target-pp", 3,
        "--target-decoder-first-pipeline-num-layers", 2)
    meta, _ = read_ours(tmp_path / "d")
    assert meta["parallel"]["decoder_first_pipeline_num_layers"] == 2
    ids = np.random.default_rng(5).integers(0, 300, 17)
    reference = gpt2_forward_hf(tensors, cfg, ids) if arch == "gpt2" else llama_forward_hf(tensors, cfg, ids)
    for path in ("a", "b", "c", "d"):
        meta, ours = read_ours(tmp_path / path)
        logits = megatron_forward(ours[""], meta["model"], ids)
        assert logits.shape == reference.shape
        np.testing.assert_allclose(logits, reference, rtol=1e-10, atol=1e-10)
    # A wrong layout would show: swapping two query groups' rows changes the logits.
    meta, ours = read_ours(tmp_path / "c")
    name = "decoder.layers.0.self_attention.linear_qkv.weight"
    broken = dict(ours[""])
    broken[name] = np.roll(ours[""][name], ours[""][name].shape[0] // 2, axis=0)
    assert not np.allclose(megatron_forward(broken, meta["model"], ids), reference, atol=1e-6)


def test_inspect_reports_layout_and_layout_independent_norms(tmp_path):
    hf = tmp_path / "hf"
    make_llama(hf, layers=4)
    run("convert_hf", "--from-hf", hf, "--save", tmp_path / "a", "--target-tp", 2, "--target-pp", 2)
    run("reshard_checkpoint", "--load", tmp_path / "a", "--save", tmp_path / "b", "--target-tp", 1,
        "--target-pp", 2, "--target-vpp", 2)
    outputs = {}
    for path in ("a", "b"):
        out = run("inspect", "checkpoint", tmp_path / path).stdout
        assert "LlamaForCausalLM" in out  # args carry the origin
        assert "mp_rank_00_001/model.safetensors" in out
        outputs[path] = dict(re.findall(r"^  (\S+)\s.*norm (\S+)$", out, re.M))
    assert "stage 1: layers [1, 2) [3, 4)" in run("inspect", "checkpoint", tmp_path / "b").stdout
    assert outputs["a"] and outputs["a"] == outputs["b"]
    t = read_hf(hf)
    expected = float(np.sqrt((t["model.layers.2.mlp.gate_proj.weight"].astype(np.float64) ** 2).sum()
                             + (t["model.layers.2.mlp.up_proj.weight"].astype(np.float64) ** 2).sum()))
    assert float(outputs["a"]["decoder.layers.2.mlp.linear_fc1.weight"]) == pytest.approx(expected, rel=1e-5)
