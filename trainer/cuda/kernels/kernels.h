// CUDA kernels of the trainer: fused norms, elementwise ops, embeddings, losses and the optimizer.
// Templated launchers take T ∈ {float, bf16} activations; parameters, their gradients, norm
// statistics and losses are always float. Everything runs on the given stream and accumulates in
// float. Every reduction is deterministic (fixed-order partial sums in the caller's Scratch, no
// floating-point atomics), so two runs on the same device give bitwise-identical results.
// *ScratchBytes() query the current device; ColumnSumScratchBytes never decreases as rows or cols
// grow, so one buffer sized for the widest bias serves every narrower one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/kernels/fp8.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer::cuda {

template <typename T>
void ConvertFromFloat(T* out, const float* in, size_t n, cudaStream_t s);
template <typename T>
void Fill(T* p, size_t n, float value, cudaStream_t s);

// x = residual + Dropout(branch) written to x_out, when residual != nullptr; else x = branch (no
// dropout, x_out unused, may be null). Then out = LayerNorm(x)·w + b (b may be null), keeping mean
// and rstd per row (either may be null). In bf16 the LayerNorm reads x as stored in x_out.
// With branch2 (only with a residual) the branch is branch + branch2 rounded to T: two partial
// sums of a tensor-parallel product, added as a reduce-scatter would. With fp8.q the output is
// written cast to FP8 instead of to `out` (which may be null).
template <typename T>
void AddLayerNormForward(T* x_out, T* out, float* mean, float* rstd, const T* residual,
                         const T* branch, const float* w, const float* b, int64_t rows,
                         int64_t cols, float eps, const HiddenDropout& drop, cudaStream_t s,
                         const T* branch2 = nullptr, const Fp8Out& fp8 = {});
// dx = dresidual + (∂LayerNorm/∂x)ᵀ·dout (dresidual may be null = zeros; dx may alias dresidual;
// x is the LayerNorm input); dw += Σ_rows, db += Σ_rows (db may be null); if dbranch != nullptr,
// dbranch = dx with the dropout mask of `drop` applied (kept ·1/(1−p), dropped 0).
template <typename T>
void LayerNormBackward(T* dx, T* dbranch, float* dw, float* db, const T* dout, const T* dresidual,
                       const T* x, const float* w, const float* mean, const float* rstd,
                       int64_t rows, int64_t cols, const HiddenDropout& drop, Scratch scratch,
                       cudaStream_t s);
size_t LayerNormBackwardScratchBytes(int64_t rows, int64_t cols);

// RMSNorm counterparts (no mean, no bias): out = x·rstd·w.
template <typename T>
void AddRmsNormForward(T* x_out, T* out, float* rstd, const T* residual, const T* branch,
                       const float* w, int64_t rows, int64_t cols, float eps,
                       const HiddenDropout& drop, cudaStream_t s, const T* branch2 = nullptr,
                       const Fp8Out& fp8 = {});
template <typename T>
void RmsNormBackward(T* dx, T* dbranch, float* dw, const T* dout, const T* dresidual, const T* x,
                     const float* w, const float* rstd, int64_t rows, int64_t cols,
                     const HiddenDropout& drop, Scratch scratch, cudaStream_t s);
size_t RmsNormBackwardScratchBytes(int64_t rows, int64_t cols);

template <typename T>
void GeluForward(T* out, const T* in, size_t n, bool tanh_approx, cudaStream_t s);
// din = (not +=); din may alias dout.
template <typename T>
void GeluBackward(T* din, const T* dout, const T* in, size_t n, bool tanh_approx, cudaStream_t s);

// Between Megatron-Core's grouped qkv layout (per query group: its query heads, its key, its
// value; the QKV product's output) and the attention layout [all query heads | (key, value) per
// group], each row [(heads + 2·groups)·head_dim]: flash attention reads queries, keys and values
// of the latter as strided views, which grouped queries do not allow in the former. With a table
// (RopeTable: cos, sin [seq, head_dim/2]) queries and keys are also rotated, the position of row r
// being r mod seq: to_attention rotates by +θ (the forward), else by −θ into the grouped layout
// (the backward of the same map). `out` and `in` must not overlap.
template <typename T>
void RearrangeQkv(T* out, const T* in, int64_t rows, int64_t seq, int64_t heads, int64_t groups,
                  int64_t head_dim, const float* cos, const float* sin, bool to_attention,
                  cudaStream_t s);

// SwiGLU on in [rows, 2·width] = [gate | up]: out = silu(gate)·up; din = (not +=).
template <typename T>
void SwigluForward(T* out, const T* in, int64_t rows, int64_t width, cudaStream_t s);
template <typename T>
void SwigluBackward(T* din, const T* dout, const T* in, int64_t rows, int64_t width,
                    cudaStream_t s);

