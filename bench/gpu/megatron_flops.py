"""Megatron-LM's model FLOPs per token (num_floating_point_operations in
megatron/training/training.py) for a dense GPT, as `train` logs them: every product three times
(forward, data and weight gradients) at two FLOPs per multiply-add; queries heads·kv_channels wide,
keys and values query_groups·kv_channels; SwiGLU's fc1 twice as wide; causal attention half of the
score matrix; the logits once whether the output layer is tied or not. No torch needed."""


def flops_per_token(layers, hidden, seq, vocab, ffn, heads, query_groups=None, kv_channels=None,
                    swiglu=False):
    query_groups = query_groups or heads
    kv_channels = kv_channels or hidden // heads
    q, kv = kv_channels * heads, kv_channels * query_groups
    layer = (hidden * (q + 2 * kv) + q * hidden      # QKV and output projections
             + (3 if swiglu else 2) * hidden * ffn   # fc1 ([gate; up] with SwiGLU) and fc2
             + q * seq)                              # causal QK^T and (QK^T)V
    return 3 * 2 * (layers * layer + hidden * vocab)


def _check():
    # The GPT-2 formula of ../shared/specs/trainer.md and the Llama-3.2-1B value worked out by hand
    # in tests/trainer/flops_test.cc.
    h, s, v = 768, 1024, 50304
    gpt2 = 12 * (3 * 2 * (h * 3 * h + h * h) + 3 * 2 * 2 * h * 4 * h + 3 * 2 * h * s) + 3 * 2 * h * v
    assert flops_per_token(12, h, s, v, 4 * h, 12) == gpt2
    assert flops_per_token(16, 2048, 4096, 128256, 8192, 32, 8, 64, True) * 4096 == 33668248633344


if __name__ == "__main__":
    _check()
    print("megatron_flops: ok")
