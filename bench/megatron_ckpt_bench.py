#!/usr/bin/env python3
"""Import + reshard of a GPT-2 XL-shaped Megatron-LM checkpoint with optimizer state, beside `cp -r`
of the same bytes in the same run (issue 18, "Benchmark"). Prints a Markdown table.

  python3 bench/megatron_ckpt_bench.py [--cases torch torch_distopt torch_dist] [--runs 3] [--verify]
                                       [--num-layers 48]

Cases (each generated, measured, then deleted; the copy is deleted before the output is made, so at
most a source and a copy or an output are on disk):
  torch          --ckpt-format torch, TP5, the non-distributed optimizer: per rank model_optim_rng.pt
                 with the bf16 weights, AdamW's exp_avg / exp_avg_sq and fp32_from_fp16_params;
  torch_distopt  --ckpt-format torch, TP5, --use-distributed-optimizer: the weights as views into one
                 parameter buffer, distrib_optim.pt with the coalesced fp32 buffers;
  torch_dist     --ckpt-format torch_dist saved from TP5: stacked layers, one chunk per rank and
                 layer, the optimizer by parameter name (optimizer.state.fp32_param.<key>, ...).
Each is converted by `reshard_checkpoint --load SRC --save OUT --target-tp 1 --target-pp 1` into the
project's format (format detected), and copied by `cp -r SRC COPY`; the two alternate `--runs` times.

The model: 48 layers, hidden 1600, 25 heads, seq 1024, vocab 50257 padded as Megatron pads it at TP5
(50560 rows; TP1 pads to 50304), tied embeddings, bf16 weights with fp32 main weights and Adam
moments: 1.56 B parameters, 21.8 GB. 25 heads allow TP 1, 5 or 25 only, hence TP5 -> TP1.
--num-layers 24 makes the same model half as deep: 0.82 B parameters, 11.6 GB.

The checkpoints are written by tests/interop's torch-format writer (the one the CI tests build
Megatron checkpoints with, from megatron_testlib's layout rules), streaming from 64 MiB random
pools: no torch, never the model in memory. Shard values are random and non-zero, the bf16 weights
the rounding of the fp32 main weights; replicated parameters hold the same values on every rank.

Before every measured command the harness runs `sync` and reads the source once with
`cat > /dev/null` (the page cache cannot be dropped without privileges: every command starts from
the same cache state). Wall time and peak RSS come from GNU `/usr/bin/time -f "%e %M"`.
With --verify, every tensor of the first output (optimizer state included) is checked off the clock
against the generator's shards merged over TP.
"""
import argparse
import collections
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "interop"))
from ckpt_testlib import merge, shard_dir_name, split_rule  # noqa: E402
from megatron_testlib import (LINEARS, buffer_layout, dist_key, local_name, megatron_args,  # noqa: E402
                              megatron_order, param_groups, rng_state, stage_names, torch_dtype)
from test_ckpt_reshard import GPT2_MODEL, full_shapes  # noqa: E402
from torch_format_writer import (DcpTensor, Storage, StreamedData, Tensor, torch_dumps,  # noqa: E402
                                 torch_save, write_dcp)

BIN = pathlib.Path(os.environ.get("LEANTRON_BIN", ROOT / "build" / "bin"))
GPT2_XL = dict(GPT2_MODEL, num_layers=48, hidden_size=1600, ffn_hidden_size=6400, num_attention_heads=25,
               num_query_groups=25, kv_channels=64, vocab_size=50257, max_position_embeddings=1024,
               params_dtype="BF16")
TP = 5
ITERATION, STEP = 10000, 10000
POOL = 1 << 24  # elements per random pool (64 MiB as F32)
CHUNK = 1 << 22  # elements per piece
GB = 1e9
KINDS = ("main_param", "exp_avg", "exp_avg_sq")


