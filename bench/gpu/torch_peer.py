"""The PyTorch peer for bench/gpu: a nanoGPT-style GPT-2 (pre-LayerNorm, tanh GELU, learned
positions, tied output, scaled_dot_product_attention), bf16 autocast, fused AdamW, gradient
clipping at 1.0, torch.compile; with --float8, torchao's float8 training of the blocks' linear
layers (`convert_to_float8_training`, the output layer stays bf16 as Megatron's and ours do).
Random tokens; prints one JSON line with ms/step, tokens/s, MFU
(Megatron's formula, 989 TFLOP/s) and peak memory. Same shapes as `train --bf16` in
bench/gpu/bench_train.py."""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(h)
        self.c_attn = nn.Linear(h, 3 * h)
        self.attn_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h)
        self.c_fc = nn.Linear(h, 4 * h)
        self.mlp_proj = nn.Linear(4 * h, h)

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, h))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, h, heads, vocab, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def megatron_flops_per_token(layers, h, seq, vocab, ffn):
    return layers * (3 * 2 * (h * 3 * h + h * h) + 3 * 2 * 2 * h * ffn + 3 * 2 * h * seq) + \
        3 * 2 * h * vocab


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--float8", choices=["tensorwise", "rowwise"], default=None,
                    help="torchao's float8 training recipe for the blocks' nn.Linear layers")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(a.layers, a.hidden, a.heads, a.vocab, a.seq).cuda()
    if a.float8:  # every nn.Linear is a block's: the output layer is F.linear of the embedding
        import torchao
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(a.float8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    step_model = model if a.no_compile else torch.compile(model)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step():
        idx = torch.randint(0, 50257, (a.micro_batch, a.seq + 1), device="cuda", generator=gen)
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
    tokens = a.micro_batch * a.seq
    flops = megatron_flops_per_token(a.layers, a.hidden, a.seq, a.vocab, 4 * a.hidden) * tokens
    print(json.dumps({
        "peer": "torch " + torch.__version__ + (" eager" if a.no_compile else " compile") +
                (f" + torchao {torchao.__version__} float8 {a.float8}" if a.float8 else ""),
        "layers": a.layers, "hidden": a.hidden, "micro_batch": a.micro_batch,
        "ms_per_step": round(ms, 1), "tokens_per_s": round(tokens / ms * 1000),
        "tflops": round(flops / ms / 1e9, 1), "mfu": round(flops / ms / 1e9 / 989 * 100, 1),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
        "loss": round(float(loss), 3)}), flush=True)


if __name__ == "__main__":
    main()
