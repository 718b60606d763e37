// The op interface the float32 reference modules (reference/modules.h) are written against:
// forward and explicit backward of every layer (llm.c style, no autograd). Two backends: `cpu`
// (reference/ops_cpu.cc, host memory) and `cuda` (cuda/ops_cuda.cc, the same float32 semantics
// on the GPU, device memory). Shapes are row-major and "rows" are tokens in [batch, sequence]
// order.
// Backward ops accumulate (+=) into parameter gradients and, where stated, into input gradients,
// so gradient accumulation over micro-batches and residual branches needs no extra adds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/core/context_parallel.h"

namespace leantron::trainer {

// Dropout masks are a pure function of (seed, global sample, position inside the sample), never
// of the parallel layout or of what ran before: every layout drops the same elements, and resuming
// needs no RNG state. `seed` already mixes the run seed, iteration, layer and site.
struct HiddenDropout {
  float p = 0.0f;
  uint64_t seed = 0;
  int64_t first_sample = 0;  // global index of the micro-batch's first sample
  int64_t seq_length = 0;    // tokens of a whole sample
  int64_t row_offset = 0;    // rows before this shard (sequence parallelism)
  // Context parallelism: the rows are CP rank cp_rank's chunks of each sample (seq_length/cp_size
  // rows per sample), each element dropped as at its position in the whole sample.
  int cp_rank = 0, cp_size = 1;
};
// Where row r of a [rows, cols] activation under `d` sits: its sample's offset from first_sample
// and its position in the whole sample.
LEANTRON_HOST_DEVICE inline void DropoutRowPlace(const HiddenDropout& d, int64_t r, int64_t* sample,
                                                 int64_t* position) {
  const int64_t local_length = d.seq_length / d.cp_size;
  const int64_t row = d.row_offset + r;
  *sample = d.first_sample + row / local_length;
  *position = ChunkTokenPosition(row % local_length, d.seq_length, d.cp_rank, d.cp_size);
}

struct AttentionDropout {
  float p = 0.0f;
  uint64_t seed = 0;
  int64_t first_sample = 0;
  int64_t head_offset = 0;  // global index of this rank's first head (TP; CP's head split)
  int64_t total_heads = 0;
};

// One block of attention between queries and keys that need not be contiguous in their sample:
// context parallelism's blocks and document-masked (packed) sequences. Query token i sits at
// position query_pos[i] of its sample, key token j at key_pos[j]; query i sees key j when
// key_pos[j] <= query_pos[i] and, with documents, both belong to the same document.
struct BlockAttentionArgs {
  int64_t batch = 1;
  int64_t queries = 0, keys = 0;  // tokens per sample in this block
  int64_t heads = 0, groups = 0, head_dim = 0;
  int64_t seq_length = 0;              // tokens of a whole sample (positions are below it)
  const int32_t* query_pos = nullptr;  // [queries], backend memory
  const int32_t* key_pos = nullptr;    // [keys], backend memory
  const int32_t* documents = nullptr;  // [batch, seq_length] each token's document, or null
};

// Reduction across the vocabulary shards of a vocab-parallel cross-entropy (identity without TP).
using ReduceHook = std::function<void(float* data, int64_t n)>;

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;