// dbias[c] += Σ_r dout[r, c].
template <typename T>
void ColumnSumAccumulate(float* dbias, const T* dout, int64_t rows, int64_t cols, Scratch scratch,
                         cudaStream_t s);
size_t ColumnSumScratchBytes(int64_t rows, int64_t cols);

// In place, the same mask as CpuOps::Dropout.
template <typename T>
void Dropout(T* x, int64_t rows, int64_t cols, const HiddenDropout& d, cudaStream_t s);

// out[r] = table[ids[r] − vocab_begin] for ids in [vocab_begin, vocab_end), else zeros.
template <typename T>
void EmbeddingForward(T* out, const int32_t* ids, const float* table, int64_t rows, int64_t cols,
                      int64_t vocab_begin, int64_t vocab_end, cudaStream_t s);
// out[r] += table[positions[r]].
template <typename T>
void PositionForward(T* out, const int32_t* positions, const float* table, int64_t rows,
                     int64_t cols, cudaStream_t s);
// dtable[ids[r] − vocab_begin] += dout[r] for the ids this shard owns. Deterministic: a stable
// sort of (id, row), then each distinct id sums its rows in row order.
template <typename T>
void EmbeddingBackward(float* dtable, const T* dout, const int32_t* ids, int64_t rows, int64_t cols,
                       int64_t vocab_begin, int64_t vocab_end, Scratch scratch, cudaStream_t s);
size_t EmbeddingBackwardScratchBytes(int64_t rows, int64_t cols);
// dtable[positions[r]] += dout[r]; scratch as EmbeddingBackwardScratchBytes.
template <typename T>
void PositionBackward(float* dtable, const T* dout, const int32_t* positions, int64_t rows,
                      int64_t cols, Scratch scratch, cudaStream_t s);

// Fused softmax cross-entropy over a full (unsharded) vocabulary: losses[r] =
// logsumexp(logits[r, :]) − logits[r, target[r]], 0 when target < 0 (losses may be null). When
// grad_scale != 0, logits is overwritten in place by dlogits = (softmax −
// onehot(target))·grad_scale (a zero row when target < 0).
template <typename T>
void CrossEntropyForwardBackward(float* losses, T* logits, const int32_t* targets, int64_t rows,
                                 int64_t vocab, float grad_scale, cudaStream_t s);

// *acc += mean of losses[r] over the rows with targets[r] >= 0 (nothing when there is none), in
// double, deterministically: a micro-batch's loss kept on the device until the step ends.
void AccumulateMeanLoss(double* acc, const float* losses, const int32_t* targets, int64_t rows,
                        cudaStream_t s);

// Vocabulary-parallel cross-entropy (tensor parallelism), around two all-reduces by the caller:
//   CrossEntropyShardPartials: part[3r..3r+2] = this shard's (max, Σexp(x − max), target logit
//     or 0) per row;
//   CrossEntropyShardMax: global_max = this shard's max (then all-reduce max over the shards);
//   CrossEntropyShardRescale: sums[2r] = Σexp rescaled to global_max, sums[2r+1] = target logit
//     (then all-reduce sum);
//   CrossEntropyShardFinish: losses (may be null) and, when grad_scale != 0, dlogits in place.
template <typename T>
void CrossEntropyShardPartials(float* part, const T* logits, const int32_t* targets, int64_t rows,
                               int64_t vocab_local, int64_t vocab_begin, cudaStream_t s);
void CrossEntropyShardMax(float* global_max, const float* part, int64_t rows, cudaStream_t s);
void CrossEntropyShardRescale(float* sums, const float* part, const float* global_max, int64_t rows,
                              cudaStream_t s);
template <typename T>
void CrossEntropyShardFinish(float* losses, T* logits, const int32_t* targets,
                             const float* global_max, const float* sums, int64_t rows,
                             int64_t vocab_local, int64_t vocab_begin, float grad_scale,
                             cudaStream_t s);

// torch.optim.AdamW's formula, as CpuOps::AdamWStep (gradient times grad_scale; the updated
// weights also rounded into `bf16_out` unless null).
void AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n, float lr,
           float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
           bf16* bf16_out, cudaStream_t s);
void AdamW(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
           const AdamWConstants& c, bf16* bf16_out, cudaStream_t s);

// Σ x² accumulated in double (deterministic), returned on the host (synchronises s); NaN/Inf
// propagate.
double SumSquares(const float* x, size_t n, Scratch scratch, cudaStream_t s);
size_t SumSquaresScratchBytes(size_t n);

