// The float32 reference model's modules, written once against `Ops` (compute) and a tensor-
// parallel `Communicator`, each with an explicit forward and backward (no autograd, llm.c style):
//   TensorParallelRows    the sequence-parallel row gather and the reductions of partial sums
//   ColumnParallelLinear  rows of W split over TP: input gathered (SP), input gradient reduced
//   RowParallelLinear     columns of W split: partial sums reduced (all-reduce or, under SP,
//                         reduce-scatter), bias added once after
//   Norm                  LayerNorm or RMSNorm
//   CoreAttention         causal softmax attention of this rank's heads: LocalAttention (the
//                         whole sequence here; documents masked with --reset-attention-mask) or
//                         context_parallel_attention.h's, which meets the other CP ranks' tokens
//   AttentionBlock        linear_qkv → RoPE → core attention → linear_proj
//   MlpBlock              linear_fc1 → GELU or SwiGLU → linear_fc2
//   Embedding             vocabulary-parallel word embedding (+ learned positions) and dropout
//   OutputHead            vocabulary-parallel output layer and cross-entropy
// Rows are tokens in [batch, sequence] order, the sequence being this CP rank's chunks of each
// sample (the whole sample without context parallelism). "Local" rows are this rank's (all of
// them without sequence parallelism, a 1/TP block with it); "full" rows are every token of the
// micro-batch on this CP rank.
// Modules hold no activations: the caller passes each micro-batch's saved tensors, so a pipeline
// schedule can keep several in flight. Scratch shared by all modules (one backward at a time)
// lives in Workspace. Gradients accumulate (+=) into the ParamStore's buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "trainer/core/context_parallel.h"
#include "trainer/core/layer_spec.h"
#include "trainer/dist/comm.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer::reference {

// Where the modules run: the backend, the tensor- and context-parallel groups and the
// micro-batch's rows.
struct Context {
  Ops* ops = nullptr;
  Communicator* tp = nullptr;
  int tp_rank = 0, tp_size = 1;
  bool sequence_parallel = false;
  int64_t micro_batch = 1;
  int64_t seq_length = 0;      // tokens of each sample on this rank (chunks.local_length())
  SequenceChunks chunks;       // this CP rank's chunks of a sample (all of it without CP)
  Communicator* cp = nullptr;  // the context-parallel group (a group of one without CP)
  // [CP, seq_length]: the positions in the sample of every CP rank's tokens, rank by rank
  // (backend memory; 0..seq_length−1 without CP).
  const int32_t* chunk_positions = nullptr;
  int64_t rows_full = 0, rows_local = 0;
  int64_t row_offset() const { return sequence_parallel ? tp_rank * rows_local : 0; }
  const int32_t* positions_of(int cp_rank) const { return chunk_positions + cp_rank * seq_length; }
};

// What attention needs to know of a micro-batch besides its activations.
struct AttentionInputs {
  AttentionDropout dropout;
  // [rows_full] each row's position in its sample (RoPE; restarting at documents with
  // --reset-position-ids), backend memory.
  const int32_t* positions = nullptr;
  // [micro_batch, chunks.seq_length] the document of every token of the whole samples
  // (--reset-attention-mask), backend memory; null: causal attention over whole samples.
  const int32_t* documents = nullptr;
};

// Scratch shared by every module of a stage, sized for the widest layer.
struct Workspace {
  float* tmp_full = nullptr;   // [rows_full, h]: row-parallel partial sums, embedding lookups
  float* dfull = nullptr;      // [rows_full, h]: gathered output gradients
  float* dfull2 = nullptr;     // [rows_full, h]: input gradients before their TP reduction
  float* dqkv = nullptr;       // [rows_full, qkv_width]
  float* dattn = nullptr;      // [rows_full, attn_width]
  float* dfc1 = nullptr;       // [rows_full, fc1_width]
  float* dact = nullptr;       // [rows_full, ffn]
  float* attention = nullptr;  // core attention's scratch (CoreAttention::scratch_elements)
};

class TensorParallelRows {
 public:
  explicit TensorParallelRows(const Context& ctx) : ctx_(ctx) {}
  // Under SP all-gathers this rank's rows [rows_local, cols] into `full`; else `local` itself.
  const float* Gather(const float* local, float* full, int64_t cols) const;
  // Partial sums over TP of all rows `full` [rows_full, cols] → this rank's rows summed in
  // `local` (reduce-scatter under SP, all-reduce then a copy otherwise).
  void Reduce(float* full, float* local, int64_t cols) const;

