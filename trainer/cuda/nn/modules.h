// The bf16 model's modules, built from the same LayerSpec as the float32 reference modules
// (trainer/reference/modules.h), each with forward and backward, each tested alone against its
// reference twin (tests/gpu/modules_test.cc):
//   Norm            the residual add (with the branch's dropout) fused with LayerNorm
//   AttentionBlock  ColumnParallelLinear qkv → CoreAttention → RowParallelLinear proj
//   MlpBlock        ColumnParallelLinear fc1 (tanh GELU in its epilogue, or erf GELU after) →
//                   RowParallelLinear fc2
//   Embedding       vocabulary-parallel word embedding + learned positions + dropout
//   OutputHead      vocabulary-parallel output layer and cross-entropy, a chunk of rows at a time,
//                   the loss gradient computed during the forward (the [tokens, vocab] logits never
//                   exist whole)
// Activations are bf16, parameters' gradients fp32 (accumulated in place), norm statistics fp32.
// Norm is LayerNorm or RMSNorm by its spec; MlpBlock GELU (erf, tanh) or SwiGLU; AttentionBlock
// reads Megatron's grouped qkv layout as it is for plain multi-head attention, and otherwise
// (grouped queries, RoPE) rearranges it for flash attention, rotating queries and keys on the way.
// Modules hold weights and shapes, not activations: the caller passes each micro-batch's saved
// tensors (Acts). Tensor-parallel communication lives in the linear layers (parallel/tp_linear.h).
// "All rows" buffers hold every token of the micro-batch, with this rank's rows in place under
// sequence parallelism; "local" buffers hold this rank's rows.
#pragma once

#include <cstdint>

#include "trainer/core/layer_spec.h"
#include "trainer/core/params.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/device_memory.h"
#include "trainer/cuda/nn/core_attention.h"
#include "trainer/cuda/parallel/tp_linear.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer::cuda {

// What the modules of one model chunk share.
struct ModuleContext {
  DeviceMemory* memory = nullptr;  // what modules allocate
  LinearContext linear;            // products, TP communication, profile, bias-gradient scratch
  RowParallelBuffers row_out;
  int64_t batch = 1, seq = 0;
  // Backward scratch (one backward at a time).
  bf16* dbranch_full = nullptr;  // a branch's output gradient, all rows (this rank's in place)
  bf16* dln = nullptr;           // a block's input gradient, all rows
  bf16 *dqkv = nullptr, *datt = nullptr, *dfc = nullptr;
  bf16* dqkv_attention = nullptr;  // grouped attention: the core's gradient, attention layout
  bf16* dact = nullptr;            // gated MLP: the activation's gradient
  void* attn_workspace = nullptr;
  // RoPE: cos and sin [seq, head_dim/2] (RopeTable), null without.
  const float *rope_cos = nullptr, *rope_sin = nullptr;
  TensorParallel& tp() const { return *linear.tp; }
  OpProfile& prof() const { return *linear.prof; }
  const RowGeometry& rows() const { return linear.tp->rows(); }
};

class Norm {
 public:
  struct Stats {
    float *mean = nullptr, *rstd = nullptr;  // per local row; null: not kept
  };
  Norm(const ModuleContext& ctx, const NormSpec& spec, int64_t hidden, const float* w,
       const float* b, float* dw, float* db)
      : ctx_(ctx), spec_(spec), h_(hidden), w_(w), b_(b), dw_(dw), db_(db) {}
  // x = residual + dropout(branch) into x_out, the branch being branch.local (+ branch.addend);
  // or, with no residual, x = branch.local (no dropout, x_out unused). Then out_local =
  // norm(x)·w + b, this rank's rows; all-gathered into `gather_full` when given (under SP). With
  // fp8.q the output is written cast to FP8 there instead (out_local unused).
  void Forward(const bf16* residual, RowParallelOutput branch, bf16* x_out, bf16* out_local,
               const Stats& stats, const HiddenDropout& drop, bf16* gather_full = nullptr,
               const Fp8Out& fp8 = {}) const;
  // dx = dresidual (null: zeros) + the norm's input gradient from dout (local rows), x being the
  // norm's input; dw, db accumulate. The gradient of the branch that fed x (dx through its
  // dropout) is returned as all rows: `dx` itself when no dropout and no SP make them equal, else
  // ctx.dbranch_full with this rank's rows written.
  bf16* Backward(bf16* dx, const bf16* dout, const bf16* dresidual, const bf16* x,
                 const Stats& stats, const HiddenDropout& drop) const;

 private:
  const ModuleContext& ctx_;
  NormSpec spec_;
  int64_t h_;
  const float *w_, *b_;
  float *dw_, *db_;
};

