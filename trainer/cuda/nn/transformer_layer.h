// One pre-norm transformer layer of the bf16 model, composed of modules (modules.h):
//   mid = x + dropout(attention(input_norm(x)));  y = mid + dropout(mlp(pre_mlp_norm(mid)))
// The residual add that closes a layer is fused with the norm that reads its result: the next
// layer's input norm (or the final norm), so Forward returns the MLP's output unfinished and the
// caller completes it with the next norm (NormInput of the next layer). Likewise Backward starts
// from the gradient of the MLP's output that the next norm's backward produced.
#pragma once

#include "trainer/core/layer_spec.h"
#include "trainer/core/params.h"
#include "trainer/cuda/nn/modules.h"

namespace leantron::trainer::cuda {

class TransformerLayer {
 public:
  // One micro-batch's activations of the layer (a shared set for recomputed layers).
  struct Acts {
    bf16 *ln1 = nullptr, *ln2 = nullptr;  // the norms' outputs, all rows
    // Selective recomputation (layernorm): ln1 and ln2 are one buffer every layer shares, and
    // the backward normalises x and mid again before it reads them.
    bool norms_recomputed = false;
    // Selective recomputation (mlp): mlp.pre and mlp.act are buffers every layer shares, and the
    // backward runs fc1 and the activation again from ln2 before the MLP's backward.
    bool mlp_recomputed = false;
    bf16* mid = nullptr;  // the residual stream between the blocks, local rows
    Norm::Stats ln1_stats, ln2_stats;
    AttentionBlock::Acts attention;
    MlpBlock::Acts mlp;
  };
  // `fp8`: the layer's four linear layers multiply in FP8 (ctx.linear.fp8).
  TransformerLayer(const ModuleContext& ctx, const LayerSpec& spec, const LayerShard& shard,
                   CoreAttention* core, const LayerTensors<bf16>& w, bool recompute,
                   bool fp8 = false);
  const LayerTensors<bf16>& tensors() const { return w_; }
  int global_index() const { return w_.global_index; }
  bool recompute() const { return recompute_; }
  bool fp8() const { return mlp_.fp8(); }
  const Norm& input_norm() const { return input_norm_; }
  // Activations for one micro-batch; `shared_act`, when given, is the MLP activation buffer every
  // layer shares (GELU recomputation), `shared_norm` the norm output buffer (all rows, hidden
  // wide) every layer shares (norm recomputation), `shared_pre` fc1's output buffer every layer
  // shares (MLP recomputation, with `shared_act`). FP8 layers keep no MLP activation of their own,
  // and unless their norms are recomputed they keep their products' inputs as FP8 transposes for
  // the weight gradients: the norms' outputs then serve the forward only, in `fp8_norm` (all rows,
  // hidden wide) when given, one buffer the FP8 layers share.
  Acts MakeActs(bf16* shared_act, bf16* shared_norm, bf16* shared_pre = nullptr,
                bf16* fp8_norm = nullptr) const;

  // The input norm: x = residual + dropout(branch) into x_out (or x = branch.local without a
  // residual), then a.ln1 (this rank's rows; the QKV product gathers the rest), or the QKV
  // product's FP8 input when the norm casts (NormCasts).
  void NormInput(const bf16* residual, RowParallelOutput branch, bf16* x_out, const Acts& a,
                 const HiddenDropout& drop) const;
  // From a.ln1 (the input norm of x, done): the attention block, the residual + pre-MLP norm (mid
  // = x + dropout(attention), `attention_drop` the site's mask), the MLP block. Returns the MLP's
  // output, before its dropout and the residual add.
  RowParallelOutput Forward(const bf16* x, const Acts& a,
                            const HiddenDropout& attention_drop) const;
  // The whole forward again from x (full recomputation; the MLP's output is not needed).
  void Recompute(const bf16* x, const Acts& a, const HiddenDropout& attention_drop) const;
  // Rebuilds the MLP activation (GELU recomputation).
  void RecomputeActivation(const Acts& a) const { mlp_.RecomputeActivation(a.mlp); }
  // From dx = d(y) and `dmlp_out` (all rows) = d(MLP output) through its dropout: dx becomes d(x),
  // and the gradient of the branch that fed x (through `input_drop`, that branch's dropout) is
  // returned as all rows (Norm::Backward).
  bf16* Backward(bf16* dx, bf16* dmlp_out, const bf16* x, const Acts& a,
                 const HiddenDropout& attention_drop, const HiddenDropout& input_drop) const;

 private:
  // Whether a norm writes its output cast to FP8 for the next product (no bf16 output): FP8
  // layers that keep the product's input transposed, under delayed scaling, without SP; the
  // pre-MLP norm's output stays bf16 when fc1 runs again from it (MLP recomputation).
  bool NormCasts(const Acts& a, bool pre_mlp) const;
  // out (all rows; this rank's computed, the rest gathered under SP) = norm(in), in being what
  // the forward normalised (no residual add left); the stats are rewritten with equal values.
  void RenormAll(const Norm& norm, const bf16* in, bf16* out, const Norm::Stats& stats) const;

  const ModuleContext& ctx_;
  LayerTensors<bf16> w_;
  LayerShard shard_;
  bool recompute_;
  Norm input_norm_, pre_mlp_norm_;
  AttentionBlock attention_;
  MlpBlock mlp_;
};

}  // namespace leantron::trainer::cuda
