"""The seed tutorial's parallelism table for gpt2-large (36 layers, h 1280, 20 heads, seq 1024)
on two GPUs (device kind nvidia-h200-x2): 1 GPU, DP2, TP2, TP2+SP, PP2 with one micro-batch and
with enough to fill the pipeline, all `train --bf16`; step time, tokens/s, MFU and memory per
GPU, beside the tutorial's Megatron numbers, and each GPU's clock and power while busy. Run
through scripts/device_check.sh parallel."""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = ["--num-layers", "36", "--hidden-size", "1280", "--num-attention-heads", "20",
         "--seq-length", "1024", "--max-position-embeddings", "1024"]
# name, processes, micro-batch, global batch, extra flags, Megatron (ms, GB per GPU)
ROWS = [
    ("1 GPU", 1, 32, 32, [], "438 ms, ≈80 GB"),
    # The same run on the machine's second GPU: a data-parallel step waits for the slower one.
    ("1 GPU (the second)", 1, 32, 32, [], "–"),
    # Two independent 1-GPU runs at once, one per GPU, nothing exchanged: what sharing the host
    # (power, clocks, CPU) costs a step before any data-parallel communication.
    ("1 GPU on each GPU at once", 1, 32, 32, [], "–"),
    ("DP2", 2, 32, 64, ["--overlap-grad-reduce"], "437 ms"),
    # The whole reduction after the backward: nothing runs beside the compute, all of it exposed.
    ("DP2, reduction after the backward", 2, 32, 64, [], "–"),
    ("DP2, distributed optimizer", 2, 32, 64,
     ["--overlap-grad-reduce", "--use-distributed-optimizer", "--overlap-param-gather"], "–"),
    ("TP2", 2, 64, 64, ["--tensor-model-parallel-size", "2"], "543 ms, 86 GB"),
    ("TP2+SP", 2, 64, 64, ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
     "539 ms, 71.6 GB"),
    ("PP2, 1 micro-batch", 2, 64, 64, ["--pipeline-model-parallel-size", "2"],
     "817 ms, 61 / 88 GB"),
    ("PP2, 8 micro-batches", 2, 32, 256, ["--pipeline-model-parallel-size", "2"], "–"),
    # The last stage also runs the output layer (≈ 2.9 layers of work): one layer moves to rank 0.
    ("PP2, 8 micro-batches, 19 + 17 layers", 2, 32, 256,
     ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "19"], "–"),
]


def flops_per_token(layers=36, h=1280, seq=1024, vocab=50304):
    return layers * (3 * 2 * (h * 3 * h + h * h) + 3 * 2 * 2 * h * 4 * h + 3 * 2 * h * seq) + \
        3 * 2 * h * vocab


def command(bin_dir, procs, mb, gbs, extra, iters):
    cmd = [str(Path(bin_dir) / "train"), "--bf16", "--mock-data", "--tokenizer-type",
           "NullTokenizer", "--vocab-size", "50256", *MODEL, "--micro-batch-size", str(mb),
           "--global-batch-size", str(gbs), "--train-iters", str(iters), "--log-interval", "5",
           "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style", "cosine", "--hidden-dropout",
           "0", "--attention-dropout", "0", "--openai-gelu", "--eval-iters", "0", *extra]
    if procs > 1:
        cmd += ["--nproc-per-node", str(procs)]
    return cmd


def parse(p):
    if p.returncode != 0:
        return None, (p.stdout + p.stderr)[-1500:]
    out = p.stdout
    ms = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)", out)]
    steady = ms[1:] if len(ms) > 1 else ms
    mem = {int(r): int(m) for r, m in
           re.findall(r"\[Rank (\d+)\] GPU memory in use at the end: (\d+) MB", out)}
    reports = re.findall(r"(\[Rank \d+\] (?:step time|data-parallel).*)", out)
    layers = re.findall(r"\[Rank (\d+)\] tp \d+ pp \d+ dp \d+ \| layers (.*?) \|", out)
    return {"ms": sum(steady) / len(steady), "mem": mem, "reports": reports,
            "layers": layers}, None


class Clocks:
    """Samples every GPU's SM clock, power draw and power-cap flag with nvidia-smi while a row
    runs; summary() keeps the busy samples (utilization >= 90%), so start-up does not count."""
    FIELDS = "index,utilization.gpu,clocks.sm,power.draw,clocks_event_reasons.sw_power_cap"

    def __enter__(self):
        self.log = tempfile.TemporaryFile("w+")
        try:
            self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={self.FIELDS}",
                                          "--format=csv,noheader,nounits", "-lms", "200"],
                                         stdout=self.log, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
        return self

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()

    def summary(self):
        self.log.seek(0)
        per_gpu = {}
        for line in self.log:
            f = [x.strip() for x in line.split(",")]
            try:
                gpu, util, mhz, watts = int(f[0]), float(f[1]), float(f[2]), float(f[3])
            except (ValueError, IndexError):
                continue
            if util >= 90:
                per_gpu.setdefault(gpu, []).append((mhz, watts, "Active" in f[4]))
        return "; ".join(
            f"GPU {g}: SM {statistics.median(m for m, _, _ in s):.0f} MHz, "
            f"{statistics.median(w for _, w, _ in s):.0f} W, power-capped in "
            f"{100 * sum(c for _, _, c in s) / len(s):.0f}% of {len(s)} busy samples"
            for g, s in sorted(per_gpu.items()))


