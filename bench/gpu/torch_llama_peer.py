"""The PyTorch peer of `train --bf16` for Llama-shaped models (bench/gpu/bench_train.py --runs
llama-1B:4,...): a pre-norm decoder with RMSNorm, rotary positions (rotate-half, optionally with
Llama 3.1's frequency scaling), grouped-query attention through scaled_dot_product_attention
(its flash kernel in bf16; keys and values shared by enable_gqa, or repeated with --attention
repeat), a SwiGLU MLP ([gate; up] in one product), no biases, a tied or untied output layer;
fp32 weights under bf16 autocast, fused AdamW, gradient clipping at 1.0, torch.compile. Random
tokens. Prints one JSON line: ms/step, tokens/s, TFLOP/s and MFU by Megatron's formula with GQA
and SwiGLU (bench/gpu/megatron_flops.py, 989 TFLOP/s peak), peak memory."""
import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_flops import flops_per_token  # noqa: E402


def inverse_frequencies(head_dim, base, scaling_factor=None, low=1.0, high=4.0, original=8192):
    """base^(-2i/d); with a factor, Llama 3.1's scaling (HF rope_type "llama3")."""
    inv = [base ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    if scaling_factor:
        out = []
        for f in inv:
            wavelength = 2 * math.pi / f
            if wavelength < original / high:
                out.append(f)
            elif wavelength > original / low:
                out.append(f / scaling_factor)
            else:
                t = (original / wavelength - low) / (high - low)
                out.append((1 - t) * f / scaling_factor + t * f)
        inv = out
    return torch.tensor(inv, dtype=torch.float64)


def rotate(x, cos, sin):
    """Rotate-half RoPE on [b, heads, s, d] with cos/sin [s, d], in x's dtype (bf16 under
    autocast: float32 tables would promote q and k and keep SDPA off its flash kernel)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Block(nn.Module):
    def __init__(self, h, heads, groups, head_dim, ffn, gqa):
        super().__init__()
        self.heads, self.groups, self.head_dim, self.gqa = heads, groups, head_dim, gqa
        self.attn_norm = nn.RMSNorm(h, eps=1e-5)
        self.qkv = nn.Linear(h, (heads + 2 * groups) * head_dim, bias=False)
        self.proj = nn.Linear(heads * head_dim, h, bias=False)
        self.mlp_norm = nn.RMSNorm(h, eps=1e-5)
        self.fc1 = nn.Linear(h, 2 * ffn, bias=False)  # [gate; up]
        self.fc2 = nn.Linear(ffn, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        d = self.head_dim
        q, k, v = self.qkv(self.attn_norm(x)).split(
            [self.heads * d, self.groups * d, self.groups * d], dim=-1)
        q = rotate(q.view(b, s, self.heads, d).transpose(1, 2), cos, sin)
        k = rotate(k.view(b, s, self.groups, d).transpose(1, 2), cos, sin)
        v = v.view(b, s, self.groups, d).transpose(1, 2)
        if self.gqa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            repeat = self.heads // self.groups
            y = F.scaled_dot_product_attention(q, k.repeat_interleave(repeat, dim=1),
                                               v.repeat_interleave(repeat, dim=1), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, self.heads * d))
        gate, up = self.fc1(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        head_dim = a.kv_channels or a.hidden // a.heads
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.blocks = nn.ModuleList(
            Block(a.hidden, a.heads, a.kv_heads, head_dim, a.ffn, a.attention == "gqa")
            for _ in range(a.layers))
        self.norm = nn.RMSNorm(a.hidden, eps=1e-5)
        self.output = None if a.tied else nn.Linear(a.hidden, a.vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        angles = torch.outer(torch.arange(a.seq, dtype=torch.float64),
                             inverse_frequencies(head_dim, a.rope_base, a.rope_scaling_factor))
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, idx, targets):
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        x = self.norm(x)
        logits = F.linear(x, self.embed.weight if self.output is None else self.output.weight)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def profile_kernels(step, steps):
    """GPU time per kernel over `steps` steps, per step, largest first, to stderr."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()

    def us(e):  # device_time_total from torch 2.4 on, cuda_time_total before
        return getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)

    rows = [(us(e) / 1000 / steps, e.count // steps, e.key)
            for e in prof.key_averages() if us(e) > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"GPU time by kernel over {steps} steps ({total:.1f} ms per step):", file=sys.stderr)
    for ms, count, name in rows[:60]:
        print(f"  {ms:8.2f} ms/step {100 * ms / total:5.1f}% x{count:<4d} {name[:110]}",
              file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--kv-channels", type=int, default=0, help="head dim (default hidden/heads)")
    ap.add_argument("--ffn", type=int, required=True)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--tied", action="store_true", help="output layer = word embeddings")
    ap.add_argument("--rope-base", type=float, default=500000.0)
    ap.add_argument("--rope-scaling-factor", type=float, default=None,
                    help="Llama 3.1 scaling with this factor (default: none)")
    ap.add_argument("--attention", choices=["gqa", "repeat"], default="gqa",
                    help="SDPA with enable_gqa, or K/V repeated to every head")
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--profile", type=int, default=0,
                    help="after the timed steps, this many more under torch.profiler: GPU time "
                         "per kernel per step to stderr")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = Llama(a).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    step_model = model if a.no_compile else torch.compile(model)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step():
        idx = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), device="cuda", generator=gen)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1000 / a.steps
    if a.profile:
        profile_kernels(step, a.profile)
    tokens = a.micro_batch * a.seq
    flops = flops_per_token(a.layers, a.hidden, a.seq, a.vocab, a.ffn, a.heads, a.kv_heads,
                            a.kv_channels or a.hidden // a.heads, swiglu=True) * tokens
    print(json.dumps({
        "peer": f"torch {torch.__version__} {'eager' if a.no_compile else 'compile'} "
                f"({a.attention})",
        "layers": a.layers, "hidden": a.hidden, "micro_batch": a.micro_batch,
        "ms_per_step": round(ms, 1), "tokens_per_s": round(tokens / ms * 1000),
        "tflops": round(flops / ms / 1e9, 1), "mfu": round(flops / ms / 1e9 / 989 * 100, 1),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
        "loss": round(float(loss), 3)}), flush=True)


if __name__ == "__main__":
    main()