class AttentionBlock {
 public:
  struct Acts {
    bf16* qkv = nullptr;     // all rows, the layout the core attention reads (see above)
    bf16* att = nullptr;     // all rows
    float* stats = nullptr;  // [B, heads, T] log-sum-exp
    // FP8 layers: the products' inputs as their forward casts left them, transposed, for the
    // weight gradients (null: cast again in the backward).
    uint8_t *in_t = nullptr, *att_t = nullptr;  // qkv's [h, rows], proj's [attn width, rows]
  };
  AttentionBlock(const ModuleContext& ctx, const LayerSpec& spec, const LayerShard& shard,
                 CoreAttention* core, const LayerTensors<bf16>& w, bool fp8 = false);
  // `in`: the norm's output, all rows (under SP this rank's present; gathered on the way); with
  // `in_cast` the norm wrote it cast to FP8 where InputTarget said instead (a.in_t given).
  RowParallelOutput Forward(bf16* in, const Acts& a, bool in_cast = false) const;
  Fp8Out InputTarget() const { return qkv_.InputTarget(); }
  // din (all rows buffer, this rank's rows TP-reduced) from the output gradient `dout` (all rows;
  // under SP gathered on the way) and the forward's input and activations.
  void Backward(bf16* dout, const bf16* in, const Acts& a, bf16* din) const;

 private:
  const ModuleContext& ctx_;
  CoreAttention* core_;
  LayerShard shard_;
  bool grouped_, rope_;  // the attention layout (RearrangeQkv); rotary positions
  ColumnParallelLinear qkv_;
  RowParallelLinear proj_;
};

class MlpBlock {
 public:
  struct Acts {
    // fc1's output and the activation's, all rows. FP8 layers keep no `act`: fc2's casts compute
    // the activation from `pre` on the way (fp8.h), in the forward and again in the backward.
    bf16 *pre = nullptr, *act = nullptr;
    // FP8 layers: fc2's input as its forward cast it, transposed [ffn, rows], for its weight
    // gradient (null: cast again from `pre` in the backward, as when the activation is recomputed).
    uint8_t* act_t = nullptr;
    uint8_t* in_t = nullptr;  // FP8 layers: fc1's input, likewise [h, rows] (or null)
  };
  MlpBlock(const ModuleContext& ctx, const LayerSpec& spec, const LayerShard& shard,
           const LayerTensors<bf16>& w, bool fp8 = false);
  // As AttentionBlock::Forward.
  RowParallelOutput Forward(bf16* in, const Acts& a, bool in_cast = false) const;
  Fp8Out InputTarget() const { return fc1_.InputTarget(); }
  // Rebuilds a.act from a.pre (GELU recomputation; nothing for FP8 layers, which keep no act).
  void RecomputeActivation(const Acts& a) const;
  // Rebuilds a.pre and a.act from `in`, all rows present (selective recomputation, mlp): the
  // forward's products on the same blocks of rows, so bitwise the same.
  void Recompute(const bf16* in, const Acts& a) const;
  void Backward(bf16* dout, const bf16* in, const Acts& a, bf16* din) const;
  bool fp8() const { return fc1_.fp8(); }

 private:
  const ModuleContext& ctx_;
  int64_t ffn_;
  bool tanh_;   // tanh GELU, in the products' epilogues
  bool gated_;  // SwiGLU on fc1's [gate | up]
  Fp8Activation act_;
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
};

class Embedding {
 public:
  Embedding(const ModuleContext& ctx, int64_t hidden, int64_t vocab_local, const float* word,
            const float* positions, float* dword, float* dpositions);
  // x (local rows) = word[tokens] (+ positions), dropout applied; tokens are all rows.
  void Forward(const int32_t* tokens, bf16* x, const HiddenDropout& drop) const;
  // From the gradient of x through the dropout: `dx_all` all rows (under SP only this rank's are
  // present, in ctx.dbranch_full, and gathered here).
  void Backward(const bf16* dx_all, const int32_t* tokens) const;

 private:
  const ModuleContext& ctx_;
  int64_t h_, vocab_begin_, vocab_end_;
  const float *word_, *positions_;
  float *dword_, *dpositions_;
  int32_t* position_ids_;  // this rank's rows' positions
};

class OutputHead {
 public:
  // `chunk_rows`: logits rows materialised at a time. With `fp8` the three products run in FP8
  // (ctx.linear.fp8, whose gradient scratch holds chunk_rows · vocab_local), a chunk at a time:
  // its input cast, its logits' gradient cast in both layouts, then the input cast again,
  // transposed, for the weight gradient.
  OutputHead(const ModuleContext& ctx, int64_t hidden, int64_t vocab_local, int64_t chunk_rows,
             const bf16* w, float* dw, bool fp8 = false);
  ~OutputHead();
  // Logits of `x` (all rows of the final norm's output), per-row losses into `losses` (0 where
  // labels < 0) and the micro-batch's mean loss added to the step's sum on the device. With
  // grad_scale != 0 also the loss gradient: dW += and dx (this rank's rows, TP-reduced) from
  // `dx_all` [rows, h], which holds the partial sums of all rows.
  void Forward(const bf16* x, const int32_t* labels, float* losses, float grad_scale, bf16* dx_all,
               bf16* dx) const;
  void BeginStep();
  // The step's loss sum (waits for it); 0 when no forward ran since BeginStep.
  double TakeLoss();

 private:
  const ModuleContext& ctx_;
  int64_t h_, vocab_l_, vocab_begin_, chunk_rows_;
  const bf16* w_;
  float* dw_;
  Fp8Weight fp8_;  // linear < 0: bf16 products
  bf16* logits_;
  float *ce_part_, *ce_max_, *ce_sums_;
  double* loss_sum_ = nullptr;       // Σ micro-batch losses this step, on the device
  double* host_loss_sum_ = nullptr;  // pinned
  mutable bool loss_pending_ = false;
};

}  // namespace leantron::trainer::cuda