  // Backend memory (zero-filled on allocation) and transfers between it and host memory; only
  // these touch both sides, so a device backend changes nothing else.
  virtual float* Alloc(size_t n) = 0;
  virtual void Free(float* p) = 0;
  virtual void* AllocBytes(size_t bytes) = 0;
  virtual void FreeBytes(void* p) = 0;
  virtual void CopyFromHost(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  // Host memory the backend copies to and from at full speed (page-locked on a GPU; readable by
  // its kernels), zero-filled.
  virtual void* AllocPinned(size_t bytes) = 0;
  virtual void FreePinned(void* p) = 0;
  // Copies between backend and pinned host memory beside the computation. CopyFence marks the
  // backend work issued so far (by the thread that issues it); each copy starts after the work of
  // the last fence, runs in issue order with the others of its direction, and returns a ticket
  // the host waits on with WaitCopy. Copies may be issued from another thread than the
  // computation's, while it goes on. ComputeAfterCopy makes backend work issued later wait for
  // that copy (and those of its direction before it), ComputeAfterCopies for every copy issued so
  // far. The cpu backend copies at once.
  virtual void CopyFence() = 0;
  virtual uint64_t CopyToHostAsync(void* host_dst, const void* src, size_t bytes) = 0;
  virtual uint64_t CopyFromHostAsync(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void WaitCopy(uint64_t ticket) = 0;
  virtual void ComputeAfterCopy(uint64_t ticket) = 0;
  virtual void ComputeAfterCopies() = 0;
  virtual void Zero(float* p, size_t n) = 0;
  virtual void Copy(float* dst, const float* src, size_t n) = 0;
  virtual void AddInPlace(float* a, const float* b, size_t n) = 0;  // a += b
  // out[r, c] += bias[c]; dbias[c] += sum_r dout[r, c]
  virtual void AddBias(float* out, const float* bias, int64_t rows, int64_t cols) = 0;
  virtual void BiasBackward(float* dbias, const float* dout, int64_t rows, int64_t cols) = 0;

  // out[M, N] = in[M, K] · weight[N, K]ᵀ + bias[N] (bias may be null).
  virtual void LinearForward(float* out, const float* in, const float* weight, const float* bias,
                             int64_t m, int64_t k, int64_t n) = 0;
  // din[M, K] = dout · weight (+= when accumulate_din; skipped when din is null);
  // dweight[N, K] += doutᵀ · in; dbias[N] += Σ_rows dout (when dbias is non-null).
  virtual void LinearBackward(float* din, float* dweight, float* dbias, const float* dout,
                              const float* in, const float* weight, int64_t m, int64_t k, int64_t n,
                              bool accumulate_din) = 0;

  // LayerNorm over the last dimension; keeps mean and 1/std per row for the backward.
  virtual void LayerNormForward(float* out, float* mean, float* rstd, const float* in,
                                const float* weight, const float* bias, int64_t rows, int64_t cols,
                                float eps) = 0;
  // din += ∂; dweight, dbias +=.
  virtual void LayerNormBackward(float* din, float* dweight, float* dbias, const float* dout,
                                 const float* in, const float* weight, const float* mean,
                                 const float* rstd, int64_t rows, int64_t cols) = 0;

  // RMSNorm (no bias); keeps 1/rms per row. din += ∂; dweight +=.
  virtual void RmsNormForward(float* out, float* rstd, const float* in, const float* weight,
                              int64_t rows, int64_t cols, float eps) = 0;
  virtual void RmsNormBackward(float* din, float* dweight, const float* dout, const float* in,
                               const float* weight, const float* rstd, int64_t rows,
                               int64_t cols) = 0;
  // SwiGLU on in [rows, 2·width] = [gate | up] per row: out = silu(gate)·up. din = (not +=).
  virtual void SwigluForward(float* out, const float* in, int64_t rows, int64_t width) = 0;
  virtual void SwigluBackward(float* din, const float* dout, const float* in, int64_t rows,
                              int64_t width) = 0;
  // Rotary embedding (rotate-half) on the queries and keys of qkv [batch·seq rows] in place, by the
  // frequencies `inv_freq` [head_dim/2] (RopeInverseFrequencies); `inverse` applies the transpose,
  // which is the backward. Row r's position is positions[r] (backend memory, each below
  // `positions_bound`), or with positions null its index in the sequence (r mod seq).
  virtual void Rope(float* qkv, int64_t batch, int64_t seq, int64_t heads, int64_t groups,
                    int64_t head_dim, const std::vector<double>& inv_freq, bool inverse,
                    const int32_t* positions, int64_t positions_bound) = 0;

  // GELU, erf form (Megatron's default) or tanh form (--openai-gelu). din = (not +=).
  virtual void GeluForward(float* out, const float* in, size_t n, bool tanh_approx) = 0;
  virtual void GeluBackward(float* din, const float* dout, const float* in, size_t n,
                            bool tanh_approx) = 0;

  // Causal self-attention over qkv [B, T, (heads + 2·groups)·D] in Megatron-Core's grouped
  // layout (per query group: its heads/groups query heads, its key head, its value head; with
  // groups == heads that is [q k v] per head). out [B, T, heads·D]; probs [B, heads, T, T] keeps
  // the softmax (before dropout) for the backward. dqkv = (not +=).
  virtual void AttentionForward(float* out, float* probs, const float* qkv, int64_t batch,
                                int64_t seq, int64_t heads, int64_t groups, int64_t head_dim,
                                const AttentionDropout& dropout) = 0;
  virtual void AttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                 const float* probs, int64_t batch, int64_t seq, int64_t heads,
                                 int64_t groups, int64_t head_dim,
                                 const AttentionDropout& dropout) = 0;

  // Attention of one block (BlockAttentionArgs): queries from qkv [B, queries, (heads +
  // 2·groups)·D] (the query slots of Megatron-Core's grouped layout), keys and values from kv [B,
  // keys, groups·2·D] (per group its key head, then its value head). Writes out [B, queries,
  // heads·D] and lse [B, heads, queries], the log-sum-exp of the scores of the keys the block shows
  // each query (−inf, and a zero output, where it shows none). With `merge`, (out, lse) already
  // hold the attention over other keys and become the attention over all of them (the online
  // softmax of flash attention; ring attention's merge). Dropout (its mask indexed by positions in
  // the whole sample, seq_length) applies to the normalised probabilities, so merging commutes with
  // it.
  virtual void BlockAttentionForward(float* out, float* lse, const float* qkv, const float* kv,
                                     const BlockAttentionArgs& args,
                                     const AttentionDropout& dropout, bool merge) = 0;
  // One block's share of the gradient, given the whole attention's `out` and `lse` (over every
  // block) and dout: dqkv's query slots += dq and dkv += [dk, dv] (the probabilities recomputed as
  // exp(score − lse), as flash attention's backward does).
  virtual void BlockAttentionBackward(float* dqkv, float* dkv, const float* dout, const float* out,
                                      const float* lse, const float* qkv, const float* kv,
                                      const BlockAttentionArgs& args,
                                      const AttentionDropout& dropout) = 0;
  // dst[r·dst_stride + c] = src[r·src_stride + c] for r < rows, c < cols (no overlap).
  virtual void Copy2D(float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                      int64_t rows, int64_t cols) = 0;

  // In place on x [rows, cols]: zero dropped elements, scale kept ones by 1/(1-p). The backward
  // applies the same mask to the gradient.
  virtual void Dropout(float* x, int64_t rows, int64_t cols, const HiddenDropout& dropout) = 0;

  // out[r] = table[ids[r] - vocab_begin] for ids in [vocab_begin, vocab_end), else zeros
  // (a vocab-parallel shard); the backward adds dout rows into the rows this shard owns.
  virtual void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t rows,
                                int64_t cols, int64_t vocab_begin, int64_t vocab_end) = 0;
  virtual void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                                 int64_t cols, int64_t vocab_begin, int64_t vocab_end) = 0;
  // out[r] += table[positions[r]]; dtable[positions[r]] += dout[r].
  virtual void PositionForward(float* out, const int32_t* positions, const float* table,
                               int64_t rows, int64_t cols) = 0;
  virtual void PositionBackward(float* dtable, const float* dout, const int32_t* positions,
                                int64_t rows, int64_t cols) = 0;

  // Softmax cross-entropy on a vocabulary shard logits [rows, V_local] (columns are global ids
  // [vocab_begin, vocab_begin + V_local)). Targets < 0 are ignored (loss 0). `reduce_max` and
  // `reduce_sum` combine per-row partials across shards. Keeps per-row max and log-sum-exp in
  // `stats` [2·rows] for the backward.
  virtual void CrossEntropyForward(float* losses, float* stats, const float* logits,
                                   const int32_t* targets, int64_t rows, int64_t vocab_local,
                                   int64_t vocab_begin, const ReduceHook& reduce_max,
                                   const ReduceHook& reduce_sum) = 0;
  // dlogits = (softmax − onehot) · dloss[r] (not +=).
  virtual void CrossEntropyBackward(float* dlogits, const float* dlosses, const float* stats,
                                    const float* logits, const int32_t* targets, int64_t rows,
                                    int64_t vocab_local, int64_t vocab_begin) = 0;

  // Σ x² in float64 (for the global gradient norm) and whether any element is NaN/Inf.
  virtual double SumSquares(const float* x, size_t n) = 0;

  // AdamW (decoupled weight decay, torch.optim.AdamW's formula) on a flat range; `step` is the
  // 1-based step count used for bias correction. The gradient used is grad · grad_scale (data-
  // parallel averaging and clipping, one float multiply as a separate scaling pass would do).
  // With `bf16_out` the updated weights are also written there rounded to bfloat16 (nearest even).
  virtual void AdamWStep(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int64_t step, float grad_scale,
                         uint16_t* bf16_out) = 0;
};

