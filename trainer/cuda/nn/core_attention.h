// Core attention of the bf16 model: softmax(q·kᵀ/√d, causal)·v for this rank's heads, between the
// QKV and output projections (AttentionBlock). An interface, so that what computes it can change
// without the block knowing: FlashAttention (cuDNN, the whole sequence on this GPU) today; a
// context-parallel attention wraps a local one and exchanges K/V (or heads) with the other ranks
// of the cp group.
#pragma once

#include <cstddef>

#include "trainer/cuda/cuda_util.h"

namespace leantron::trainer::cuda {

class CoreAttention {
 public:
  virtual ~CoreAttention() = default;
  // Device scratch Forward and Backward need (may be 0, then `workspace` may be null).
  virtual size_t workspace_bytes() const = 0;
  // out [B, T, heads·D] and the per-row log-sum-exp stats [B, heads, T] from qkv
  // [B, T, (heads + 2·groups)·D] in Megatron-Core's layout; all on MainStream().
  virtual void Forward(bf16* out, float* stats, const bf16* qkv, void* workspace) = 0;
  // dqkv written (not accumulated), from dout and the forward's qkv, out and stats.
  virtual void Backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                        const float* stats, void* workspace) = 0;
};

}  // namespace leantron::trainer::cuda
