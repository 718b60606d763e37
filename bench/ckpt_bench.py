#!/usr/bin/env python3
"""Reshard and convert a GPT-2 XL-sized (1.5B) checkpoint with optimizer state, next to `cp -r` of
the same bytes in the same run (issue 4, "Benchmark"). Prints a Markdown table.

  python3 bench/ckpt_bench.py [--verify] [--workdir .cache/ckpt_bench] [--steps cp reshard ...]

Steps: `cp -r` of the TP1/PP1 source; reshard TP1/PP1 -> TP5/PP2; `convert_hf --to-hf` of the source;
`convert_hf --from-hf` of that export; reshard TP5/PP2 -> TP1/PP4 (after deleting the source).

1. Generates, streaming (a few 64 MiB pools, never the model), a TP1/PP1 checkpoint in the project's
   format (docs/checkpoint-format.md): 48 layers, hidden 1600, 25 heads, seq 1024, vocab 50257
   padded to 50304, tied embeddings, BF16 params plus F32 main params, exp_avg, exp_avg_sq and the
   Adam step. TP1/PP1 is the realistic source: 1.5B params with Adam state fit one GPU, and the 25
   heads only allow TP 1, 5 or 25. Names and shapes come from the interop tests' reference
   (tests/interop), values are random and non-zero (params are the bf16 rounding of the main params).
2. Measures each step with GNU `/usr/bin/time -f "%e %M"`. Before every measured step the harness
   runs `sync` (so earlier write-back is not billed to it) and reads the source checkpoint with
   `cat > /dev/null` (every step starts from the same page-cache state: the tail of the source
   that fits in memory is cached).
3. With --verify, checks off the clock that the TP5/PP2 output equals the source bitwise.
4. Keeps at most two checkpoint copies on disk; deletes each output after measuring it, and the
   whole work directory at the end (unless --keep).
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "interop"))
from ckpt_testlib import merge, padded_vocab, shard_dir_name, split_rule, stage_of  # noqa: E402
from test_ckpt_reshard import GPT2_MODEL, full_shapes  # noqa: E402

BIN = pathlib.Path(os.environ.get("LEANTRON_BIN", ROOT / "build" / "bin"))
GPT2_XL = dict(GPT2_MODEL, num_layers=48, hidden_size=1600, ffn_hidden_size=6400, num_attention_heads=25,
               num_query_groups=25, kv_channels=64, vocab_size=50257, max_position_embeddings=1024,
               params_dtype="BF16")
ITERATION, STEP = 10000, 10000
POOL = 1 << 24          # elements per random pool (64 MiB as F32)
CHUNK = 1 << 22         # elements per write
GB = 1e9


# ---------------------------------------------------------------- streaming generator
def bf16(a):
    """Round-to-nearest-even F32 -> BF16 bits (as uint16)."""
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
    param[param == 0] = 0x3800  # bf16 2^-15: keeps every value non-zero after rounding
    return {"param": param, "main_param": main, "exp_avg": avg, "exp_avg_sq": avg_sq}


def chunks(name, count, seed):
    """(offset, length) slices of a pool that make up a tensor; the same for every kind, so a param
    is the bf16 rounding of its main param."""
    rng = np.random.default_rng([seed, hash_name(name)])
    done = 0
    while done < count:
        n = min(CHUNK, count - done)
        yield int(rng.integers(0, POOL - n + 1)), n
        done += n


def hash_name(name):
    h = 2166136261
    for b in name.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def write_safetensors(path, entries, pools, seed):
    """entries: [(stored name, kind, param name, shape)], one dtype per file. Reference-writer layout:
    names sorted, header padded to 8 bytes with spaces; written through a temporary name."""
    entries = sorted(entries)
    pool0 = pools[entries[0][1]]
    dtype, size = ("BF16" if pool0.dtype == np.uint16 else "F32"), pool0.itemsize
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for stored, _, _, shape in entries:
        nbytes = int(np.prod(shape)) * size
        header[stored] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb", buffering=0) as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for _, kind, param, shape in entries:
            for off, n in chunks(param, int(np.prod(shape)), seed):
                f.write(memoryview(pools[kind][off:off + n]).cast("B"))
    tmp.rename(path)
    return offset + 8 + len(text)


def generate(out, seed=1234):
    m = GPT2_XL
    assert padded_vocab(m["vocab_size"], 1) == 50304
    shapes = full_shapes(m, 1)  # TP1/PP1: every tensor is whole; tied, so no output_layer
    it_dir = out / f"iter_{ITERATION:07d}"
    rank = it_dir / shard_dir_name(0, 0, 1)
    rank.mkdir(parents=True)
    pools = make_pools(seed)
    total = write_safetensors(rank / "model.safetensors",
                              [(k, "param", k, s) for k, s in shapes.items()], pools, seed)
    total += write_safetensors(rank / "optimizer.safetensors",
                               [(f"{kind}.{k}", kind, k, s) for kind in ("main_param", "exp_avg", "exp_avg_sq")
                                for k, s in shapes.items()], pools, seed)
    meta = {"format": "leantron-checkpoint", "format_version": 1, "iteration": ITERATION,
            "consumed_samples": ITERATION * 512, "model": m,
            "parallel": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                         "virtual_pipeline_model_parallel_size": 1},
            "optimizer": {"type": "adam", "step": STEP, "state": ["main_param", "exp_avg", "exp_avg_sq"]},
            "args": {"lr": 1.5e-4, "note": "bench/ckpt_bench.py synthetic GPT-2 XL"}}
    (it_dir / "metadata.json").write_text(json.dumps(meta, indent=1))
    (out / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
    largest = max(int(np.prod(s)) for s in shapes.values()) * 4  # F32 optimizer copy
    return total, largest, sum(int(np.prod(s)) for s in shapes.values())


# ---------------------------------------------------------------- verifying a reshard, streaming
def st_tensors(path):
    """name -> read-only memmap of the raw bits (uint16 for BF16, uint32 for F32)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    out = {}
    for name, v in header.items():
        dtype = {"BF16": np.uint16, "F32": np.uint32}[v["dtype"]]
        begin, end = v["data_offsets"]
        out[name] = (path, dtype, 8 + n + begin, tuple(v["shape"])) if end > begin else None
    return out


