"""PyTorch's causal attention kernels on one Llama-1B layer's shape (micro-batch 2, 32 query heads,
seq 4096, head dim 64), with grouped key/value heads (8) and with full ones (32), through
scaled_dot_product_attention's cuDNN and FlashAttention-2 backends: forward and backward GPU time
per call and TFLOP/s (causal: half the square; the backward counted as 2.5 forwards). The
reference for `train`'s per-op attention times (`--timing-log-level 2`, divided by the layers).

  python3 bench/gpu/sdpa_probe.py   (on the device machine)"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, H, T, D = 2, 32, 4096, 64


def bench(kv_heads, backend, reps=20):
    torch.manual_seed(0)
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, kv_heads, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, kv_heads, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel([backend]):
        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  enable_gqa=kv_heads != H)
        for _ in range(3):
            forward().backward(grad)
        torch.cuda.synchronize()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        fwd = bwd = 0.0
        for _ in range(reps):
            ev[0].record()
            out = forward()
            ev[1].record()
            out.backward(grad)
            ev[2].record()
            torch.cuda.synchronize()
            fwd += ev[0].elapsed_time(ev[1])
            bwd += ev[1].elapsed_time(ev[2])
    flops = 4 * B * H * T * T * D / 2
    fwd, bwd = fwd / reps, bwd / reps
    return fwd, bwd, flops / fwd / 1e9, 2.5 * flops / bwd / 1e9


def main():
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        for kv_heads in (8, 32):
            fwd, bwd, tf_fwd, tf_bwd = bench(kv_heads, backend)
            print(f"{backend.name} kv heads {kv_heads}: forward {fwd:.3f} ms ({tf_fwd:.0f} "
                  f"TFLOP/s), backward {bwd:.3f} ms ({tf_bwd:.0f} TFLOP/s)", flush=True)


if __name__ == "__main__":
    main()
