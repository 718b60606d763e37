"""Megatron-LM checkpoints made from Python, without torch or Megatron, for the CI tests of the C++
readers (the real ones, made by Megatron-LM itself, are testdata/megatron; see its README).

An independent implementation, from Megatron-LM's checkpointing.py, distrib_optimizer.py,
param_layout.py and dist_checkpointing/, of what a run saves:

- `--ckpt-format torch`: per (tp, pp) rank mp_rank_TT[_PPP]/model_optim_rng.pt holding `args`
  (an argparse.Namespace), `checkpoint_version` 3.0, `iteration`, `model` / `model<v>` (chunk-local
  layer names, `_extra_state` entries), `optimizer`, `opt_param_scheduler`, `rng_state`; with the
  distributed optimizer the model tensors are views into one parameter buffer and distrib_optim.pt
  holds the coalesced fp32 buffers (reverse parameter order, 64-element alignment, buckets);
- `--ckpt-format torch_dist`: .metadata + __R_0.distcp with layers stacked along a leading
  dimension, TransformerEngine's fused-norm names, the optimizer by parameter name
  (`optimizer.state.fp32_param.<key>`, ...) or in the distributed optimizer's bucket space, and the
  non-tensor state in a `common_state` item.
"""
import argparse
import collections
import enum
import math

import numpy as np

from ckpt_testlib import padded_vocab, split, split_rule, shard_dir_name
from torch_format_writer import (DcpTensor, Storage, Tensor, _export, _module, bf16_bits, torch_dumps,
                                 torch_save)

LAYER_ORDER = ["input_layernorm.weight", "input_layernorm.bias", "self_attention.linear_proj.weight",
               "self_attention.linear_proj.bias", "self_attention.linear_qkv.weight",
               "self_attention.linear_qkv.bias", "pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias",
               "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias"]
LINEARS = ("self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2")
TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
            "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias",
            "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
            "pre_mlp_layernorm.bias": "mlp.linear_fc1.layer_norm_bias"}
OLD_NAMES = {"input_layernorm.": "input_layernorm.", "self_attention.linear_qkv.": "self_attention.query_key_value.",
             "self_attention.linear_proj.": "self_attention.dense.", "pre_mlp_layernorm.": "post_attention_layernorm.",
             "mlp.linear_fc1.": "mlp.dense_h_to_4h.", "mlp.linear_fc2.": "mlp.dense_4h_to_h."}


class AttnBackend(enum.Enum):  # stands in for megatron.core.transformer.enums.AttnBackend
    flash = 1
    fused = 2
    unfused = 3
    local = 4
    auto = 5


_export("megatron.core.transformer.enums", AttnBackend)
for _parent in ("megatron", "megatron.core", "megatron.core.transformer"):
    _module(_parent)


def torch_dtype(name):
    return getattr(_module("torch"), {"BF16": "bfloat16", "F32": "float32", "F16": "float16"}[name])


# ---------------------------------------------------------------- layout
def chunk_of(name, layers, pp, vpp):
    """(pipeline stage, virtual chunk) holding a canonical parameter (even split)."""
    if name.startswith("decoder.layers."):
        c = int(name.split(".")[2]) // (layers // (pp * vpp))
        return c % pp, c // pp
    if name.startswith("embedding."):
        return 0, 0
    return pp - 1, vpp - 1


def chunk_layers(layers, pp, vpp, p, v):
    per = layers // (pp * vpp)
    first = (v * pp + p) * per
    return first, first + per


def stage_names(model, pp):
    """Canonical names a run stores: the tied output copy on the last stage with PP > 1."""
    from test_ckpt_reshard import full_shapes
    names = list(full_shapes(model, 1))
    if pp > 1 and not model["untie_embeddings_and_output_weights"]:
        names.append("output_layer.weight")
    return names


def megatron_order(names, layers, pp, vpp, p, v):
    """A chunk's parameters in Megatron's named_parameters() order (linear_proj before linear_qkv)."""
    out = [n for n in ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight")
           if n in names and chunk_of(n, layers, pp, vpp) == (p, v)]
    first, last = chunk_layers(layers, pp, vpp, p, v)
    for i in range(first, last):
        out += [f"decoder.layers.{i}.{s}" for s in LAYER_ORDER if f"decoder.layers.{i}.{s}" in names]
    out += [n for n in ("decoder.final_layernorm.weight", "decoder.final_layernorm.bias", "output_layer.weight")
            if n in names and chunk_of(n, layers, pp, vpp) == (p, v)]
    return out


