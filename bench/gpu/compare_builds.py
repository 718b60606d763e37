"""Two builds of `train` side by side in one device call: whether their loss curves are equal bit
for bit (every iteration's lm loss and grad norm, every validation loss, as printed), and their
step times, the runs alternating so that drift of the machine (clocks, power) falls on both.
A refactoring that keeps the order of operations must show identical curves and equal speed.

  python3 bench/gpu/compare_builds.py --base DIR --new DIR [--cases NAME,...] [--reps N]

Each case names its flags; where a switch changed from an environment variable to a flag, a case
gives each build its own. Run through scripts/device_check.sh compare."""
import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

SMALL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
         "--seq-length", "256", "--max-position-embeddings", "256", "--micro-batch-size", "4",
         "--global-batch-size", "16", "--train-iters", "30", "--lr", "3e-4", "--min-lr", "3e-5",
         "--lr-warmup-iters", "5", "--lr-decay-style", "cosine", "--log-interval", "1",
         "--eval-interval", "10", "--eval-iters", "2", "--hidden-dropout", "0.1",
         "--attention-dropout", "0", "--seed", "5", "--deterministic-mode"]
GPT2_774M = ["--num-layers", "36", "--hidden-size", "1280", "--num-attention-heads", "20",
             "--seq-length", "1024", "--max-position-embeddings", "1024", "--micro-batch-size",
             "32", "--global-batch-size", "32", "--train-iters", "20", "--log-interval", "5",
             "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style", "cosine",
             "--hidden-dropout", "0", "--attention-dropout", "0", "--openai-gelu",
             "--eval-iters", "0"]
LARGE = ["--num-layers", "36", "--hidden-size", "1280", "--num-attention-heads", "20",
         "--seq-length", "1024", "--max-position-embeddings", "1024", "--train-iters", "12",
         "--log-interval", "4", "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style", "cosine",
         "--hidden-dropout", "0", "--attention-dropout", "0", "--openai-gelu", "--eval-iters", "0"]
GPT2_1_5B = ["--num-layers", "48", "--hidden-size", "1600", "--num-attention-heads", "25",
             "--seq-length", "1024", "--max-position-embeddings", "1024", "--micro-batch-size",
             "16", "--global-batch-size", "16", "--train-iters", "12", "--log-interval", "4",
             "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style", "cosine",
             "--hidden-dropout", "0", "--attention-dropout", "0", "--openai-gelu",
             "--eval-iters", "0"]
FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "16",
       "--fp8-amax-compute-algo", "max"]
LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--disable-bias-linear"]
DATA = ["--bf16", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "50256"]

# name: (GPUs, kind, flags for both, {"base": (extra flags, env), "new": (extra flags, env)})
CASES = {
    # Loss curves, one GPU.
    "tanh": (1, "loss", SMALL + ["--openai-gelu"], {}),
    "erf-untied": (1, "loss", SMALL + ["--untie-embeddings-and-output-weights"], {}),
    "recompute": (1, "loss", SMALL + ["--openai-gelu", "--recompute-granularity", "full",
                                      "--recompute-method", "block", "--recompute-num-layers", "2",
                                      "--recompute-gelu"], {}),
    "recompute-full": (1, "loss", SMALL + ["--openai-gelu", "--recompute-granularity", "full",
                                           "--recompute-method", "uniform",
                                           "--recompute-num-layers", "1"], {}),
    "recompute-gelu": (1, "loss", SMALL + ["--openai-gelu", "--recompute-gelu"], {}),
    # Loss curves, two GPUs.
    "dp2": (2, "loss", SMALL + ["--openai-gelu", "--overlap-grad-reduce"], {}),
    "dp2-distopt": (2, "loss", SMALL + ["--openai-gelu", "--overlap-grad-reduce",
                                        "--use-distributed-optimizer", "--overlap-param-gather"],
                    {}),
    "dp2-distopt-nccl": (2, "loss", SMALL + ["--openai-gelu", "--overlap-grad-reduce",
                                             "--use-distributed-optimizer"],
                         {"base": ([], {"LEANTRON_DP_COPY_ENGINE": "0"}),
                          "new": (["--no-dp-copy-engine"], {})}),
    "tp2": (2, "loss", SMALL + ["--openai-gelu", "--tensor-model-parallel-size", "2"], {}),
    "tp2-sp": (2, "loss", SMALL + ["--openai-gelu", "--tensor-model-parallel-size", "2",
                                   "--sequence-parallel"], {}),
    "tp2-sp-nccl": (2, "loss", SMALL + ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
                    {"base": ([], {"LEANTRON_TP_COPY_ENGINE": "0"}),
                     "new": (["--no-tp-copy-engine"], {})}),
    "pp2": (2, "loss", SMALL + ["--openai-gelu", "--pipeline-model-parallel-size", "2"], {}),
    "pp2-interleaved": (2, "loss", SMALL + ["--openai-gelu", "--pipeline-model-parallel-size",
                                            "2", "--num-layers-per-virtual-pipeline-stage", "1"],
                        {}),
    "fp8": (1, "loss", SMALL + ["--openai-gelu"] + FP8, {}),
    "fp8-llama": (1, "loss", SMALL + LLAMA + FP8, {}),
    "fp8-tensorwise": (1, "loss", SMALL + ["--openai-gelu", "--fp8-format", "hybrid",
                                           "--fp8-recipe", "tensorwise"], {}),
    "offload": (1, "loss", SMALL + ["--openai-gelu", "--optimizer-cpu-offload"], {}),
    # Step times.
    "774M": (1, "speed", GPT2_774M, {}),
    "774M-fp8": (1, "speed", GPT2_774M + FP8[:-4] + ["--fp8-amax-history-len", "1024",
                                                      "--fp8-amax-compute-algo", "max"], {}),
    "1.5B-offload": (1, "speed", GPT2_1_5B + ["--optimizer-cpu-offload"], {}),
    "large-dp2": (2, "speed", LARGE + ["--micro-batch-size", "32", "--global-batch-size", "64",
                                       "--overlap-grad-reduce"], {}),
    "large-dp2-distopt": (2, "speed", LARGE + ["--micro-batch-size", "32", "--global-batch-size",
                                               "64", "--overlap-grad-reduce",
                                               "--use-distributed-optimizer",
                                               "--overlap-param-gather"], {}),
    "large-tp2-sp": (2, "speed", LARGE + ["--micro-batch-size", "64", "--global-batch-size", "64",
                                          "--tensor-model-parallel-size", "2",
                                          "--sequence-parallel"], {}),
    "large-pp2": (2, "speed", LARGE + ["--micro-batch-size", "32", "--global-batch-size", "256",
                                       "--pipeline-model-parallel-size", "2"], {}),
}


