// The cpu backend's block attention (Ops::BlockAttentionForward/Backward): attention between
// queries and keys at arbitrary positions of their sample, with the log-sum-exp merge that ring
// attention and document masks are built on. Float32 products, float64 softmax sums.
#pragma once

#include "trainer/reference/ops.h"

namespace leantron::trainer {

void CpuBlockAttentionForward(float* out, float* lse, const float* qkv, const float* kv,
                              const BlockAttentionArgs& args, const AttentionDropout& dropout,
                              bool merge);
void CpuBlockAttentionBackward(float* dqkv, float* dkv, const float* dout, const float* out,
                               const float* lse, const float* qkv, const float* kv,
                               const BlockAttentionArgs& args, const AttentionDropout& dropout);

}  // namespace leantron::trainer