def buffer_layout(order, numel, shared, bucket_size=None, dp=1):
    """Megatron's distributed-optimizer buffer: name -> (world offset in the coalesced checkpoint
    tensor, start in the padded buffer, bucket); and the buckets' unpadded sizes."""
    pad = lambda x, d: -(-x // d) * d  # noqa: E731
    end_divisor = math.lcm(dp, 128)
    starts, bucket_of, unpadded, bucket_starts = {}, {}, [], []
    start = bucket_start = end = 0
    bucket, has = 0, False

    def finalize(at):
        nonlocal bucket_start, bucket, has
        unpadded.append(at - bucket_start)
        bucket_starts.append(bucket_start)
        bucket_start = pad(at, end_divisor)
        bucket += 1
        has = False

    for name in reversed(order):
        start = pad(start, 64)
        if shared(name) and has:
            finalize(start)
            start = bucket_start
        end = start + numel[name]
        starts[name], bucket_of[name], has = start, bucket, True
        if (bucket_size is not None and end - bucket_start >= bucket_size) or shared(name):
            finalize(end)
            start = bucket_start
        else:
            start = end
    if has:
        finalize(end)
    before = [sum(unpadded[:b]) for b in range(len(unpadded))]
    world = {n: before[bucket_of[n]] + starts[n] - bucket_starts[bucket_of[n]] for n in order}
    padded_total = bucket_start
    return world, starts, bucket_of, unpadded, padded_total


def local_name(name, layers, pp, vpp, style="mcore"):
    """The legacy state-dict name of a canonical parameter (chunk-local layer index)."""
    if not name.startswith("decoder.layers."):
        if style == "legacy":
            return {"embedding.word_embeddings.weight": "language_model.embedding.word_embeddings.weight",
                    "embedding.position_embeddings.weight": "language_model.embedding.position_embeddings.weight",
                    "decoder.final_layernorm.weight": "language_model.encoder.final_layernorm.weight",
                    "decoder.final_layernorm.bias": "language_model.encoder.final_layernorm.bias",
                    "output_layer.weight": "language_model.output_layer.weight"}[name]
        return name
    i = int(name.split(".")[2])
    suffix = name.split(".", 3)[3]
    p, v = chunk_of(name, layers, pp, vpp)
    j = i - chunk_layers(layers, pp, vpp, p, v)[0]
    if style == "te":
        suffix = TE_NAMES.get(suffix, suffix)
    if style == "legacy":
        for new, old in OLD_NAMES.items():
            if suffix.startswith(new):
                suffix = old + suffix[len(new):]
        return f"language_model.encoder.layers.{j}.{suffix}"
    return f"decoder.layers.{j}.{suffix}"


# ---------------------------------------------------------------- the saved arguments
def megatron_args(model, tp, pp, vpp, dist_opt, bf16, iteration, dp=1, tokenizer="NullTokenizer", **extra):
    m = model
    ns = argparse.Namespace(
        num_layers=m["num_layers"], hidden_size=m["hidden_size"], ffn_hidden_size=m["ffn_hidden_size"],
        num_attention_heads=m["num_attention_heads"],
        group_query_attention=m["num_query_groups"] != m["num_attention_heads"],
        num_query_groups=m["num_query_groups"], kv_channels=m["kv_channels"],
        max_position_embeddings=m["max_position_embeddings"], seq_length=64,
        make_vocab_size_divisible_by=m["make_vocab_size_divisible_by"],
        padded_vocab_size=padded_vocab(m["vocab_size"], tp, m["make_vocab_size_divisible_by"]),
        vocab_size=m["vocab_size"] if tokenizer == "NullTokenizer" else None, tokenizer_type=tokenizer,
        normalization=m["normalization"], norm_epsilon=m["norm_epsilon"], swiglu=m["activation"] == "swiglu",
        openai_gelu=m["activation"] == "gelu_tanh", position_embedding_type=m["position_embedding_type"],
        rotary_base=int(m["rotary_base"]), rotary_percent=1.0, add_bias_linear=m["add_bias_linear"],
        add_qkv_bias=m["add_qkv_bias"], untie_embeddings_and_output_weights=m["untie_embeddings_and_output_weights"],
        bf16=bf16, fp16=False, params_dtype=torch_dtype("BF16" if bf16 else "F32"),
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, data_parallel_size=dp,
        context_parallel_size=1, world_size=tp * pp * dp, use_distributed_optimizer=dist_opt,
        overlap_grad_reduce=False, ddp_bucket_size=None, consumed_train_samples=iteration * 8,
        lr=3e-4, min_lr=3e-5, lr_decay_style="cosine", weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.95,
        adam_eps=1e-8, train_iters=100, global_batch_size=8, micro_batch_size=2, ckpt_format="torch",
        transformer_impl="local", attention_backend=AttnBackend.auto, iteration=iteration)
    for k, v in extra.items():
        setattr(ns, k, v)
    return ns


def rng_state():
    """A Megatron rng_state entry: Python, numpy, torch and CUDA generator states."""
    return [{"random_rng_state": (3, tuple(range(624)) + (624,), None),
             "np_rng_state": ("MT19937", np.arange(624, dtype=np.uint32), 624, 0, 0.0),
             "torch_rng_state": Tensor.from_numpy(np.zeros(5056, np.uint8)),
             "cuda_rng_state": Tensor.from_numpy(np.zeros(16, np.uint8)),
             "rng_tracker_states": {"model-parallel-rng": Tensor.from_numpy(np.ones(16, np.uint8))}}]


def param_groups(step, with_params=None):
    base = {"lr": 2.9e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.01, "amsgrad": False,
            "foreach": None, "maximize": False, "capturable": False, "differentiable": False, "fused": None,
            "decoupled_weight_decay": True, "lr_mult": 1.0, "is_expert_parallel": False, "default_config": True,
            "max_lr": 3e-4, "min_lr": 3e-5, "is_decoupled_lr": False}
    groups = [dict(base, wd_mult=1.0), dict(base, wd_mult=0.0)]
    for g, params in zip(groups, with_params or [None, None]):
        if params is not None:
            g["params"] = params
        if step is not None:
            g["step"] = step
    return groups


# ---------------------------------------------------------------- --ckpt-format torch
def write_megatron_torch(path, model, tp, pp, vpp, params, optimizer, iteration, step, dist_opt, bf16=True,
                         style="mcore", with_optimizer=True, extra_args=None):
    """params / optimizer: canonical full tensors (float32; vocabulary padded for `tp`), as
    test_ckpt_reshard.random_state makes them. bf16: params stored as BF16 (they must be
    bf16-exact), else F32 (then the main params are the params)."""
    layers, swiglu = model["num_layers"], model["activation"] == "swiglu"
    tied = not model["untie_embeddings_and_output_weights"]
    names = stage_names(model, pp)
    canonical = lambda n: "embedding.word_embeddings.weight" if n not in params else n  # noqa: E731
    pdtype = "BF16" if bf16 else "F32"
    it_dir = path / f"iter_{iteration:07d}"
    for p in range(pp):
        for t in range(tp):
            d = it_dir / shard_dir_name(t, p, pp)
            d.mkdir(parents=True, exist_ok=True)
            shard = {n: np.ascontiguousarray(split(params[canonical(n)], split_rule(n, swiglu), tp)[t])
                     for n in names if chunk_of(n, layers, pp, vpp)[0] == p}
            state = {"args": megatron_args(model, tp, pp, vpp, dist_opt, bf16, iteration, **(extra_args or {})),
                     "checkpoint_version": 3.0, "iteration": iteration}
            orders = [megatron_order(names, layers, pp, vpp, p, v) for v in range(vpp)]
            flat = {}
            for v, order in enumerate(orders):
                numel = {n: shard[n].size for n in order}
                shared = lambda n: tied and pp > 1 and (  # noqa: E731
                    (n == "embedding.word_embeddings.weight" and p == 0 and v == 0) or n == "output_layer.weight")
                world, starts, _, _, padded_total = buffer_layout(order, numel, shared)
                if dist_opt:  # model tensors are views into one parameter buffer
                    buf = np.zeros(padded_total, np.float32)
                    for n in order:
                        buf[starts[n]:starts[n] + numel[n]] = shard[n].ravel()
                    storage = Storage(bf16_bits(buf).tobytes() if bf16 else buf.tobytes(), pdtype, "cuda:0")
                    views = {n: Tensor(storage, shard[n].shape, starts[n]) for n in order}
                else:
                    views = {n: Tensor.from_numpy(shard[n], pdtype, "cuda:0") for n in order}
                sd = collections.OrderedDict()
                for k, n in enumerate(order):  # state_dict(): a module's params then its _extra_state
                    sd[local_name(n, layers, pp, vpp, style)] = views[n]
                    module = n.rsplit(".", 1)[0]
                    following = order[k + 1].rsplit(".", 1)[0] if k + 1 < len(order) else None
                    if style != "legacy" and following != module and (
                            module.endswith(LINEARS) or module == "output_layer"):
                        sd[local_name(n, layers, pp, vpp, style).rsplit(".", 1)[0] + "._extra_state"] = None
                if p == pp - 1 and v == vpp - 1 and style != "legacy" and "output_layer.weight" not in order:
                    sd["output_layer._extra_state"] = None
                state["model" if vpp == 1 else f"model{v}"] = sd
                flat[v] = (order, world, numel)
            if with_optimizer:
                opt_shard = {k: {n: np.ascontiguousarray(split(optimizer[k][canonical(n)], split_rule(n, swiglu), tp)[t])
                                 for n in shard} for k in optimizer}
                if dist_opt:
                    state["optimizer"] = {"optimizer": {"param_groups": param_groups(step)}}
                    dist = {"buckets_coalesced": True}
                    for v, (order, world, numel) in flat.items():
                        total = max(world[n] + numel[n] for n in order)
                        tensors = {}
                        for key, kind in (("param", "main_param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
                            buf = np.zeros(total, np.float32)
                            for n in order:
                                buf[world[n]:world[n] + numel[n]] = opt_shard[kind][n].ravel()
                            tensors[key] = Tensor.from_numpy(buf)
                        tensors["numel_unpadded"] = total
                        dist[v] = {(torch_dtype(pdtype), torch_dtype("F32")): tensors}
                    torch_save(dist, d / "distrib_optim.pt")
                else:
                    decay, no_decay = [], []
                    for order in orders:
                        for n in order:
                            (no_decay if shard[n].ndim == 1 or n.endswith(".bias") else decay).append(n)
                    index = {n: i for i, n in enumerate(decay + no_decay)}
                    adam = {"state": {index[n]: {"step": Tensor.from_numpy(np.array(float(step), np.float32)),
                                                 "exp_avg": Tensor.from_numpy(opt_shard["exp_avg"][n], "F32", "cuda:0"),
                                                 "exp_avg_sq": Tensor.from_numpy(opt_shard["exp_avg_sq"][n], "F32", "cuda:0")}
                                      for n in decay + no_decay},
                            "param_groups": param_groups(None, [[index[n] for n in decay], [index[n] for n in no_decay]])}
                    if bf16:
                        state["optimizer"] = {"optimizer": adam, "fp32_from_fp16_params": [
                            [Tensor.from_numpy(opt_shard["main_param"][n], "F32", "cuda:0") for n in g]
                            for g in (decay, no_decay)]}
                    else:
                        state["optimizer"] = adam
                state["opt_param_scheduler"] = {"max_lr": 3e-4, "lr_warmup_steps": 80, "num_steps": iteration * 8,
                                                "lr_decay_style": "cosine", "lr_decay_steps": 800, "min_lr": 3e-5,
                                                "start_wd": 0.01, "end_wd": 0.01, "wd_incr_style": "constant",
                                                "wd_incr_steps": 800}
            state["rng_state"] = rng_state()
            state["num_floating_point_operations_so_far"] = 1.5e12
            torch_save(state, d / "model_optim_rng.pt")
    (path / "latest_checkpointed_iteration.txt").write_text(str(iteration))


# ---------------------------------------------------------------- --ckpt-format torch_dist
def dist_key(name):
    """torch_dist key (stacked layers, TE norm names) and the layer index (None outside layers)."""
    if not name.startswith("decoder.layers."):
        return name, None
    i, suffix = int(name.split(".")[2]), name.split(".", 3)[3]
    return "decoder.layers." + TE_NAMES.get(suffix, suffix), i


def write_megatron_dist(path, model, tp, pp, params, optimizer, iteration, step, dist_opt=False, bf16=True,
                        with_optimizer=True):
    """A torch_dist iteration as Megatron saves it: every (tp, pp) rank writes its chunks of the
    global tensors into __<rank>_0.distcp; the optimizer by parameter name (non-distributed
    optimizer: optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<key>) or, with the distributed
    optimizer (dp_reshardable), per bucket."""
    layers, swiglu = model["num_layers"], model["activation"] == "swiglu"
    pdtype = "BF16" if bf16 else "F32"
    names = stage_names(model, 1)  # torch_dist ties the output copy to the embedding's key
    it_dir = path / f"iter_{iteration:07d}"
    items = {}

    def add(key, dtype, global_shape, offsets, array, rank):
        item = items.setdefault(key, DcpTensor(global_shape, dtype, []))
        item.chunks.append((offsets, Tensor.from_numpy(array, dtype), rank))

    for n in names:
        full = params[n]
        rule = split_rule(n, swiglu)
        key, layer = dist_key(n)
        p = chunk_of(n, layers, pp, 1)[0]
        kinds = [("", pdtype, full)]
        if with_optimizer and not dist_opt:
            kinds += [(f"optimizer.state.{k}.", "F32", optimizer[src][n]) for k, src in
                      (("fp32_param", "main_param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq"))]
            if not bf16:
                kinds = [k for k in kinds if "fp32_param" not in k[0]]
        for prefix, dtype, value in kinds:
            gshape = value.shape if layer is None else (layers,) + value.shape
            for t in range(tp if rule != "replicated" else 1):
                part = split(value, rule, tp)[t]
                if rule == "swiglu":  # two chunks per rank: its gate block and its up block
                    halves = np.split(part, 2, axis=0)
                    rows = value.shape[0] // 2 // tp
                    for h, half in enumerate(halves):
                        off = [h * value.shape[0] // 2 + t * rows] + [0] * (value.ndim - 1)
                        add(prefix + key, dtype, gshape, off if layer is None else [layer] + off,
                            half[None] if layer is not None else half, p * tp + t)
                    continue
                off = [0] * value.ndim
                if rule in ("rows", "vocab"):
                    off[0] = t * part.shape[0]
                elif rule == "cols":
                    off[1] = t * part.shape[1]
                add(prefix + key, dtype, gshape, off if layer is None else [layer] + off,
                    part[None] if layer is not None else part, p * tp + t)
    common = {"args": megatron_args(model, tp, pp, 1, dist_opt, bf16, iteration, ckpt_format="torch_dist"),
              "checkpoint_version": 3.0, "iteration": iteration,
              "opt_param_scheduler": {"max_lr": 3e-4, "num_steps": iteration * 8}}
    if with_optimizer:
        if dist_opt:
            common["optimizer"] = {"param_groups": param_groups(step), "param_state_sharding_type": "dp_reshardable"}
            for p in range(pp):
                order = megatron_order(names + (["output_layer.weight"] if pp > 1 and not
                                                model["untie_embeddings_and_output_weights"] else []),
                                       layers, pp, 1, p, 0)
                tied = not model["untie_embeddings_and_output_weights"]
                shared = lambda n: tied and pp > 1 and (  # noqa: E731
                    (n == "embedding.word_embeddings.weight" and p == 0) or n == "output_layer.weight")
                for t in range(tp):
                    shard = {}
                    for n in order:
                        src = n if n in params else "embedding.word_embeddings.weight"
                        shard[n] = {k: split(optimizer[k][src], split_rule(n, swiglu), tp)[t]
                                    for k in optimizer}
                    numel = {n: shard[n]["main_param"].size for n in order}
                    world, starts, bucket_of, unpadded, _ = buffer_layout(order, numel, shared)
                    mp_rank = p * tp + t
                    for b, size in enumerate(unpadded):
                        for key, kind in (("param", "main_param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
                            buf = np.zeros(size, np.float32)
                            base = sum(unpadded[:b])
                            for n in order:
                                if bucket_of[n] == b:
                                    buf[world[n] - base:world[n] - base + numel[n]] = shard[n][kind].ravel()
                            k = (f"optimizer.distributed.dp_group_idx_{mp_rank}.gbuf_idx_0."
                                 f"dtype_(torch.{'bfloat16' if bf16 else 'float32'}, torch.float32)"
                                 f".bucket_idx_{b}.{key}")
                            add(k, "F32", (size,), [0], buf, mp_rank)
        else:
            common["optimizer"] = {"optimizer": {"param_groups": param_groups(None),
                                                 "state": {"common_step": step}}}
    items["common_state/shard_0_1"] = (torch_dumps([common]), 0)
    items["rng_state/shard_0.0_1.1"] = (torch_dumps([rng_state()]), 0)
    for p in range(pp):
        for t in range(tp):
            items[f"decoder.layers.self_attention.linear_qkv._extra_state/shard_0.{t}_1.{tp}"] = (
                torch_dumps([None]), p * tp + t)
    from torch_format_writer import write_dcp
    write_dcp(it_dir, items)
    (it_dir / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    (path / "latest_checkpointed_iteration.txt").write_text(str(iteration))


# ---------------------------------------------------------------- checks
def read_ours_f32(path, iteration=None):
    """read_ours for checkpoints of any params dtype: every tensor as float32 (BF16 widened)."""
    import json
    from pathlib import Path
    from ckpt_testlib import merge, raw_read
    from torch_format_writer import bf16_to_f32
    path = Path(path)
    if iteration is None:
        iteration = int((path / "latest_checkpointed_iteration.txt").read_text())
    it_dir = path / f"iter_{iteration:07d}"
    meta = json.loads((it_dir / "metadata.json").read_text())
    par = meta["parallel"]
    tp, pp = par["tensor_model_parallel_size"], par["pipeline_model_parallel_size"]
    swiglu = meta["model"]["activation"] == "swiglu"

    def as_f32(dtype, shape, blob):
        if dtype == "BF16":
            return bf16_to_f32(np.frombuffer(blob, np.uint16)).reshape(shape)
        return np.frombuffer(blob, {"F32": np.float32, "F16": np.float16}[dtype]).astype(np.float32).reshape(shape)

    files = ["model.safetensors"] + (["optimizer.safetensors"] if meta["optimizer"] else [])
    out = {k: {} for k in ("", "main_param.", "exp_avg.", "exp_avg_sq.")}
    for p in range(pp):
        for f in files:
            parts = [raw_read(it_dir / shard_dir_name(t, p, pp) / f) for t in range(tp)]
            for name in parts[0]:
                kind = next((k for k in ("main_param.", "exp_avg.", "exp_avg_sq.") if name.startswith(k)), "")
                param = name[len(kind):]
                merged = merge([as_f32(*parts[t][name]) for t in range(tp)], split_rule(param, swiglu))
                out[kind][param] = merged
    return meta, out


def assert_same_state(ours, params, optimizer, with_optimizer=True):
    """Every tensor of read_ours_f32's result equals the generator's (vocabulary rows present in
    both compared, new padding zero)."""
    kinds = [("", params)] + ([(k + ".", optimizer[k]) for k in optimizer] if with_optimizer else [])
    for kind, expected in kinds:
        assert set(ours[kind]) >= set(expected), sorted(set(expected) - set(ours[kind]))
        for name, array in expected.items():
            got = ours[kind][name]
            if name.endswith("word_embeddings.weight") or name == "output_layer.weight":
                n = min(got.shape[0], array.shape[0])
                assert np.array_equal(got[:n], array[:n]), (kind, name)
                assert not got[n:].any(), (kind, name)
            else:
                assert np.array_equal(got, array), (kind, name)


def read_hf_f32(path):
    """Every tensor of an HF folder (any shards) as float32, BF16 widened."""
    from pathlib import Path
    from ckpt_testlib import raw_read
    from torch_format_writer import bf16_to_f32
    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        for name, (dtype, shape, blob) in raw_read(f).items():
            if dtype == "BF16":
                out[name] = bf16_to_f32(np.frombuffer(blob, np.uint16)).reshape(shape)
            else:
                out[name] = np.frombuffer(blob, {"F32": np.float32, "F16": np.float16}[dtype]).astype(
                    np.float32).reshape(shape)
    return out
