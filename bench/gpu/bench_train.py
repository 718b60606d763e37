"""Single-GPU training speed: `train --bf16` next to a PyTorch peer with identical shapes and
random tokens: GPT-2 shapes (seq 1024) against bench/gpu/torch_peer.py, Llama shapes (seq 4096:
RMSNorm, SwiGLU, RoPE with Llama 3.2's scaling, grouped-query attention, tied) against
bench/gpu/torch_llama_peer.py. Prints one markdown row per run and writes the table to --out.
Run on the device machine (scripts/device_check.sh bench), e.g. --runs llama-1B:4,llama-3B:2."""
import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_flops import flops_per_token  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODELS = {  # name: layers, hidden, heads
    "124M": (12, 768, 12),
    "350M": (24, 1024, 16),
    "774M": (36, 1280, 20),
    "1.5B": (48, 1600, 25),
}
GPT_SEQ, GPT_VOCAB = 1024, 50304  # 50257 padded to a multiple of 128
# Llama shapes: layers, hidden, heads, KV heads, ffn, vocab, tied, seq, rope base, rope scaling
# factor (Llama 3.2's 32; None: unscaled).
LLAMA = {
    "llama-1B": dict(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=128256,
                     tied=True, seq=4096, rope_base=500000, rope_scaling=32.0),
    # Llama-3-8B: untied, no rope scaling; on 2 GPUs with --nproc 2 and TP2+SP in --extra.
    "llama-8B": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                     tied=False, seq=8192, rope_base=500000, rope_scaling=None),
    "llama-3B": dict(layers=28, hidden=3072, heads=24, kv_heads=8, ffn=8192, vocab=128256,
                     tied=True, seq=4096, rope_base=500000, rope_scaling=32.0),
}


def llama_train_flags(m):
    """Megatron's flags for a Llama shape (NullTokenizer: --vocab-size + 1 = the vocabulary)."""
    flags = ["--num-layers", m["layers"], "--hidden-size", m["hidden"],
             "--num-attention-heads", m["heads"], "--group-query-attention",
             "--num-query-groups", m["kv_heads"], "--kv-channels", m["hidden"] // m["heads"],
             "--ffn-hidden-size", m["ffn"], "--normalization", "RMSNorm", "--swiglu",
             "--position-embedding-type", "rope", "--rotary-base", m["rope_base"],
             "--disable-bias-linear", "--seq-length", m["seq"],
             "--max-position-embeddings", m["seq"], "--vocab-size", m["vocab"] - 1]
    if m["rope_scaling"]:
        flags += ["--use-rope-scaling", "--rope-scaling-factor", m["rope_scaling"]]
    if not m["tied"]:
        flags.append("--untie-embeddings-and-output-weights")
    return [str(f) for f in flags]


def shape(name):
    """(train flags for the model, seq, FLOPs per token)."""
    if name in LLAMA:
        m = LLAMA[name]
        return (llama_train_flags(m), m["seq"],
                flops_per_token(m["layers"], m["hidden"], m["seq"], m["vocab"], m["ffn"],
                                m["heads"], m["kv_heads"], m["hidden"] // m["heads"], swiglu=True))
    layers, h, heads = MODELS[name]
    flags = ["--num-layers", str(layers), "--hidden-size", str(h), "--num-attention-heads",
             str(heads), "--seq-length", str(GPT_SEQ), "--max-position-embeddings", str(GPT_SEQ),
             "--vocab-size", "50256", "--openai-gelu"]
    return flags, GPT_SEQ, flops_per_token(layers, h, GPT_SEQ, GPT_VOCAB, 4 * h, heads)


def data_parallel(nproc, extra):
    """The data-parallel size of `nproc` ranks under the model-parallel flags in `extra`."""
    model = 1
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--context-parallel-size"):
        if flag in extra:
            model *= int(extra[extra.index(flag) + 1])
    return max(1, nproc // model)


def run_ours(bin_dir, name, mb, iters, extra, nproc=1, accumulate=1):
    """One run of train; with nproc > 1 (model-parallel flags in `extra`, the rest data parallel:
    the global batch is `accumulate` micro-batches per data-parallel rank) tokens/s, TFLOP/s and
    MFU are per GPU, memory the logging rank's."""
    flags, seq, per_token = shape(name)
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    gbs = mb * data_parallel(nproc, extra) * accumulate
    cmd = [str(Path(bin_dir) / "train"), "--bf16"] + launch + [
           "--mock-data", "--tokenizer-type", "NullTokenizer"] + flags + [
           "--micro-batch-size", str(mb), "--global-batch-size", str(gbs), "--train-iters",
           str(iters), "--log-interval", "5", "--log-throughput", "--lr", "1e-4", "--min-lr",
           "1e-5", "--lr-decay-style", "cosine", "--hidden-dropout", "0", "--attention-dropout",
           "0", "--eval-iters", "0"] + extra
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr)[-2000:]}
    ms = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)", proc.stdout)]
    steady = ms[1:] if len(ms) > 1 else ms  # the first interval holds the warm-up
    ms_step = sum(steady) / len(steady)
    mem = re.search(r"GPU in use: (\d+) \| of which (?:parameters|fp32 norms and embeddings|fp32 "
                    r"weights \(this rank's part, norms and embeddings whole\)) "
                    r"(\d+), gradients (\d+), Adam state (\d+), bf16 weights, activations and "
                    r"workspaces (\d+)", proc.stdout)
    host = re.search(r"host \(--optimizer-cpu-offload\): fp32 weights (\d+), Adam state (\d+)",
                     proc.stdout)
    step = re.search(r"optimizer on the host \((\d+) threads\): .*?, ([\d.]+) ms per step .*?, "
                     r"([\d.]+) ms of it stepping", proc.stdout)
    alloc_mib = sum(int(mem.group(i)) for i in range(2, 6)) if mem else -1
    tokens = gbs * seq / nproc
    tflops = per_token * tokens / ms_step / 1e9
    loss = re.findall(r"lm loss: ([\d.E+-]+)", proc.stdout)
    out = {"peer": "leantron train --bf16" + (f" ({nproc} GPUs)" if nproc > 1 else "") +
           (f" (global batch {gbs})" if accumulate > 1 else "") +
           (" " + " ".join(extra) if extra else ""),
           "model": name, "micro_batch": mb, "ms_per_step": round(ms_step, 1),
           "tokens_per_s": round(tokens / ms_step * 1000), "tflops": round(tflops, 1),
           "mfu": round(tflops / 989 * 100, 1), "peak_gib": round(alloc_mib / 1024, 1),
           "in_use_gib": round(int(mem.group(1)) / 1024, 1) if mem else -1,
           "loss": float(loss[-1]) if loss else None}
    if host:  # --optimizer-cpu-offload: what the host holds, and its step
        out["host_gib"] = round((int(host.group(1)) + int(host.group(2))) / 1024, 1)
    if step:
        out["host_step_ms"] = float(step.group(2))
        out["host_compute_ms"] = float(step.group(3))
        out["host_threads"] = int(step.group(1))
    split = re.search(r"FP8 products ([\d.]+) ms, FP8 casts ([\d.]+) ms, bf16 products ([\d.]+) ms",
                      proc.stdout + proc.stderr)
    if split:  # --fp8-format: the GPU time of the products by precision, per step
        out["fp8_products_ms"], out["fp8_casts_ms"], out["bf16_products_ms"] = map(
            float, split.groups())
    if "--timing-log-level" in extra:  # the per-op GPU time table
        out["profile"] = proc.stderr[-3000:]
    return out


