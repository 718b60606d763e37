#include "trainer/cuda/nn/transformer_layer.h"

namespace leantron::trainer::cuda {

TransformerLayer::TransformerLayer(const ModuleContext& ctx, const LayerSpec& spec,
                                   const LayerShard& shard, CoreAttention* core,
                                   const LayerTensors<bf16>& w, bool recompute, bool fp8)
    : ctx_(ctx),
      w_(w),
      shard_(shard),
      recompute_(recompute),
      input_norm_(ctx, spec.input_norm, spec.hidden, w.ln1_w, w.ln1_b, w.d_ln1_w, w.d_ln1_b),
      pre_mlp_norm_(ctx, spec.pre_mlp_norm, spec.hidden, w.ln2_w, w.ln2_b, w.d_ln2_w, w.d_ln2_b),
      attention_(ctx, spec, shard, core, w, fp8),
      mlp_(ctx, spec, shard, w, fp8) {}

TransformerLayer::Acts TransformerLayer::MakeActs(bf16* shared_act, bf16* shared_norm,
                                                  bf16* shared_pre, bf16* fp8_norm) const {
  DeviceMemory& m = *ctx_.memory;
  const RowGeometry& g = ctx_.rows();
  const int64_t n = g.rows, h = g.hidden;
  Acts a;
  a.norms_recomputed = shared_norm != nullptr;
  a.mlp_recomputed = shared_pre != nullptr;
  const bool keep_t = fp8() && !a.norms_recomputed;
  // With the products' inputs kept transposed the norms' outputs serve the forward only (one
  // buffer for all layers), unless fc1 runs again from ln2 in the backward.
  bf16* shared_ln1 = a.norms_recomputed ? shared_norm : keep_t ? fp8_norm : nullptr;
  bf16* shared_ln2 = a.mlp_recomputed && !a.norms_recomputed ? nullptr : shared_ln1;
  a.ln1 = shared_ln1 != nullptr ? shared_ln1 : m.Alloc<bf16>(n * h);
  a.attention.qkv = m.Alloc<bf16>(n * shard_.qkv_width);
  a.attention.att = m.Alloc<bf16>(n * shard_.attn_width);
  a.mid = m.Alloc<bf16>(g.local_rows * h);
  a.ln2 = shared_ln2 != nullptr ? shared_ln2 : m.Alloc<bf16>(n * h);
  if (keep_t) {
    a.attention.in_t = m.Alloc<uint8_t>(Fp8Products::KeptBytes(n, h));
    a.mlp.in_t = m.Alloc<uint8_t>(Fp8Products::KeptBytes(n, h));
  }
  if (fp8()) a.attention.att_t = m.Alloc<uint8_t>(Fp8Products::KeptBytes(n, shard_.attn_width));
  a.mlp.pre = a.mlp_recomputed ? shared_pre : m.Alloc<bf16>(n * shard_.fc1_width);
  if (shared_act != nullptr) {  // recomputed: FP8 layers cast fc2's input again instead
    a.mlp.act = shared_act;
  } else if (fp8()) {
    a.mlp.act_t = m.Alloc<uint8_t>(Fp8Products::KeptBytes(n, shard_.ffn));
  } else {
    a.mlp.act = m.Alloc<bf16>(n * shard_.ffn);
  }
  a.ln1_stats = {m.Alloc<float>(g.local_rows), m.Alloc<float>(g.local_rows)};
  a.ln2_stats = {m.Alloc<float>(g.local_rows), m.Alloc<float>(g.local_rows)};
  a.attention.stats = m.Alloc<float>(ctx_.batch * shard_.heads * ctx_.seq);
  return a;
}

bool TransformerLayer::NormCasts(const Acts& a, bool pre_mlp) const {
  const bool kept =
      pre_mlp ? a.mlp.in_t != nullptr && !a.mlp_recomputed : a.attention.in_t != nullptr;
  return kept && !ctx_.tp().sequence_parallel() && ctx_.linear.fp8->scaling().options().delayed;
}

void TransformerLayer::NormInput(const bf16* residual, RowParallelOutput branch, bf16* x_out,
                                 const Acts& a, const HiddenDropout& drop) const {
  if (NormCasts(a, false)) {
    input_norm_.Forward(residual, branch, x_out, nullptr, a.ln1_stats, drop, nullptr,
                        attention_.InputTarget());
    return;
  }
  input_norm_.Forward(residual, branch, x_out, ctx_.tp().LocalRows(a.ln1), a.ln1_stats, drop);
}

RowParallelOutput TransformerLayer::Forward(const bf16* x, const Acts& a,
                                            const HiddenDropout& attention_drop) const {
  const RowParallelOutput attention = attention_.Forward(a.ln1, a.attention, NormCasts(a, false));
  const bool cast = NormCasts(a, true);
  pre_mlp_norm_.Forward(x, attention, a.mid, cast ? nullptr : ctx_.tp().LocalRows(a.ln2),
                        a.ln2_stats, attention_drop, nullptr, cast ? mlp_.InputTarget() : Fp8Out{});
  const RowParallelOutput mlp = mlp_.Forward(a.ln2, a.mlp, cast);
  ctx_.prof().End();
  return mlp;
}

void TransformerLayer::Recompute(const bf16* x, const Acts& a,
                                 const HiddenDropout& attention_drop) const {
  ctx_.prof().Begin("recompute");
  // x as it was stored: the norm of it alone (no residual add, so no dropout is applied).
  NormInput(nullptr, {x, nullptr}, nullptr, a, HiddenDropout{});
  Forward(x, a, attention_drop);
}

bf16* TransformerLayer::Backward(bf16* dx, bf16* dmlp_out, const bf16* x, const Acts& a,
                                 const HiddenDropout& attention_drop,
                                 const HiddenDropout& input_drop) const {
  TensorParallel& tp = ctx_.tp();
  if (a.norms_recomputed) RenormAll(pre_mlp_norm_, a.mid, a.ln2, a.ln2_stats);
  if (a.mlp_recomputed) mlp_.Recompute(a.ln2, a.mlp);
  mlp_.Backward(dmlp_out, a.ln2, a.mlp, ctx_.dln);
  bf16* dattention_out =
      pre_mlp_norm_.Backward(dx, tp.LocalRows(ctx_.dln), dx, a.mid, a.ln2_stats, attention_drop);
  if (a.norms_recomputed) RenormAll(input_norm_, x, a.ln1, a.ln1_stats);
  attention_.Backward(dattention_out, a.ln1, a.attention, ctx_.dln);
  bf16* dinput = input_norm_.Backward(dx, tp.LocalRows(ctx_.dln), dx, x, a.ln1_stats, input_drop);
  ctx_.prof().End();
  return dinput;
}

void TransformerLayer::RenormAll(const Norm& norm, const bf16* in, bf16* out,
                                 const Norm::Stats& stats) const {
  TensorParallel& tp = ctx_.tp();
  norm.Forward(nullptr, {in, nullptr}, nullptr, tp.LocalRows(out), stats, HiddenDropout{},
               tp.sequence_parallel() ? out : nullptr);
}

}  // namespace leantron::trainer::cuda