def load(ref):
    path, dtype, offset, shape = ref
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def verify(source, target, tp, pp):
    """Every tensor of `target` (TP `tp`, PP `pp`), merged over TP, equals the TP1/PP1 `source`
    bitwise; new vocabulary padding rows are zero; the tied copy equals the embedding."""
    it = f"iter_{ITERATION:07d}"
    layers = GPT2_XL["num_layers"]
    checked = 0
    for file in ("model.safetensors", "optimizer.safetensors"):
        src = st_tensors(source / it / shard_dir_name(0, 0, 1) / file)
        for p in range(pp):
            ranks = [st_tensors(target / it / shard_dir_name(t, p, pp) / file) for t in range(tp)]
            for stored in ranks[0]:
                kind, param = stored.split(".", 1) if file.startswith("opt") else ("", stored)
                assert stage_of(param, layers, pp, 1) == p, stored
                merged = merge([np.asarray(load(r[stored])) for r in ranks], split_rule(param, False))
                canonical = "embedding.word_embeddings.weight" if param == "output_layer.weight" else param
                want = load(src[f"{kind}.{canonical}" if kind else canonical])
                rows = min(len(want), len(merged))
                if not (np.array_equal(merged[:rows], want[:rows]) and not merged[rows:].any()):
                    raise SystemExit(f"verify: {target} {p}: {stored} differs from the source")
                checked += 1
    return checked


# ---------------------------------------------------------------- measuring
def du(path):
    path = pathlib.Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in pathlib.Path(path).rglob("*") if f.is_file())


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def prepare(source):
    """Same page-cache state before every step: flush dirty pages, then read the source once."""
    subprocess.run(["sync"], check=True)
    t = time.perf_counter()
    for f in sorted(pathlib.Path(source).rglob("*.safetensors")):
        subprocess.run(f"cat '{f}' > /dev/null", shell=True, check=True)
    return time.perf_counter() - t


