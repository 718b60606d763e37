"""Shared helpers for the checkpoint interop tests (test_ckpt_*.py).

Everything here is an independent reference written from the facts in shared/specs/checkpoints.md:
tiny HF models made with numpy + safetensors, the tensor-parallel split and merge rules, the
project's checkpoint format read and written from Python, and float64 numpy forwards of GPT-2 and
Llama in both HF and Megatron-Core form.
"""
import json
import math
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

ROOT = Path(os.environ.get("LEANTRON_ROOT", Path(__file__).resolve().parents[2]))
BIN = Path(os.environ.get("LEANTRON_BIN", ROOT / "build" / "bin"))


def tool(name):
    path = BIN / name
    assert path.exists(), f"{path} not built"
    return str(path)


def run(name, *args, ok=True):
    proc = subprocess.run([tool(name), *map(str, args)], capture_output=True, text=True)
    if ok:
        assert proc.returncode == 0, f"{name} {args} failed:\n{proc.stderr}"
    else:
        assert proc.returncode != 0, f"{name} {args} unexpectedly succeeded"
    return proc


# ---------------------------------------------------------------- raw safetensors (bf16-capable)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U8": 1}


def raw_read(path):
    """name -> (dtype, shape, bytes); a minimal independent reader for dtypes numpy lacks."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], tuple(v["shape"]), data[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in header.items()}


def raw_write(path, tensors, metadata=None):
    """tensors: name -> (dtype, shape, bytes); reference-writer ordering and padding."""
    order = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]
    names = sorted(tensors, key=lambda k: (-order.index(tensors[k][0]), k))
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for k in names:
        dtype, shape, blob = tensors[k]
        header[k] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(tensors[k][2] for k in names))


def bf16_round(array):
    """float32 values rounded to the nearest bfloat16 (ties to even), still as float32."""
    bits = np.asarray(array, dtype=np.float32).view(np.uint32)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def to_bf16_bytes(array):
    bits = np.asarray(array, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded.tobytes()


# ---------------------------------------------------------------- tiny HF models
def make_gpt2(path, seed=0, layers=4, hidden=32, heads=4, vocab=300, positions=64, prefix="transformer.",
              shards=1, buffers=False):
    rng = np.random.default_rng(seed)
    h, f = hidden, 4 * hidden
    t = {}

    def r(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    p = prefix
    t[p + "wte.weight"] = r(vocab, h)
    t[p + "wpe.weight"] = r(positions, h)
    for i in range(layers):
        q = f"{p}h.{i}."
        t[q + "ln_1.weight"] = 1 + r(h)
        t[q + "ln_1.bias"] = r(h)
        t[q + "attn.c_attn.weight"] = r(h, 3 * h)
        t[q + "attn.c_attn.bias"] = r(3 * h)
        t[q + "attn.c_proj.weight"] = r(h, h)
        t[q + "attn.c_proj.bias"] = r(h)
        t[q + "ln_2.weight"] = 1 + r(h)
        t[q + "ln_2.bias"] = r(h)
        t[q + "mlp.c_fc.weight"] = r(h, f)
        t[q + "mlp.c_fc.bias"] = r(f)
        t[q + "mlp.c_proj.weight"] = r(f, h)
        t[q + "mlp.c_proj.bias"] = r(h)
        if buffers:
            t[q + "attn.bias"] = np.tril(np.ones((1, 1, positions, positions), np.float32))
    t[p + "ln_f.weight"] = 1 + r(h)
    t[p + "ln_f.bias"] = r(h)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": h, "n_layer": layers,
              "n_head": heads, "n_positions": positions, "n_ctx": positions, "vocab_size": vocab,
              "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "n_inner": None,
              "bos_token_id": vocab - 1, "eos_token_id": vocab - 1}
    write_hf(path, config, t, shards)
    return config, t


def make_llama(path, seed=0, layers=4, hidden=32, ffn=48, heads=8, kv_heads=4, vocab=300, positions=64,
               tied=False, shards=1, model_type="llama", qkv_bias=False, overrides=None):
    """A tiny LlamaForCausalLM; `model_type` "mistral" or "qwen2" (with `qkv_bias`) gives the
    other classes of the same decoder. `overrides` entries replace the written config.json's
    (None removes a key)."""
    rng = np.random.default_rng(seed)
    h, hn = hidden, hidden // heads
    t = {}

    def r(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    t["model.embed_tokens.weight"] = r(vocab, h)
    for i in range(layers):
        q = f"model.layers.{i}."
        t[q + "input_layernorm.weight"] = 1 + r(h)
        t[q + "self_attn.q_proj.weight"] = r(heads * hn, h)
        t[q + "self_attn.k_proj.weight"] = r(kv_heads * hn, h)
        t[q + "self_attn.v_proj.weight"] = r(kv_heads * hn, h)
        t[q + "self_attn.o_proj.weight"] = r(h, heads * hn)
        if qkv_bias:
            t[q + "self_attn.q_proj.bias"] = r(heads * hn)
            t[q + "self_attn.k_proj.bias"] = r(kv_heads * hn)
            t[q + "self_attn.v_proj.bias"] = r(kv_heads * hn)
        t[q + "post_attention_layernorm.weight"] = 1 + r(h)
        t[q + "mlp.gate_proj.weight"] = r(ffn, h)
        t[q + "mlp.up_proj.weight"] = r(ffn, h)
        t[q + "mlp.down_proj.weight"] = r(h, ffn)
    t["model.norm.weight"] = 1 + r(h)
    if not tied:
        t["lm_head.weight"] = r(vocab, h)
    architecture = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                    "qwen2": "Qwen2ForCausalLM"}[model_type]
    config = {"architectures": [architecture], "model_type": model_type, "hidden_size": h,
              "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": hn, "hidden_act": "silu",
              "max_position_embeddings": positions, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "vocab_size": vocab, "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2}
    if model_type == "llama":
        config.update({"attention_bias": False, "mlp_bias": False})
    elif model_type == "mistral":
        config["sliding_window"] = None
    else:
        config.update({"use_sliding_window": False, "sliding_window": None})
    for key, value in (overrides or {}).items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    write_hf(path, config, t, shards)
    return config, t


def write_hf(path, config, tensors, shards=1):
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(tensors)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in part}, str(path / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    total = sum(v.nbytes for v in tensors.values())
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def read_hf(path):
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if not index.exists():
        return load_file(str(path / "model.safetensors"))
    weight_map = json.loads(index.read_text())["weight_map"]
    out = {}
    for file in sorted(set(weight_map.values())):
        out.update(load_file(str(path / file)))
    assert set(out) == set(weight_map)
    return out


# ---------------------------------------------------------------- the checkpoint format, from Python
def padded_vocab(vocab, tp, divisor=128):
    multiple = divisor * tp
    return -(-vocab // multiple) * multiple


def split_rule(name, swiglu):
    """How Megatron splits a parameter over TP (spec §2)."""
    if name.endswith("word_embeddings.weight") or name == "output_layer.weight":
        return "vocab"
    if ".linear_qkv." in name:
        return "rows"
    if ".linear_fc1." in name:
        return "swiglu" if swiglu else "rows"
    if name.endswith("linear_proj.weight") or name.endswith("linear_fc2.weight"):
        return "cols"
    return "replicated"


def merge(parts, rule):
    if rule == "replicated":
        for p in parts[1:]:
            assert np.array_equal(p, parts[0])
        return parts[0]
    if rule == "cols":
        return np.concatenate(parts, axis=1)
    if rule == "swiglu":
        halves = [np.split(p, 2, axis=0) for p in parts]
        return np.concatenate([h[0] for h in halves] + [h[1] for h in halves], axis=0)
    return np.concatenate(parts, axis=0)


def split(full, rule, tp):
    if rule == "replicated":
        return [full] * tp
    if rule == "cols":
        return np.split(full, tp, axis=1)
    if rule == "swiglu":
        gate, up = np.split(full, 2, axis=0)
        return [np.concatenate([g, u]) for g, u in zip(np.split(gate, tp), np.split(up, tp))]
    return np.split(full, tp, axis=0)


def shard_dir_name(tp_rank, pp_rank, pp):
    return f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def stage_of(name, layers, pp, vpp, first=0, last=0):
    """Pipeline stage holding `name`. `first`/`last`: Megatron-Core's
    --decoder-first/last-pipeline-num-layers (0 = unset; VPP 1); the other stages share the rest."""
    if name.startswith("decoder.layers."):
        layer = int(name.split(".")[2])
        if first or last:
            others = pp - bool(first) - bool(last)
            per = (layers - first - last) // others if others else 0
            if first and layer < first:
                return 0
            if last and layer >= layers - last:
                return pp - 1
            return (1 if first else 0) + (layer - first) // per
        return (layer // (layers // (pp * vpp))) % pp
    if name.startswith("embedding."):
        return 0
    return pp - 1


def read_ours(path, iteration=None):
    """Merges a checkpoint of any layout into full tensors (padded vocabulary rows included)."""
    path = Path(path)
    if iteration is None:
        iteration = int((path / "latest_checkpointed_iteration.txt").read_text())
    it_dir = path / f"iter_{iteration:07d}"
    meta = json.loads((it_dir / "metadata.json").read_text())
    par = meta["parallel"]
    tp, pp = par["tensor_model_parallel_size"], par["pipeline_model_parallel_size"]
    swiglu = meta["model"]["activation"] == "swiglu"
    kinds = {"": "model.safetensors"}
    if meta["optimizer"] is not None:
        kinds.update({k + ".": "optimizer.safetensors" for k in ("main_param", "exp_avg", "exp_avg_sq")})
    out = {k: {} for k in kinds}
    for p in range(pp):
        files = {f: [load_file(str(it_dir / shard_dir_name(t, p, pp) / f)) for t in range(tp)]
                 for f in set(kinds.values())}
        for kind, f in kinds.items():
            for name in files[f][0]:
                if kind and not name.startswith(kind):
                    continue
                param = name[len(kind):]
                merged = merge([files[f][t][name] for t in range(tp)], split_rule(param, swiglu))
                if param in out[kind]:  # The tied copy on the last stage must equal the original.
                    assert np.array_equal(out[kind][param], merged)
                out[kind][param] = merged
    return meta, out


def write_ours(path, model_json, tp, pp, vpp, full, optimizer, iteration, step, first=0, last=0):
    """Writes the documented checkpoint format from Python (the C++ side must load it); `first` /
    `last` give an uneven pipeline split (Megatron's decoder_first/last_pipeline_num_layers)."""
    path = Path(path)
    it_dir = path / f"iter_{iteration:07d}"
    layers = model_json["num_layers"]
    swiglu = model_json["activation"] == "swiglu"
    tied = not model_json["untie_embeddings_and_output_weights"]
    names = list(full)
    if tied and pp > 1:
        names.append("output_layer.weight")
    for p in range(pp):
        for t in range(tp):
            d = it_dir / shard_dir_name(t, p, pp)
            d.mkdir(parents=True, exist_ok=True)
            model, opt = {}, {}
            for name in names:
                if stage_of(name, layers, pp, vpp, first, last) != p:
                    continue
                src = "embedding.word_embeddings.weight" if name not in full else name
                rule = split_rule(name, swiglu)
                model[name] = np.ascontiguousarray(split(full[src], rule, tp)[t])
                for kind in ("main_param", "exp_avg", "exp_avg_sq"):
                    opt[f"{kind}.{name}"] = np.ascontiguousarray(split(optimizer[kind][src], rule, tp)[t])
            save_file(model, str(d / "model.safetensors"), metadata={"format": "pt"})
            save_file(opt, str(d / "optimizer.safetensors"), metadata={"format": "pt"})
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "virtual_pipeline_model_parallel_size": vpp}
    if first:
        parallel["decoder_first_pipeline_num_layers"] = first
    if last:
        parallel["decoder_last_pipeline_num_layers"] = last
    meta = {"format": "leantron-checkpoint", "format_version": 1, "iteration": iteration,
            "consumed_samples": 12345, "model": model_json, "parallel": parallel,
            "optimizer": {"type": "adam", "step": step}, "args": {"lr": 3e-4, "note": "from python"}}
    (it_dir / "metadata.json").write_text(json.dumps(meta, indent=1))
    (path / "latest_checkpointed_iteration.txt").write_text(str(iteration))