 private:
  const Context& ctx_;
};

// y[rows_full, n] = x · Wᵀ + b with W [n, k] this rank's rows.
class ColumnParallelLinear {
 public:
  ColumnParallelLinear(const Context& ctx, Workspace& ws, int64_t k, int64_t n, const float* w,
                       const float* b, float* dw, float* db)
      : ctx_(ctx), ws_(ws), k_(k), n_(n), w_(w), b_(b), dw_(dw), db_(db) {}
  // x: this rank's rows [rows_local, k]; gathered into `x_full` under SP (kept for the backward).
  void Forward(float* y, const float* x, float* x_full) const;
  // dx (this rank's rows, written) from dy [rows_full, n] and the forward's gathered input.
  void Backward(float* dx, const float* dy, const float* x_full) const;

 private:
  const Context& ctx_;
  Workspace& ws_;
  int64_t k_, n_;
  const float *w_, *b_;
  float *dw_, *db_;
};

// y (this rank's rows [rows_local, n]) = Σ_TP x · Wᵀ + b, with x [rows_full, k] and W [n, k] this
// rank's columns.
class RowParallelLinear {
 public:
  RowParallelLinear(const Context& ctx, Workspace& ws, int64_t k, int64_t n, const float* w,
                    const float* b, float* dw, float* db)
      : ctx_(ctx), ws_(ws), k_(k), n_(n), w_(w), b_(b), dw_(dw), db_(db) {}
  void Forward(float* y, const float* x) const;
  // dx [rows_full, k] (written) from dy (this rank's rows).
  void Backward(float* dx, const float* dy, const float* x) const;

 private:
  const Context& ctx_;
  Workspace& ws_;
  int64_t k_, n_;
  const float *w_, *b_;
  float *dw_, *db_;
};

class Norm {
 public:
  struct Saved {
    float *mean = nullptr, *rstd = nullptr;  // per local row (mean unused by RMSNorm)
  };
  Norm(const Context& ctx, const NormSpec& spec, int64_t cols, const float* w, const float* b,
       float* dw, float* db)
      : ctx_(ctx), spec_(spec), cols_(cols), w_(w), b_(b), dw_(dw), db_(db) {}
  void Forward(float* y, const Saved& s, const float* x) const;
  // dx += the norm's input gradient.
  void Backward(float* dx, const float* dy, const Saved& s, const float* x) const;

 private:
  const Context& ctx_;
  NormSpec spec_;
  int64_t cols_;
  const float *w_, *b_;
  float *dw_, *db_;
};

// Causal self-attention over this rank's heads of qkv [B, T, qkv_width] (Megatron-Core's grouped
// layout, T = this rank's tokens of each sample) into out [B, T, heads·D], keeping what its
// backward needs in `saved` (the softmax, or the log-sum-exp and what the attention moved).
class CoreAttention {
 public:
  virtual ~CoreAttention() = default;
  // Floats of `saved` per micro-batch, and of Workspace::attention it uses while it runs.
  virtual size_t saved_elements() const = 0;
  virtual size_t scratch_elements() const = 0;
  virtual void Forward(float* out, float* saved, const float* qkv, const AttentionInputs& in) = 0;
  // dqkv written, from the forward's qkv, out and saved.
  virtual void Backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* saved, const AttentionInputs& in) = 0;
};
// The whole sequence on this rank: Ops::AttentionForward/Backward (the softmax kept), or with
// documents Ops::BlockAttentionForward/Backward over the sample's positions (its log-sum-exp
// kept).
std::unique_ptr<CoreAttention> MakeLocalAttention(const Context& ctx, Workspace& ws,
                                                  const LayerShard& shard);

// The key and value heads of qkv [rows, (heads + 2·groups)·D] into kv [rows, groups·2·D] (the
// layout the block attention ops read), and the inverse for gradients: dkv written into dqkv's
// key and value slots.
void SplitKeysValues(Ops& ops, float* kv, const float* qkv, int64_t rows, int64_t heads,
                     int64_t groups, int64_t head_dim);
void MergeKeyValueGrad(Ops& ops, float* dqkv, const float* dkv, int64_t rows, int64_t heads,
                       int64_t groups, int64_t head_dim);