def timed(cmd):
    proc = subprocess.run(["/usr/bin/time", "-f", "%e %M", *map(str, cmd)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{proc.stderr}")
    wall, rss_kb = proc.stderr.strip().splitlines()[-1].split()
    return float(wall), int(rss_kb) * 1024


def load_average():
    return os.getloadavg()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=str(ROOT / ".cache" / "ckpt_bench"))
    ap.add_argument("--steps", nargs="+", default=["cp", "reshard", "to_hf", "from_hf", "reshard2"],
                    choices=["cp", "reshard", "to_hf", "from_hf", "reshard2"])
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--verify", action="store_true",
                    help="after timing it, check the TP5/PP2 reshard against the source bitwise")
    args = ap.parse_args()
    work = pathlib.Path(args.workdir)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    src = work / "src_tp1pp1"
    print(f"free disk: {free_bytes(work) / GB:.1f} GB", file=sys.stderr)
    if free_bytes(work) < 55 * GB:
        raise SystemExit("need ~55 GB free (two checkpoint copies plus an HF export)")
    try:
        t = time.perf_counter()
        total, largest, nparams = generate(src)
        subprocess.run(["sync"], check=True)
        print(f"generated {nparams / 1e9:.3f}B params, {total / GB:.2f} GB in {time.perf_counter() - t:.1f} s "
              f"(with sync); largest tensor {largest / 2**20:.1f} MiB", file=sys.stderr)

        rows = []
        model_file = src / f"iter_{ITERATION:07d}" / shard_dir_name(0, 0, 1) / "model.safetensors"
        weights = model_file.stat().st_size

        def measure(label, cmd, source, out, input_bytes, ref=None):
            pre = prepare(source)
            load = load_average()
            wall, rss = timed(cmd)
            out_bytes = du(out)
            ratio = "" if ref is None else f"{wall / ref:.2f}"
            rows.append((label, input_bytes, out_bytes, wall, ratio, rss, load))
            print(f"{label}: {wall:.1f} s, {rss / 2**20:.0f} MiB (pre-read {pre:.1f} s, load {load:.1f})",
                  file=sys.stderr, flush=True)
            return wall

        tp5pp2 = work / "tp5pp2"
        hf = work / "hf"
        if "cp" in args.steps:
            dst = work / "cp_copy"
            cp_wall = measure("`cp -r` (TP1/PP1 source)", ["cp", "-r", src, dst], src, dst, total)
            t = time.perf_counter()
            subprocess.run(["sync"], check=True)
            sync_s = time.perf_counter() - t
            rows.append(("`cp -r` + `sync` (the tools fsync)", total, total, cp_wall + sync_s, "", None, None))
            shutil.rmtree(dst)
            # The HF conversions move only the weights: their `cp` is of the model file alone.
            cp_weights = measure("`cp` of the weights alone (`model.safetensors`, bf16)",
                                 ["cp", model_file, work / "model_copy"], src, work / "model_copy", weights)
            t = time.perf_counter()
            subprocess.run(["sync"], check=True)
            rows.append(("`cp` of the weights + `sync`", weights, weights, cp_weights + time.perf_counter() - t,
                         "", None, None))
            (work / "model_copy").unlink()
        else:
            cp_wall = cp_weights = None
        if "reshard" in args.steps:
            measure("`reshard_checkpoint` TP1/PP1 → TP5/PP2",
                    [BIN / "reshard_checkpoint", "--load", src, "--save", tp5pp2, "--target-tp", 5, "--target-pp", 2],
                    src, tp5pp2, total, cp_wall)
            if args.verify:
                t = time.perf_counter()
                n = verify(src, tp5pp2, 5, 2)
                print(f"verified {n} tensors of the TP5/PP2 reshard bitwise against the source "
                      f"({time.perf_counter() - t:.1f} s)", file=sys.stderr, flush=True)
        if "to_hf" in args.steps:
            measure("`convert_hf --to-hf` (TP1/PP1 → HF, bf16)",
                    [BIN / "convert_hf", "--to-hf", "--load", src, "--save", hf], src, hf, weights, cp_weights)
        if "from_hf" in args.steps and hf.exists():
            back = work / "from_hf_tp1pp1"
            measure("`convert_hf --from-hf` (HF → TP1/PP1, no optimizer)",
                    [BIN / "convert_hf", "--from-hf", hf, "--save", back], hf, back, du(hf), cp_weights)
            shutil.rmtree(back)
        if hf.exists():
            shutil.rmtree(hf)
        if "reshard2" in args.steps and tp5pp2.exists():
            shutil.rmtree(src)  # at most two copies on disk
            tp1pp4 = work / "tp1pp4"
            measure("`reshard_checkpoint` TP5/PP2 → TP1/PP4",
                    [BIN / "reshard_checkpoint", "--load", tp5pp2, "--save", tp1pp4, "--target-tp", 1, "--target-pp", 4],
                    tp5pp2, tp1pp4, du(tp5pp2), cp_wall)
            shutil.rmtree(tp1pp4)

    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\nLargest tensor: {largest / 2**20:.1f} MiB (F32 `embedding.word_embeddings.weight` state, "
          f"50304 x 1600); RSS target 2x = {2 * largest / 2**20:.0f} MiB.\n")
    print("| step | read GB | written GB | wall s | × `cp` of the same bytes | peak RSS MiB | RSS / largest tensor | load avg |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, inp, out, wall, ratio, rss, load in rows:
        rss_s = "" if rss is None else f"{rss / 2**20:.0f}"
        rel = "" if rss is None else f"{rss / largest:.2f}"
        load_s = "" if load is None else f"{load:.1f}"
        print(f"| {label} | {inp / GB:.2f} | {out / GB:.2f} | {wall:.1f} | {ratio} | {rss_s} | {rel} | {load_s} |")


if __name__ == "__main__":
    main()