def run(bin_dir, procs, mb, gbs, extra, iters, gpus=(None,)):
    """Runs the layout once per entry of gpus at the same time (an entry is CUDA_VISIBLE_DEVICES,
    None to leave it alone); returns the first run's result with every run's step time."""
    cmd = command(bin_dir, procs, mb, gbs, extra, iters)

    def one(g):
        env = None if g is None else dict(os.environ, CUDA_VISIBLE_DEVICES=g)
        return parse(subprocess.run(cmd, capture_output=True, text=True, env=env))

    with Clocks() as clocks, ThreadPoolExecutor(len(gpus)) as pool:
        results = list(pool.map(one, gpus))
    for r, err in results:
        if r is None:
            return None, err
    first = results[0][0]
    first["each"] = [r["ms"] for r, _ in results]
    first["clocks"] = clocks.summary()
    return first, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--only", default="", help="row names separated by semicolons")
    ap.add_argument("--out", default=None)
    ap.add_argument("--extra", default="", help="flags added to every row (experiments)")
    a = ap.parse_args()
    lines = ["| layout | GPUs | micro / global | ms/step | tok/s per GPU | MFU | GPU memory per "
             "rank (GiB, in use) | Megatron (tutorial) |", "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    results = {}
    for name, procs, mb, gbs, extra, megatron in ROWS:
        if a.only and name not in a.only.split(";"):
            continue
        gpus = ("1",) if "second" in name else ("0", "1") if "at once" in name else (None,)
        r, err = run(a.bin, procs, mb, gbs, extra + shlex.split(a.extra), a.iters, gpus)
        if r is None:
            lines.append(f"| {name} | {procs} | {mb} / {gbs} | error: "
                         f"{err.replace(chr(10), ' ')[-300:]} | | | | {megatron} |")
            print(lines[-1], flush=True)
            continue
        results[name] = r
        tok = gbs * 1024 / (r["ms"] / 1000) / procs
        mfu = flops_per_token() * gbs * 1024 / (r["ms"] / 1000) / procs / 989e12 * 100
        mem = " / ".join(f"{m / 1024:.1f}" for _, m in sorted(r["mem"].items()))
        step = " / ".join(f"{ms:.1f}" for ms in r["each"])
        lines.append(f"| {name} | {procs} | {mb} / {gbs} | {step} | {tok:,.0f} | "
                     f"{mfu:.1f}% | {mem} | {megatron} |")
        print(lines[-1], flush=True)
        for rep in r["reports"]:
            print("   ", rep, flush=True)
        if r["clocks"]:
            print("    clocks:", r["clocks"], flush=True)
        for rank, lay in r["layers"]:
            print(f"    rank {rank}: layers {lay}", flush=True)
    for name in results:
        if not name.startswith("PP2, 8 micro-batches") or "1 GPU" not in results:
            continue
        # Same micro-batch (32): the PP2 step does 8 of them, each GPU half of every one.
        pp, one = results[name]["ms"], results["1 GPU"]["ms"]
        bubble = 1 - (8 * one / 2) / pp
        print(f"{name}: measured idle share {bubble * 100:.1f}% of the step "
              f"(1 - (8 x 1-GPU step / 2) / PP2 step); 1F1B bubble theory (PP-1)/(M+PP-1) = "
              f"{100 / 9:.1f}%", flush=True)
    # A data-parallel step waits for the slower GPU: its overhead against each GPU's own step.
    solo = [results[n]["ms"] for n in ("1 GPU", "1 GPU (the second)") if n in results]
    for name in results:
        if name.startswith("DP2") and solo:
            dp = results[name]["ms"]
            print(f"{name}: {dp:.1f} ms = " + " / ".join(
                f"{(dp / s - 1) * 100:+.1f}%" for s in sorted(solo, reverse=True)) +
                " against the 1-GPU step of the slower / faster GPU", flush=True)
            if "1 GPU on each GPU at once" in results:
                both = max(results["1 GPU on each GPU at once"]["each"])
                print(f"{name}: {(dp / both - 1) * 100:+.1f}% against the slower of the two 1-GPU "
                      "runs made at once", flush=True)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
