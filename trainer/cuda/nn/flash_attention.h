// Causal flash attention in bf16 through cuDNN's fused SDPA (scaled dot-product attention)
// engines, driven by cudnn-frontend's graph API. Only attention.cc includes cudnn-frontend; this
// header stays plain C++ (the graphs live behind a pimpl).
//
// Layouts (no transposes or copies: cuDNN reads and writes strided views), QkvLayout:
//   kInterleaved: qkv [B, T, H·3·D] bf16, Megatron-Core's grouped layout when groups == heads:
//        [q_h k_h v_h] (each D wide) for h = 0..H−1, so Q, K, V are [B, H, T, D] views with
//        strides [T·3HD, 3D, 3HD, 1] at element offsets 0, D, 2D.
//   kGrouped: qkv [B, T, (H + 2G)·D], all query heads, then (k_g, v_g) per group (RearrangeQkv
//        makes it from Megatron's layout): Q [B, H, T, D] at offset 0, K and V [B, G, T, D] with
//        head stride 2D at offsets H·D and H·D + D. Grouped-query attention (G < H) needs it.
//   dqkv has the layout of qkv.
//   out  [B, T, H·D] bf16 (head-major inside a row); dout likewise.
//   stats [B, H, T] float: the natural-log log-sum-exp of each query row's scaled, masked scores
//        (cuDNN's "Stats": max_j s_ij + ln Σ_j exp(s_ij − max), s = q·k / sqrt(D)), kept for the
//        backward.
// Every pointer must be 16-byte aligned (cuDNN moves 16-byte vectors; cudaMalloc'd buffers and
// D % 8 == 0 give that), and all work runs on MainStream().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/nn/core_attention.h"

namespace leantron::trainer::cuda {

enum class QkvLayout { kInterleaved, kGrouped };

// A cheap shape-level pre-check of what Create can be expected to accept on Hopper: multi-head
// (groups == heads), head_dim a positive multiple of 8 and at most 256. Create is the authority
// (it asks cuDNN); this only lets a caller pick another attention path without building plans.
bool FlashAttentionSupported(int64_t head_dim, int64_t groups, int64_t heads);

// Causal self-attention, bf16 in/out, fp32 softmax statistics, scale 1/sqrt(head_dim), no dropout.
// One object per shape: it owns a cuDNN handle (bound to MainStream()) and the built forward and
// backward execution plans. Not thread-safe (a call reuses the object's variant packs). The
// backward is cuDNN's deterministic one: runs and resumes are bitwise repeatable.
class FlashAttention final : public CoreAttention {
 public:
  // Builds, checks support for, and caches the forward and backward execution plans for this
  // shape. Returns an error naming the shape and cuDNN's message when cuDNN cannot run it (e.g.
  // groups != heads, unsupported head dim, no usable device).
  static absl::StatusOr<std::unique_ptr<FlashAttention>> Create(
      int64_t batch, int64_t seq, int64_t heads, int64_t groups, int64_t head_dim,
      QkvLayout layout = QkvLayout::kInterleaved);
  ~FlashAttention() override;
  FlashAttention(const FlashAttention&) = delete;
  FlashAttention& operator=(const FlashAttention&) = delete;

  // Device scratch Forward and Backward need (the larger of the two; may be 0, then `workspace`
  // may be null). The deterministic backward keeps a bf16 [B, H, T, T]-sized dP buffer here
  // (T rounded up to 64), so it grows with B·H·T².
  size_t workspace_bytes() const override;

  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }

  // out [B, T, H·D] and stats [B, H, T] from qkv [B, T, 3·H·D]. Aborts with a message on a cuDNN
  // execution error.
  void Forward(bf16* out, float* stats, const bf16* qkv, void* workspace) override;
  // dqkv = (not +=) the gradient in qkv's layout, from dout [B, T, H·D] and the forward's qkv,
  // out and stats. Deterministic (bitwise-repeatable): built with cuDNN's deterministic backward.
  // Aborts with a message on a cuDNN execution error.
  void Backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* stats,
                void* workspace) override;

 private:
  struct Impl;
  FlashAttention(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int64_t k_offset,
                 int64_t v_offset, std::unique_ptr<Impl> impl);

  int64_t batch_, seq_, heads_, head_dim_;
  int64_t k_offset_, v_offset_;  // of K and V inside a qkv row
  std::unique_ptr<Impl> impl_;
};

}  // namespace leantron::trainer::cuda