// "cpu" is the float32 reference backend; "cuda" (builds with a CUDA toolkit) runs the same
// float32 semantics on the current GPU (trainer/cuda/ops_cuda.cc).
absl::StatusOr<std::unique_ptr<Ops>> CreateOps(const std::string& backend);
#ifdef LEANTRON_HAVE_CUDA
// Fails when no CUDA device is usable.
absl::StatusOr<std::unique_ptr<Ops>> CreateCudaOps();
#endif

// Counter-based randomness shared by all backends.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// The seed of one dropout site: layer −1 is the embedding; sites 0 (embedding), 1 (after the
// attention projection), 2 (after the MLP), 3 (attention probabilities).
inline uint64_t DropoutSiteSeed(uint64_t run_seed, int layer, int site) {
  return SplitMix64(run_seed ^ SplitMix64(static_cast<uint64_t>(layer + 1) * 8 + site));
}
// Uniform in [0, 1) for element `index` of sample `sample` under `seed`.
inline float DropoutUniform(uint64_t seed, int64_t sample, int64_t index) {
  const uint64_t h =
      SplitMix64(SplitMix64(seed ^ (static_cast<uint64_t>(sample) * 0x2545f4914f6cdd1dULL)) +
                 static_cast<uint64_t>(index));
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

}  // namespace leantron::trainer