def run(bin_dir, gpus, flags, extra, env):
    cmd = [str(Path(bin_dir) / "train"), *DATA, *flags, *extra]
    if gpus > 1:
        cmd += ["--nproc-per-node", str(gpus)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **env))
    return p.returncode, p.stdout, p.stderr


def curve(out):
    lines = re.findall(r"lm loss: \S+ \| loss scale: \S+ \| grad norm: \S+", out)
    return lines + re.findall(r"validation loss at iteration \d+ \| lm loss value: \S+", out)


def step_ms(out):
    ms = [float(x) for x in re.findall(r"elapsed time per iteration \(ms\): ([\d.]+)", out)]
    return statistics.mean(ms[1:] if len(ms) > 1 else ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="folder holding the reference build's train")
    ap.add_argument("--new", required=True, help="folder holding the build under test's train")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all that "
                    "fit the GPUs here)")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2, help="runs of each build per speed case")
    a = ap.parse_args()
    names = a.cases.split(",") if a.cases else [n for n, c in CASES.items() if c[0] <= a.gpus]
    failed = False
    for name in names:
        gpus, kind, flags, per = CASES[name]
        builds = {b: per.get(b, ([], {})) for b in ("base", "new")}
        dirs = {"base": a.base, "new": a.new}
        if kind == "loss":
            curves = {}
            for b in ("base", "new"):
                rc, out, err = run(dirs[b], gpus, flags, *builds[b])
                if rc != 0:
                    print(f"{name}: {b} failed (rc {rc}): {(out + err)[-800:]}", flush=True)
                    failed = True
                curves[b] = curve(out)
            same = curves["base"] == curves["new"] and len(curves["new"]) > 0
            print(f"{name}: loss curves {'identical' if same else 'DIFFER'} "
                  f"({len(curves['new'])} values)", flush=True)
            if not same:
                failed = True
                for x, y in zip(curves["base"], curves["new"]):
                    if x != y:
                        print(f"    first difference: base {x} | new {y}", flush=True)
                        break
            continue
        times = {"base": [], "new": []}
        for _ in range(a.reps):
            for b in ("base", "new"):
                rc, out, err = run(dirs[b], gpus, flags, *builds[b])
                if rc != 0:
                    print(f"{name}: {b} failed (rc {rc}): {(out + err)[-800:]}", flush=True)
                    failed = True
                    continue
                times[b].append(step_ms(out))
        if times["base"] and times["new"]:
            base, new = statistics.median(times["base"]), statistics.median(times["new"])
            print(f"{name}: base {base:.1f} ms/step {times['base']}, new {new:.1f} ms/step "
                  f"{times['new']}: {(new / base - 1) * 100:+.2f}%", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