class AttentionBlock {
 public:
  struct Saved {
    float* x_full = nullptr;  // the gathered input (the input itself without SP)
    float* qkv = nullptr;
    float* core = nullptr;  // what core attention keeps (CoreAttention::saved_elements)
    float* attn = nullptr;
  };
  // `w` holds the layer's tensors (params.h BindLayerTensors names).
  template <typename W>
  AttentionBlock(const Context& ctx, Workspace& ws, const LayerSpec& spec, const LayerShard& shard,
                 CoreAttention* core, const W& w)
      : ctx_(ctx),
        ws_(ws),
        spec_(spec.attention),
        shard_(shard),
        core_(core),
        qkv_(ctx, ws, spec.hidden, shard.qkv_width, w.qkv_w, w.qkv_b, w.d_qkv_w, w.d_qkv_b),
        proj_(ctx, ws, shard.attn_width, spec.hidden, w.proj_w, w.proj_b, w.d_proj_w, w.d_proj_b),
        inv_freq_(RopeInverseFrequencies(spec.attention.rotary_base, spec.attention.head_dim,
                                         spec.attention.rope_scaling)) {}
  // y: this rank's rows of the block's output (before dropout and the residual).
  void Forward(float* y, const float* x, const Saved& s, const AttentionInputs& in) const;
  // Rebuilds what core attention keeps in s.core (selective recomputation).
  void RecomputeCore(const Saved& s, const AttentionInputs& in) const;
  // dx (this rank's rows, written) from dy (this rank's rows; may alias dx).
  void Backward(float* dx, const float* dy, const Saved& s, const AttentionInputs& in) const;

 private:
  void Rope(float* qkv, const AttentionInputs& in, bool inverse) const;
  const Context& ctx_;
  Workspace& ws_;
  AttentionSpec spec_;
  LayerShard shard_;
  CoreAttention* core_;
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
  std::vector<double> inv_freq_;  // RoPE's frequencies
};

class MlpBlock {
 public:
  struct Saved {
    float* x_full = nullptr;
    float *fc1 = nullptr, *act = nullptr;  // fc1's output, the activation's
  };
  template <typename W>
  MlpBlock(const Context& ctx, Workspace& ws, const LayerSpec& spec, const LayerShard& shard,
           const W& w)
      : ctx_(ctx),
        ws_(ws),
        spec_(spec.mlp),
        shard_(shard),
        fc1_(ctx, ws, spec.hidden, shard.fc1_width, w.fc1_w, w.fc1_b, w.d_fc1_w, w.d_fc1_b),
        fc2_(ctx, ws, shard.ffn, spec.hidden, w.fc2_w, w.fc2_b, w.d_fc2_w, w.d_fc2_b) {}
  void Forward(float* y, const float* x, const Saved& s) const;
  void Backward(float* dx, const float* dy, const Saved& s) const;

 private:
  const Context& ctx_;
  Workspace& ws_;
  MlpSpec spec_;
  LayerShard shard_;
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
};

// Vocabulary-parallel word embedding (each rank looks up the ids it owns, the partial rows are
// summed over TP) plus the learned position table, then dropout.
class Embedding {
 public:
  Embedding(const Context& ctx, Workspace& ws, int64_t hidden, int64_t vocab_local,
            const float* word, const float* positions, float* dword, float* dpositions);
  // `positions` [rows_full]: each row's position in its sample (backend memory).
  void Forward(float* y, const int32_t* tokens, const int32_t* positions,
               const HiddenDropout& drop) const;
  // dy is this rank's rows of the output gradient; dropout is undone in place.
  void Backward(float* dy, const int32_t* tokens, const int32_t* positions,
                const HiddenDropout& drop) const;

 private:
  const Context& ctx_;
  Workspace& ws_;
  int64_t h_, vocab_local_;
  const float *word_, *positions_;
  float *dword_, *dpositions_;
};

// Output layer (vocabulary-parallel, no bias) and softmax cross-entropy over all rows.
class OutputHead {
 public:
  struct Saved {
    float* x_full = nullptr;
    float *logits = nullptr, *stats = nullptr, *losses = nullptr;
  };
  OutputHead(const Context& ctx, Workspace& ws, int64_t hidden, int64_t vocab_local, const float* w,
             float* dw, float* dlogits, float* dlosses);
  // Per-row losses in s.losses (0 where labels < 0); x: this rank's rows of the final norm.
  void Forward(const float* x, const int32_t* labels, const Saved& s) const;
  // dx (this rank's rows, written) for the loss gradient `row_grad` per row (host memory).
  void Backward(float* dx, const std::vector<float>& row_grad, const int32_t* labels,
                const Saved& s) const;

 private:
  const Context& ctx_;
  int64_t vocab_local_;
  ColumnParallelLinear linear_;
  float *dlogits_, *dlosses_;
};

}  // namespace leantron::trainer::reference