def run_peer(name, mb, compile_, float8=None):
    if name in LLAMA and float8:
        return {"error": "the torchao float8 peer runs the GPT-2 shapes"}
    if name in LLAMA:
        m = LLAMA[name]
        cmd = [sys.executable, str(ROOT / "bench/gpu/torch_llama_peer.py"), "--layers",
               str(m["layers"]), "--hidden", str(m["hidden"]), "--heads", str(m["heads"]),
               "--kv-heads", str(m["kv_heads"]), "--ffn", str(m["ffn"]), "--vocab",
               str(m["vocab"]), "--seq", str(m["seq"]), "--rope-base", str(m["rope_base"]),
               "--micro-batch", str(mb)]
        if m["rope_scaling"]:
            cmd += ["--rope-scaling-factor", str(m["rope_scaling"])]
        if m["tied"]:
            cmd.append("--tied")
    else:
        layers, h, heads = MODELS[name]
        cmd = [sys.executable, str(ROOT / "bench/gpu/torch_peer.py"), "--layers", str(layers),
               "--hidden", str(h), "--heads", str(heads), "--micro-batch", str(mb)]
    if not compile_:
        cmd.append("--no-compile")
    if float8:
        cmd += ["--float8", float8]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr)[-2000:]}
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    r["model"] = name
    return r


def row(r):
    if "error" in r:
        return "| error | " + r["error"].replace("\n", " ")[-300:] + " |"
    return (f"| {r['peer']} | {r['model']} | {r['micro_batch']} | {r['ms_per_step']} | "
            f"{r['tokens_per_s']:,} | {r['tflops']} | {r['mfu']}% | {r['peak_gib']} GiB |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    ap.add_argument("--runs", default="124M:32,774M:16,774M:32,1.5B:16",
                    help="model:micro-batch list; models: " + ", ".join([*MODELS, *LLAMA]))
    ap.add_argument("--iters", type=int, default=20)
    # torchao: compiled, with torchao's float8 training (tensorwise), the package carried by
    # scripts/device_bundle.sh --torchao.
    ap.add_argument("--peer", choices=["compile", "eager", "torchao", "none"], default="compile")
    ap.add_argument("--extra", default="", help="extra flags for train (space-separated)")
    ap.add_argument("--nproc", type=int, default=1,
                    help="GPUs per run of ours (with TP/PP flags in --extra; the peer runs on one)")
    ap.add_argument("--accumulate", type=int, default=1,
                    help="micro-batches per step and data-parallel rank, for ours (the peer: one)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.accumulate > 1 and a.peer != "none":
        ap.error("--accumulate needs --peer none (the peer steps after every micro-batch)")
    lines = ["| run | model | micro-batch | ms/step | tok/s | TFLOP/s | MFU | peak memory |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    results = []
    for spec in a.runs.split(","):
        name, mb = spec.split(":")
        ours = run_ours(a.bin, name, int(mb), a.iters, a.extra.split(), a.nproc, a.accumulate)
        results.append(ours)
        lines.append(row(ours))
        print(lines[-1], flush=True)
        if "profile" in ours:
            print(ours["profile"], flush=True)
        if a.peer != "none":
            peer = run_peer(name, int(mb), a.peer != "eager",
                            "tensorwise" if a.peer == "torchao" else None)
            results.append(peer)
            lines.append(row(peer))
            print(lines[-1], flush=True)
            if "error" not in ours and "error" not in peer:
                print(f"  speed-up vs peer: {peer['ms_per_step'] / ours['ms_per_step']:.2f}x",
                      flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n\n" + json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