# ---------------------------------------------------------------- shard contents, streamed
def bf16(a):
    bits = a.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def make_pools(seed):
    rng = np.random.default_rng(seed)
    main = rng.standard_normal(POOL, dtype=np.float32) * np.float32(0.02)
    main[main == 0] = np.float32(1e-4)
    avg = rng.standard_normal(POOL, dtype=np.float32) * np.float32(1e-3)
    avg[avg == 0] = np.float32(1e-7)
    avg_sq = np.abs(rng.standard_normal(POOL, dtype=np.float32)) * np.float32(1e-6) + np.float32(1e-12)
    param = bf16(main)
    param[param == 0] = 0x3800
    return {"param": param, "main_param": main, "exp_avg": avg, "exp_avg_sq": avg_sq}


def hash_name(name):
    h = 2166136261
    for b in name.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


class Shards:
    """The TP shards of every canonical parameter as (offset, length) slices of the pools: the same
    slices for every kind, so a bf16 weight is the rounding of its fp32 main weight; replicated
    parameters use rank 0's slices on every rank."""

    def __init__(self, model, tp, seed=1234):
        self.model, self.tp, self.seed = model, tp, seed
        self.pools = make_pools(seed)
        self.shapes = full_shapes(model, tp)
        self.swiglu = model["activation"] == "swiglu"

    def shape(self, name, rank=None):
        full = self.shapes["embedding.word_embeddings.weight" if name == "output_layer.weight" else name]
        rule = split_rule(name, self.swiglu)
        if rank is None or rule == "replicated":
            return full
        if rule == "cols":
            return (full[0], full[1] // self.tp)
        return (full[0] // self.tp,) + tuple(full[1:])

    def slices(self, name, rank):
        if split_rule(name, self.swiglu) == "replicated":
            rank = 0
        name = "embedding.word_embeddings.weight" if name == "output_layer.weight" else name
        count = int(np.prod(self.shape(name, rank)))
        rng = np.random.default_rng([self.seed, hash_name(name), rank])
        done = 0
        while done < count:
            n = min(CHUNK, count - done)
            yield int(rng.integers(0, POOL - n + 1)), n
            done += n

    def pieces(self, name, rank, kind):
        pool = self.pools[kind]
        for off, n in self.slices(name, rank):
            yield memoryview(pool[off:off + n]).cast("B")

    def array(self, name, rank, kind):
        return np.concatenate([self.pools[kind][o:o + n] for o, n in self.slices(name, rank)]).reshape(
            self.shape(name, rank))

    def full(self, name, kind):
        rule = split_rule(name, self.swiglu)
        return merge([self.array(name, t, kind) for t in range(self.tp)], rule)

    def tensor(self, name, rank, kind, location="cuda:0"):
        """A tensor whose storage streams the shard."""
        dtype = "BF16" if kind == "param" else "F32"
        shape = self.shape(name, rank)
        nbytes = int(np.prod(shape)) * (2 if kind == "param" else 4)
        data = StreamedData(nbytes, lambda: self.pieces(name, rank, kind))
        return Tensor(Storage(data, dtype, location), shape)

    def buffer(self, order, starts, total, rank, kind):
        """A flat buffer of `total` elements: each parameter's shard at its start, zeros between."""
        size = 2 if kind == "param" else 4
        zeros = bytes(1 << 20)

        def gap(n):
            while n > 0:
                k = min(n, len(zeros))
                yield zeros[:k]
                n -= k

        def pieces():
            at = 0
            for name in sorted(order, key=lambda n: starts[n]):
                yield from gap((starts[name] - at) * size)
                yield from self.pieces(name, rank, kind)
                at = starts[name] + int(np.prod(self.shape(name, rank)))
            yield from gap((total - at) * size)

        return Storage(StreamedData(total * size, pieces), "BF16" if kind == "param" else "F32", "cuda:0")


# ---------------------------------------------------------------- Megatron's files
def write_torch(path, shards, dist_opt):
    """--ckpt-format torch at TP `shards.tp`, PP1 (megatron_testlib.write_megatron_torch's layout)."""
    m, tp = shards.model, shards.tp
    layers = m["num_layers"]
    names = stage_names(m, 1)
    order = megatron_order(names, layers, 1, 1, 0, 0)
    it_dir = path / f"iter_{ITERATION:07d}"
    for t in range(tp):
        d = it_dir / shard_dir_name(t, 0, 1)
        d.mkdir(parents=True)
        numel = {n: int(np.prod(shards.shape(n, t))) for n in order}
        world, starts, _, _, padded_total = buffer_layout(order, numel, lambda n: False)
        if dist_opt:
            storage = shards.buffer(order, starts, padded_total, t, "param")
            views = {n: Tensor(storage, shards.shape(n, t), starts[n]) for n in order}
        else:
            views = {n: shards.tensor(n, t, "param") for n in order}
        sd = collections.OrderedDict()
        for k, n in enumerate(order):
            sd[local_name(n, layers, 1, 1)] = views[n]
            module = n.rsplit(".", 1)[0]
            following = order[k + 1].rsplit(".", 1)[0] if k + 1 < len(order) else None
            if following != module and module.endswith(LINEARS):
                sd[module + "._extra_state"] = None
        sd["output_layer._extra_state"] = None
        state = {"args": megatron_args(m, tp, 1, 1, dist_opt, True, ITERATION, seq_length=1024),
                 "checkpoint_version": 3.0, "iteration": ITERATION, "model": sd}
        if dist_opt:
            state["optimizer"] = {"optimizer": {"param_groups": param_groups(STEP)}}
            total = max(world[n] + numel[n] for n in order)
            tensors = {key: Tensor(shards.buffer(order, world, total, t, kind), (total,))
                       for key, kind in (("param", "main_param"), ("exp_avg", "exp_avg"),
                                         ("exp_avg_sq", "exp_avg_sq"))}
            tensors["numel_unpadded"] = total
            torch_save({"buckets_coalesced": True, 0: {(torch_dtype("BF16"), torch_dtype("F32")): tensors}},
                       d / "distrib_optim.pt")
        else:
            decay = [n for n in order if len(shards.shape(n)) > 1 and not n.endswith(".bias")]
            no_decay = [n for n in order if n not in decay]
            index = {n: i for i, n in enumerate(decay + no_decay)}
            # torch's Adam keeps a `step` tensor per parameter: a 4-byte record beside each one's
            # moments.
            adam = {"state": {index[n]: {"step": Tensor.from_numpy(np.array(float(STEP), np.float32)),
                                         "exp_avg": shards.tensor(n, t, "exp_avg"),
                                         "exp_avg_sq": shards.tensor(n, t, "exp_avg_sq")}
                              for n in decay + no_decay},
                    "param_groups": param_groups(None, [[index[n] for n in decay], [index[n] for n in no_decay]])}
            state["optimizer"] = {"optimizer": adam, "fp32_from_fp16_params": [
                [shards.tensor(n, t, "main_param") for n in g] for g in (decay, no_decay)]}
        state["opt_param_scheduler"] = {"max_lr": 1.5e-4, "lr_warmup_steps": 2000, "num_steps": ITERATION * 512,
                                        "lr_decay_style": "cosine", "lr_decay_steps": 300000, "min_lr": 1e-5,
                                        "start_wd": 0.01, "end_wd": 0.01, "wd_incr_style": "constant",
                                        "wd_incr_steps": 300000}
        state["rng_state"] = rng_state()
        state["num_floating_point_operations_so_far"] = 1.5e18
        torch_save(state, d / "model_optim_rng.pt")
    (path / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))


def write_torch_dist(path, shards):
    """--ckpt-format torch_dist saved by TP `shards.tp` ranks (megatron_testlib.write_megatron_dist's
    layout), the non-distributed optimizer's state by parameter name."""
    m, tp = shards.model, shards.tp
    items = {}
    for n in stage_names(m, 1):
        rule = split_rule(n, shards.swiglu)
        key, layer = dist_key(n)
        for prefix, kind in (("", "param"), ("optimizer.state.fp32_param.", "main_param"),
                             ("optimizer.state.exp_avg.", "exp_avg"), ("optimizer.state.exp_avg_sq.", "exp_avg_sq")):
            full = shards.shape(n)
            gshape = full if layer is None else (m["num_layers"],) + full
            item = items.setdefault(prefix + key, DcpTensor(gshape, "BF16" if kind == "param" else "F32", []))
            for t in range(tp if rule != "replicated" else 1):
                part = shards.shape(n, t)
                off = [0] * len(full)
                if rule in ("rows", "vocab"):
                    off[0] = t * part[0]
                elif rule == "cols":
                    off[1] = t * part[1]
                tensor = shards.tensor(n, t, kind, "cpu")
                if layer is not None:
                    tensor = Tensor(tensor.storage, (1,) + part)
                    off = [layer] + off
                item.chunks.append((off, tensor, t))
    common = {"args": megatron_args(m, tp, 1, 1, False, True, ITERATION, ckpt_format="torch_dist", seq_length=1024),
              "checkpoint_version": 3.0, "iteration": ITERATION,
              "opt_param_scheduler": {"max_lr": 1.5e-4, "num_steps": ITERATION * 512},
              "optimizer": {"optimizer": {"param_groups": param_groups(None), "state": {"common_step": STEP}}}}
    items["common_state/shard_0_1"] = (torch_dumps([common]), 0)
    items["rng_state/shard_0.0_1.1"] = (torch_dumps([rng_state()]), 0)
    it_dir = path / f"iter_{ITERATION:07d}"
    write_dcp(it_dir, items)
    (it_dir / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    (path / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))


# ---------------------------------------------------------------- checking an output
def st_tensors(path):
    """name -> read-only memmap of a safetensors file's tensor (raw bits: uint16 for BF16)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {name: np.memmap(path, dtype=np.uint16 if v["dtype"] == "BF16" else np.float32, mode="r",
                            offset=8 + n + v["data_offsets"][0], shape=tuple(v["shape"]))
            for name, v in header.items()}


def verify(shards, out):
    """Every tensor of the TP1/PP1 output equals the generator's shards merged over TP (vocabulary
    rows both hold); rows the output adds are zero."""
    it = out / f"iter_{ITERATION:07d}" / shard_dir_name(0, 0, 1)
    checked = 0
    for file, kinds in (("model.safetensors", ("param",)), ("optimizer.safetensors", KINDS)):
        stored = st_tensors(it / file)
        for name in shards.shapes:
            for kind in kinds:
                key = name if kind == "param" else f"{kind}.{name}"
                got = stored[key]
                want = shards.full(name, kind)
                rows = min(len(got), len(want))
                if not (np.array_equal(got[:rows], want[:rows]) and not got[rows:].any()):
                    raise SystemExit(f"verify: {out}: {key} differs from the source")
                checked += 1
        del stored
    return checked


# ---------------------------------------------------------------- measuring
def du(path):
    return sum(f.stat().st_size for f in pathlib.Path(path).rglob("*") if f.is_file())


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def prepare(source):
    subprocess.run(["sync"], check=True)
    for f in sorted(p for p in pathlib.Path(source).rglob("*") if p.is_file()):
        subprocess.run(["cat", str(f)], stdout=subprocess.DEVNULL, check=True)


def timed(cmd):
    proc = subprocess.run(["/usr/bin/time", "-f", "%e %M", *map(str, cmd)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{proc.stderr}")
    wall, rss_kb = proc.stderr.strip().splitlines()[-1].split()
    return float(wall), int(rss_kb) * 1024


LABELS = {"torch": "`--ckpt-format torch` TP5, optimizer in model_optim_rng.pt",
          "torch_distopt": "`--ckpt-format torch` TP5, `distrib_optim.pt`",
          "torch_dist": "`--ckpt-format torch_dist` from TP5, optimizer by name"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=str(ROOT / ".cache" / "megatron_ckpt_bench"))
    ap.add_argument("--cases", nargs="+", default=list(LABELS), choices=list(LABELS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--num-layers", type=int, default=GPT2_XL["num_layers"],
                    help="transformer layers (default 48, GPT-2 XL; 24 halves every size but the embedding's)")
    args = ap.parse_args()
    work = pathlib.Path(args.workdir)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    shards = Shards(dict(GPT2_XL, num_layers=args.num_layers), TP)
    need = 2 * 14 * sum(int(np.prod(s)) for s in shards.shapes.values())  # source + copy or output
    if free_bytes(work) < need * 1.05:
        print(f"warning: {free_bytes(work) / GB:.0f} GB free; a case needs ~{need / GB:.0f} GB "
              "(the source and its copy or the output)", file=sys.stderr)
    largest = max(int(np.prod(s)) for s in shards.shapes.values()) * 4  # an F32 state of the embedding
    rows = []
    try:
        for case in args.cases:
            src, copy, out = work / f"src_{case}", work / "copy", work / "out"
            t = time.perf_counter()
            if case == "torch_dist":
                write_torch_dist(src, shards)
            else:
                write_torch(src, shards, dist_opt=case == "torch_distopt")
            subprocess.run(["sync"], check=True)
            size = du(src)
            print(f"{case}: generated {size / GB:.2f} GB in {time.perf_counter() - t:.0f} s", file=sys.stderr,
                  flush=True)
            cp_runs, ours_runs, out_size = [], [], 0
            for run in range(args.runs):
                prepare(src)
                load = os.getloadavg()[0]
                cp_runs.append(timed(["cp", "-r", src, copy]) + (load,))
                shutil.rmtree(copy)
                prepare(src)
                load = os.getloadavg()[0]
                ours_runs.append(timed([BIN / "reshard_checkpoint", "--load", src, "--save", out,
                                        "--target-tp", 1, "--target-pp", 1]) + (load,))
                out_size = du(out)
                if run == 0 and args.verify:
                    t = time.perf_counter()
                    n = verify(shards, out)
                    print(f"{case}: verified {n} tensors bitwise ({time.perf_counter() - t:.0f} s)",
                          file=sys.stderr, flush=True)
                shutil.rmtree(out)
                print(f"{case} run {run}: cp {cp_runs[-1][0]:.1f} s, ours {ours_runs[-1][0]:.1f} s "
                      f"{ours_runs[-1][1] / 2**20:.0f} MiB (load {load:.1f})", file=sys.stderr, flush=True)
            shutil.rmtree(src)
            rows.append((case, size, out_size, cp_runs, ours_runs))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nLargest tensor: {largest / 2**20:.1f} MiB (an F32 state of `embedding.word_embeddings.weight` "
          f"at TP5's {shards.shapes['embedding.word_embeddings.weight'][0]} rows); RSS target 2x = "
          f"{2 * largest / 2**20:.0f} MiB.\n")
    print("| source → TP1/PP1 (ours) | read GB | written GB | `cp -r` s (best / median) | ours s (best / median) "
          "| ours / `cp` (median of ratios) | peak RSS MiB (max) | RSS / largest tensor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for case, size, out_size, cp_runs, ours_runs in rows:
        cp_w = [r[0] for r in cp_runs]
        ours_w = [r[0] for r in ours_runs]
        ratios = [o / c for o, c in zip(ours_w, cp_w)]
        rss = max(r[1] for r in ours_runs)
        print(f"| {LABELS[case]} | {size / GB:.2f} | {out_size / GB:.2f} | {min(cp_w):.1f} / "
              f"{statistics.median(cp_w):.1f} | {min(ours_w):.1f} / {statistics.median(ours_w):.1f} | "
              f"{statistics.median(ratios):.2f} | {rss / 2**20:.0f} | {rss / largest:.2f} |")
    print("\nRuns (cp s, ours s, ours RSS MiB, load average before ours):")
    for case, _, _, cp_runs, ours_runs in rows:
        print(f"- {case}: " + "; ".join(f"{c[0]:.1f}, {o[0]:.1f}, {o[1] / 2**20:.0f}, {o[2]:.1f}"
                                        for c, o in zip(cp_runs, ours_runs)))


if __name__ == "__main__":
    main()