// ---- float32 kernels behind CudaOps (CpuOps's semantics) ----

void AddInPlace(float* a, const float* b, size_t n, cudaStream_t s);  // a += b
// Gradient reduction in bf16 (--grad-reduce-in-bf16) between two ranks: s = bf16(bf16(a) + b),
// the sum a bf16 all-reduce makes of the two ranks' gradients rounded to bf16; a = s and, unless
// null, out = s (the copy sent back).
void AddRoundedBf16(float* a, const bf16* b, bf16* out, size_t n, cudaStream_t s);
void ConvertToFloat(float* out, const bf16* in, size_t n, cudaStream_t s);
// Loads the kernels that run between two ranks' stream waits on each other (AddInPlace,
// AddRoundedBf16, ConvertToFloat, and ConvertFromFloat<bf16> for gathered weights) now:
// under lazy loading (CUDA's default) a kernel's first launch may wait for the whole device,
// which never idles while its streams wait for a peer blocked the same way.
void LoadPeerExchangeKernels();
// out[r, c] += bias[c] (float, or bf16 with the sum rounded once).
template <typename T>
void AddBias(T* out, const T* bias, int64_t rows, int64_t cols, cudaStream_t s);

// Rotary embedding (rotate-half) of the queries and keys of qkv in Megatron-Core's grouped
// layout, in place, by the table cos/sin [positions, head_dim/2] (RopeTable; sin negated rotates
// back, the backward). Row r sits at positions[r] (device memory), or with positions null at
// r mod seq.
void Rope(float* qkv, int64_t batch, int64_t seq, int64_t heads, int64_t groups, int64_t head_dim,
          const float* cos, const float* sin, const int32_t* positions, cudaStream_t s);

// Causal attention with materialised probabilities, as CpuOps::AttentionForward/Backward
// (a plain reference kernel, not the fast path).
void AttentionForwardReference(float* out, float* probs, const float* qkv, int64_t batch,
                               int64_t seq, int64_t heads, int64_t groups, int64_t head_dim,
                               const AttentionDropout& dropout, Scratch scratch, cudaStream_t s);
size_t AttentionForwardScratchBytes(int64_t batch, int64_t seq, int64_t heads);
// dqkv = (not +=).
void AttentionBackwardReference(float* dqkv, const float* dout, const float* qkv,
                                const float* probs, int64_t batch, int64_t seq, int64_t heads,
                                int64_t groups, int64_t head_dim, const AttentionDropout& dropout,
                                Scratch scratch, cudaStream_t s);
size_t AttentionBackwardScratchBytes(int64_t batch, int64_t seq, int64_t heads);

// CpuOps::BlockAttentionForward/Backward (a plain reference kernel, scores kept in scratch).
void BlockAttentionForwardReference(float* out, float* lse, const float* qkv, const float* kv,
                                    const BlockAttentionArgs& args, const AttentionDropout& dropout,
                                    bool merge, Scratch scratch, cudaStream_t s);
size_t BlockAttentionForwardScratchBytes(const BlockAttentionArgs& args);
// dqkv's query slots += dq, dkv += [dk, dv].
void BlockAttentionBackwardReference(float* dqkv, float* dkv, const float* dout, const float* out,
                                     const float* lse, const float* qkv, const float* kv,
                                     const BlockAttentionArgs& args,
                                     const AttentionDropout& dropout, Scratch scratch,
                                     cudaStream_t s);
size_t BlockAttentionBackwardScratchBytes(const BlockAttentionArgs& args);

// The pieces of CpuOps::CrossEntropyForward on a vocabulary shard, split where the reduce hooks
// run: row maxima; then sums[2r] = Σ exp(logit − max[r]) and sums[2r+1] = the target's logit when
// this shard owns it, else 0; then stats [max, logsumexp] and the losses.
void CrossEntropyRowMax(float* row_max, const float* logits, int64_t rows, int64_t vocab_local,
                        cudaStream_t s);
void CrossEntropyRowSums(float* sums, const float* logits, const float* row_max,
                         const int32_t* targets, int64_t rows, int64_t vocab_local,
                         int64_t vocab_begin, cudaStream_t s);
void CrossEntropyFinish(float* losses, float* stats, const float* row_max, const float* sums,
                        const int32_t* targets, int64_t rows, cudaStream_t s);
// dlogits = (softmax − onehot)·dlosses[r] (not +=), as CpuOps::CrossEntropyBackward.
void CrossEntropyBackward(float* dlogits, const float* dlosses, const float* stats,
                          const float* logits, const int32_t* targets, int64_t rows,
                          int64_t vocab_local, int64_t vocab_begin, cudaStream_t s);

}  // namespace leantron::trainer::cuda