# ---------------------------------------------------------------- float64 forwards
def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _attention(q, k, v):
    """q: [heads, s, hn]; k, v: [heads, s, hn] (already repeated for GQA)."""
    s = q.shape[1]
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    return scores @ v


def rope_inverse_frequencies(cfg):
    """The rotary inverse frequencies a Llama-family config.json asks for, float64: theta from
    rope_theta (transformers 4) or rope_parameters (5), and Llama 3.1's "llama3" scaling written
    out from HF's definition (wavelengths above original/low_freq_factor divided by the factor,
    below original/high_freq_factor kept, linear in original/wavelength between)."""
    params = cfg.get("rope_parameters") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    hn = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    inv = 1.0 / theta ** (np.arange(0, hn, 2, dtype=np.float64) / hn)
    scaling = cfg.get("rope_scaling") or params
    if scaling.get("rope_type", scaling.get("type", "default")) != "llama3":
        return inv
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    out = []
    for f in inv:
        wavelength = 2 * math.pi / f
        if wavelength < original / high:
            out.append(f)
        elif wavelength > original / low:
            out.append(f / factor)
        else:
            t = (original / wavelength - low) / (high - low)
            out.append((1 - t) * f / factor + t * f)
    return np.array(out)


def _rope(x, theta, inv=None):
    """Rotate-half RoPE on [heads, s, hn]; `inv`: the inverse frequencies (default: unscaled)."""
    hn, s = x.shape[-1], x.shape[1]
    if inv is None:
        inv = 1.0 / theta ** (np.arange(0, hn, 2, dtype=np.float64) / hn)
    ang = np.outer(np.arange(s), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    x1, x2 = x[..., :hn // 2], x[..., hn // 2:]
    return x * cos + np.concatenate([-x2, x1], -1) * sin


def gpt2_forward_hf(t, cfg, ids, prefix="transformer."):
    g = {k: v.astype(np.float64) for k, v in t.items()}
    p, h, nh = prefix, cfg["n_embd"], cfg["n_head"]
    hn, s = h // nh, len(ids)
    x = g[p + "wte.weight"][ids] + g[p + "wpe.weight"][np.arange(s)]
    for i in range(cfg["n_layer"]):
        q = f"{p}h.{i}."
        y = _layer_norm(x, g[q + "ln_1.weight"], g[q + "ln_1.bias"], 1e-5)
        qkv = y @ g[q + "attn.c_attn.weight"] + g[q + "attn.c_attn.bias"]
        qh, kh, vh = (a.reshape(s, nh, hn).transpose(1, 0, 2) for a in np.split(qkv, 3, axis=-1))
        ctx = _attention(qh, kh, vh).transpose(1, 0, 2).reshape(s, h)
        x = x + ctx @ g[q + "attn.c_proj.weight"] + g[q + "attn.c_proj.bias"]
        y = _layer_norm(x, g[q + "ln_2.weight"], g[q + "ln_2.bias"], 1e-5)
        y = _gelu_tanh(y @ g[q + "mlp.c_fc.weight"] + g[q + "mlp.c_fc.bias"])
        x = x + y @ g[q + "mlp.c_proj.weight"] + g[q + "mlp.c_proj.bias"]
    x = _layer_norm(x, g[p + "ln_f.weight"], g[p + "ln_f.bias"], 1e-5)
    return x @ g[p + "wte.weight"].T


def llama_forward_hf(t, cfg, ids):
    """LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM (q/k/v biases when the tensors
    have them), rope scaling as config.json asks."""
    g = {k: v.astype(np.float64) for k, v in t.items()}
    h, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hn, s, eps = cfg["head_dim"], len(ids), cfg["rms_norm_eps"]
    inv = rope_inverse_frequencies(cfg)
    x = g["model.embed_tokens.weight"][ids]

    def proj(y, name, heads):
        out = y @ g[name + ".weight"].T
        if name + ".bias" in g:
            out = out + g[name + ".bias"]
        return out.reshape(s, heads, hn).transpose(1, 0, 2)

    for i in range(cfg["num_hidden_layers"]):
        q = f"model.layers.{i}."
        y = _rms_norm(x, g[q + "input_layernorm.weight"], eps)
        qh = proj(y, q + "self_attn.q_proj", nh)
        kh = proj(y, q + "self_attn.k_proj", nkv)
        vh = proj(y, q + "self_attn.v_proj", nkv)
        qh, kh = _rope(qh, None, inv), _rope(kh, None, inv)
        rep = nh // nkv
        ctx = _attention(qh, np.repeat(kh, rep, 0), np.repeat(vh, rep, 0)).transpose(1, 0, 2).reshape(s, nh * hn)
        x = x + ctx @ g[q + "self_attn.o_proj.weight"].T
        y = _rms_norm(x, g[q + "post_attention_layernorm.weight"], eps)
        gate, up = y @ g[q + "mlp.gate_proj.weight"].T, y @ g[q + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ g[q + "mlp.down_proj.weight"].T
    x = _rms_norm(x, g["model.norm.weight"], eps)
    head = g["lm_head.weight"] if "lm_head.weight" in g else g["model.embed_tokens.weight"]
    return x @ head.T


def megatron_forward(t, model, ids):
    """Megatron-Core GPT forward from merged checkpoint tensors (grouped QKV, [gate; up] fc1,
    padded vocabulary sliced off the logits)."""
    g = {k: v.astype(np.float64) for k, v in t.items()}
    h, nh, ng = model["hidden_size"], model["num_attention_heads"], model["num_query_groups"]
    hn, s, eps = model["kv_channels"], len(ids), model["norm_epsilon"]
    rms = model["normalization"] == "RMSNorm"
    rope = model["position_embedding_type"] == "rope"

    def norm(x, prefix):
        if rms:
            return _rms_norm(x, g[prefix + ".weight"], eps)
        return _layer_norm(x, g[prefix + ".weight"], g[prefix + ".bias"], eps)

    def linear(x, prefix):
        y = x @ g[prefix + ".weight"].T
        return y + g[prefix + ".bias"] if prefix + ".bias" in g else y

    x = g["embedding.word_embeddings.weight"][ids]
    if not rope:
        x = x + g["embedding.position_embeddings.weight"][np.arange(s)]
    per_group = nh // ng
    for i in range(model["num_layers"]):
        p = f"decoder.layers.{i}."
        y = norm(x, p + "input_layernorm")
        qkv = linear(y, p + "self_attention.linear_qkv").reshape(s, ng, per_group + 2, hn)
        qh = qkv[:, :, :per_group].reshape(s, nh, hn).transpose(1, 0, 2)
        kh = qkv[:, :, per_group].transpose(1, 0, 2)
        vh = qkv[:, :, per_group + 1].transpose(1, 0, 2)
        if rope:
            qh, kh = _rope(qh, model["rotary_base"]), _rope(kh, model["rotary_base"])
        kh, vh = np.repeat(kh, per_group, 0), np.repeat(vh, per_group, 0)
        ctx = _attention(qh, kh, vh).transpose(1, 0, 2).reshape(s, nh * hn)
        x = x + linear(ctx, p + "self_attention.linear_proj")
        y = linear(norm(x, p + "pre_mlp_layernorm"), p + "mlp.linear_fc1")
        if model["activation"] == "swiglu":
            gate, up = np.split(y, 2, axis=-1)
            y = gate / (1 + np.exp(-gate)) * up
        else:
            y = _gelu_tanh(y)
        x = x + linear(y, p + "mlp.linear_fc2")
    x = norm(x, "decoder.final_layernorm")
    head = g.get("output_layer.weight", g["embedding.word_embeddings.weight"])
    return (x @ head.T)[:, :model["vocab_size"]]
