// Norm, AttentionBlock and MlpBlock of the bf16 model (modules.h).
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/nn/modules.h"

namespace leantron::trainer::cuda {

void Norm::Forward(const bf16* residual, RowParallelOutput branch, bf16* x_out, bf16* out_local,
                   const Stats& stats, const HiddenDropout& drop, bf16* gather_full,
                   const Fp8Out& fp8) const {
  const RowGeometry& g = ctx_.rows();
  ctx_.prof().Begin("residual+layernorm fwd");
  if (spec_.rms()) {
    AddRmsNormForward<bf16>(x_out, out_local, stats.rstd, residual, branch.local, w_, g.local_rows,
                            h_, spec_.eps, drop, MainStream(), branch.addend, fp8);
  } else {
    AddLayerNormForward<bf16>(x_out, out_local, stats.mean, stats.rstd, residual, branch.local, w_,
                              b_, g.local_rows, h_, spec_.eps, drop, MainStream(), branch.addend,
                              fp8);
  }
  if (gather_full != nullptr) ctx_.tp().GatherRows(gather_full);
  ctx_.prof().End();
}

bf16* Norm::Backward(bf16* dx, const bf16* dout, const bf16* dresidual, const bf16* x,
                     const Stats& stats, const HiddenDropout& drop) const {
  const RowGeometry& g = ctx_.rows();
  // With no dropout at the site and no SP the branch's gradient is dx itself: written once.
  const bool same = !ctx_.tp().sequence_parallel() && drop.p <= 0.0f;
  bf16* dbranch = ctx_.tp().LocalRows(ctx_.dbranch_full);
  ctx_.prof().Begin("layernorm bwd");
  if (spec_.rms()) {
    RmsNormBackward<bf16>(dx, same ? nullptr : dbranch, dw_, dout, dresidual, x, w_, stats.rstd,
                          g.local_rows, h_, drop, ctx_.linear.scratch, MainStream());
  } else {
    LayerNormBackward<bf16>(dx, same ? nullptr : dbranch, dw_, db_, dout, dresidual, x, w_,
                            stats.mean, stats.rstd, g.local_rows, h_, drop, ctx_.linear.scratch,
                            MainStream());
  }
  return same ? dx : ctx_.dbranch_full;
}

AttentionBlock::AttentionBlock(const ModuleContext& ctx, const LayerSpec& spec,
                               const LayerShard& shard, CoreAttention* core,
                               const LayerTensors<bf16>& w, bool fp8)
    : ctx_(ctx),
      core_(core),
      shard_(shard),
      grouped_(!spec.attention.interleaved_mha()),
      rope_(spec.attention.rope),
      qkv_(ctx.linear, spec.hidden, shard.qkv_width, w.qkv_w, w.qkv_b, w.d_qkv_w, w.d_qkv_b, fp8),
      proj_(ctx.linear, ctx.row_out, shard.attn_width, spec.hidden, w.proj_w, w.proj_b, w.d_proj_w,
            w.d_proj_b, fp8) {}

RowParallelOutput AttentionBlock::Forward(bf16* in, const Acts& a, bool in_cast) const {
  // The product into a.qkv, or into scratch, then rearranged (and rotated) into a.qkv.
  bf16* out = grouped_ ? ctx_.dqkv : a.qkv;
  if (in_cast) {
    qkv_.ForwardCast("matmul fwd qkv", out, a.in_t);
  } else {
    qkv_.Forward("matmul fwd qkv", in, out, a.in_t);
  }
  if (grouped_) {
    ctx_.prof().Begin("rope");
    RearrangeQkv<bf16>(a.qkv, ctx_.dqkv, ctx_.rows().rows, ctx_.seq, shard_.heads, shard_.groups,
                       shard_.head_dim, rope_ ? ctx_.rope_cos : nullptr,
                       rope_ ? ctx_.rope_sin : nullptr, /*to_attention=*/true, MainStream());
  }
  ctx_.prof().Begin("attention fwd");
  core_->Forward(a.att, a.stats, a.qkv, ctx_.attn_workspace);
  return proj_.Forward("matmul fwd proj", a.att, a.att_t);
}

void AttentionBlock::Backward(bf16* dout, const bf16* in, const Acts& a, bf16* din) const {
  proj_.Backward("matmul bwd proj", dout, a.att, ctx_.datt, nullptr, a.att_t);
  ctx_.prof().Begin("attention bwd");
  if (!grouped_) {
    core_->Backward(ctx_.dqkv, ctx_.datt, a.qkv, a.att, a.stats, ctx_.attn_workspace);
  } else {
    core_->Backward(ctx_.dqkv_attention, ctx_.datt, a.qkv, a.att, a.stats, ctx_.attn_workspace);
    ctx_.prof().Begin("rope");
    RearrangeQkv<bf16>(ctx_.dqkv, ctx_.dqkv_attention, ctx_.rows().rows, ctx_.seq, shard_.heads,
                       shard_.groups, shard_.head_dim, rope_ ? ctx_.rope_cos : nullptr,
                       rope_ ? ctx_.rope_sin : nullptr, /*to_attention=*/false, MainStream());
  }
  qkv_.Backward("matmul bwd qkv", ctx_.dqkv, in, din, a.in_t);
}

MlpBlock::MlpBlock(const ModuleContext& ctx, const LayerSpec& spec, const LayerShard& shard,
                   const LayerTensors<bf16>& w, bool fp8)
    : ctx_(ctx),
      ffn_(shard.ffn),
      tanh_(spec.mlp.activation == ckpt::Activation::kGeluTanh),
      gated_(spec.mlp.gated()),
      act_(gated_  ? Fp8Activation::kSwiglu
           : tanh_ ? Fp8Activation::kGeluTanh
                   : Fp8Activation::kGeluErf),
      fc1_(ctx.linear, spec.hidden, shard.fc1_width, w.fc1_w, w.fc1_b, w.d_fc1_w, w.d_fc1_b, fp8),
      fc2_(ctx.linear, ctx.row_out, shard.ffn, spec.hidden, w.fc2_w, w.fc2_b, w.d_fc2_w, w.d_fc2_b,
           fp8) {}

RowParallelOutput MlpBlock::Forward(bf16* in, const Acts& a, bool in_cast) const {
  if (fp8()) {  // fc2's cast reads fc1's output through the activation
    if (in_cast) {
      fc1_.ForwardCast("matmul fwd fc1", a.pre, a.in_t);
    } else {
      fc1_.Forward("matmul fwd fc1", in, a.pre, a.in_t);
    }
    return fc2_.Forward("matmul fwd fc2", Fp8Source{a.pre, act_}, a.act_t);
  }
  if (gated_) {  // fc1 = [gate | up] on this rank
    fc1_.Forward("matmul fwd fc1", in, a.pre);
    ctx_.prof().Begin("swiglu");
    SwigluForward<bf16>(a.act, a.pre, ctx_.rows().rows, ffn_, MainStream());
  } else if (tanh_) {  // GELU in the product's epilogue
    fc1_.ForwardGelu("matmul fwd fc1", in, a.pre, a.act);
  } else {
    fc1_.Forward("matmul fwd fc1", in, a.pre);
    ctx_.prof().Begin("gelu");
    GeluForward<bf16>(a.act, a.pre, ctx_.rows().rows * ffn_, false, MainStream());
  }
  return fc2_.Forward("matmul fwd fc2", a.act);
}

void MlpBlock::Recompute(const bf16* in, const Acts& a) const {
  if (tanh_ && !fp8()) {
    fc1_.ForwardGeluAgain("recompute", in, a.pre, a.act);
    return;
  }
  fc1_.ForwardAgain("recompute", in, a.pre);
  RecomputeActivation(a);
}

void MlpBlock::RecomputeActivation(const Acts& a) const {
  if (fp8()) return;  // no activation kept: fc2's casts compute it from a.pre
  if (gated_) {
    ctx_.prof().Begin("swiglu");
    SwigluForward<bf16>(a.act, a.pre, ctx_.rows().rows, ffn_, MainStream());
    return;
  }
  ctx_.prof().Begin("gelu");
  GeluForward<bf16>(a.act, a.pre, ctx_.rows().rows * ffn_, tanh_, MainStream());
}

void MlpBlock::Backward(bf16* dout, const bf16* in, const Acts& a, bf16* din) const {
  if (fp8()) {  // fc1's output gradient computed by its cast, from the activation's
    bf16* dact = gated_ ? ctx_.dact : ctx_.dfc;
    fc2_.Backward("matmul bwd fc2", dout, Fp8Source{a.pre, act_}, dact, a.act_t);
    fc1_.Backward("matmul bwd fc1", Fp8Source{a.pre, act_, dact}, in, din, a.in_t);
    return;
  }
  if (gated_) {
    fc2_.Backward("matmul bwd fc2", dout, a.act, ctx_.dact);
    ctx_.prof().Begin("swiglu");
    SwigluBackward<bf16>(ctx_.dfc, ctx_.dact, a.pre, ctx_.rows().rows, ffn_, MainStream());
    fc1_.Backward("matmul bwd fc1", ctx_.dfc, in, din);
    return;
  }
  // With tanh GELU its derivative is applied in fc2's data-gradient epilogue.
  fc2_.Backward("matmul bwd fc2", dout, a.act, ctx_.dfc, tanh_ ? a.pre : nullptr);
  if (!tanh_) {
    ctx_.prof().Begin("gelu");
    GeluBackward<bf16>(ctx_.dfc, ctx_.dfc, a.pre, ctx_.rows().rows * ffn_, false, MainStream());
  }
  fc1_.Backward("matmul bwd fc1", ctx_.dfc, in, din);
}

}  // namespace leantron::trainer::cuda
