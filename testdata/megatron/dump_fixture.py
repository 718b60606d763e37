#!/usr/bin/env python3
"""Helper of make_fixtures.sh, run on the machine with PyTorch and Megatron-LM (not in CI).

  dump_fixture.py dump --dcp DIR --out DIR/dump.safetensors --meta DIR/meta.json [--set KEY=VALUE]...
      DIR is a torch_dist iteration that Megatron-LM itself wrote from the fixture checkpoint
      (pretrain_gpt.py --load FIXTURE --ckpt-convert-format torch_dist
      --dist-ckpt-optim-fully-reshardable): PyTorch's dcp_to_torch_save merges every tensor's
      chunks into the global tensor, and this writes them under the names Leantron's tools use
      (Megatron-Core names, global layer indices; TransformerEngine's fused norm names mapped to
      input_layernorm / pre_mlp_layernorm):
          param/<name>       the model weights as saved (BF16, or F32 for an fp32 run)
          main_param/<name>  the fp32 main weights (an fp32 run: its weights)
          exp_avg/<name>, exp_avg_sq/<name>  Adam's moments
      and meta.json with the iteration, Adam's step and the --set values. Megatron's own loader
      and converter (not Leantron's understanding of the legacy files) produce these tensors.
  dump_fixture.py loss --log FILE --iteration N
      prints the "lm loss" Megatron logged at iteration N.
"""
import argparse
import io
import json
import re
import struct
import sys
import tempfile
from pathlib import Path

FUSED = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
         "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
         "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
         "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias"}
STATES = {"param": "main_param", "fp32_param": "main_param", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}


def write_safetensors(path, tensors, metadata):
    """tensors: name -> torch tensor (contiguous CPU); the safetensors layout, no package needed."""
    import torch
    names = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16", torch.int64: "I64"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def canonical(key):
    """Model parameter names of a torch_dist key: [(name, layer index or None)], [] if none."""
    if "_extra_state" in key:
        return []
    if key.startswith("decoder.layers."):
        rest = key[len("decoder.layers."):]
        head = rest.split(".", 1)[0]
        if head.isdigit():  # global index in the key (non-homogeneous layers)
            suffix = rest.split(".", 1)[1]
            return [(f"decoder.layers.{head}.{FUSED.get(suffix, suffix)}", None)]
        return [("decoder.layers.{}." + FUSED.get(rest, rest), "stacked")]
    if key in ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
               "decoder.final_layernorm.weight", "decoder.final_layernorm.bias", "output_layer.weight"):
        return [(key, None)]
    return []


def find_step(obj, depth=0):
    import torch
    if depth > 6:
        return None
    if isinstance(obj, dict):
        if "common_step" in obj:
            s = obj["common_step"]
            return int(s.item() if torch.is_tensor(s) else s)
        groups = obj.get("param_groups")
        if isinstance(groups, list) and groups and "step" in groups[0]:
            s = groups[0]["step"]
            return int(s.item() if torch.is_tensor(s) else s)
        for v in obj.values():
            s = find_step(v, depth + 1)
            if s is not None:
                return s
    if isinstance(obj, (list, tuple)):
        for v in obj:
            s = find_step(v, depth + 1)
            if s is not None:
                return s
    return None


def dump(args):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / "merged.pt"
        dcp_to_torch_save(args.dcp, merged)
        sd = torch.load(merged, map_location="cpu", weights_only=False)
    common = None
    for key, value in sd.items():
        if key.startswith("common_state"):
            if isinstance(value, io.BytesIO):
                value.seek(0)
                value = torch.load(value, map_location="cpu", weights_only=False)
            common = value[0] if isinstance(value, list) else value
    if common is None and (Path(args.dcp) / "common.pt").exists():
        common = torch.load(Path(args.dcp) / "common.pt", map_location="cpu", weights_only=False)
    if common is None:
        sys.exit(f"{args.dcp}: no common state")
    out = {}
    for key, value in sd.items():
        if not torch.is_tensor(value):
            continue
        kind, model_key = "param", key
        if key.startswith("optimizer.state."):
            state, model_key = key[len("optimizer.state."):].split(".", 1)
            if state not in STATES:
                sys.exit(f"{key}: unknown optimizer state {state}")
            kind = STATES[state]
        elif key.startswith("optimizer."):
            sys.exit(f"{key}: the converted checkpoint is not in model space "
                     "(was --dist-ckpt-optim-fully-reshardable given?)")
        for name, stacked in canonical(model_key):
            if stacked:
                for i in range(value.shape[0]):
                    out[f"{kind}/{name.format(i)}"] = value[i].clone()
            else:
                out[f"{kind}/{name}"] = value
    params = [k for k in out if k.startswith("param/")]
    if not params:
        sys.exit(f"{args.dcp}: no model tensors")
    # An fp32 run keeps no separate main weights: its Adam steps the weights.
    if not any(k.startswith("main_param/") for k in out) and any(k.startswith("exp_avg/") for k in out):
        for k in params:
            out["main_param/" + k[len("param/"):]] = out[k].float()
    meta = {"iteration": int(common.get("iteration", 0)), "step": find_step(common.get("optimizer")),
            "tensors": len(out)}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            meta[key] = json.loads(value)
        except json.JSONDecodeError:
            meta[key] = value
    write_safetensors(args.out, out, {"leantron_fixture": json.dumps(meta, sort_keys=True)})
    Path(args.meta).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"{args.out}: {len(out)} tensors, iteration {meta['iteration']}, step {meta['step']}")


def loss(args):
    text = Path(args.log).read_text(errors="replace")
    found = re.findall(rf"iteration\s+{args.iteration}/\s*\d+ \|.*?lm loss: ([0-9.eE+-]+)", text)
    if not found:
        sys.exit(f"{args.log}: no lm loss at iteration {args.iteration}")
    print(found[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--dcp", required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--meta", required=True)
    d.add_argument("--set", action="append", default=[])
    d.set_defaults(fn=dump)
    l = sub.add_parser("loss")
    l.add_argument("--log", required=True)
    l.add_argument("--iteration", type=int, required=True)
    l.set_defaults(fn=loss)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
