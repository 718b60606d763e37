#include "trainer/reference/modules.h"

namespace leantron::trainer::reference {

const float* TensorParallelRows::Gather(const float* local, float* full, int64_t cols) const {
  if (!ctx_.sequence_parallel) return local;
  ctx_.tp->AllGather(local, full, ctx_.rows_local * cols);
  return full;
}

void TensorParallelRows::Reduce(float* full, float* local, int64_t cols) const {
  if (ctx_.sequence_parallel) {
    ctx_.tp->ReduceScatter(full, local, ctx_.rows_local * cols);
    return;
  }
  if (ctx_.tp_size > 1) ctx_.tp->AllReduceSum(full, ctx_.rows_full * cols);
  if (local != full) ctx_.ops->Copy(local, full, ctx_.rows_full * cols);
}

void ColumnParallelLinear::Forward(float* y, const float* x, float* x_full) const {
  const float* in = TensorParallelRows(ctx_).Gather(x, x_full, k_);
  ctx_.ops->LinearForward(y, in, w_, b_, ctx_.rows_full, k_, n_);
}

void ColumnParallelLinear::Backward(float* dx, const float* dy, const float* x_full) const {
  ctx_.ops->LinearBackward(ws_.dfull2, dw_, db_, dy, x_full, w_, ctx_.rows_full, k_, n_, false);
  TensorParallelRows(ctx_).Reduce(ws_.dfull2, dx, k_);
}

void RowParallelLinear::Forward(float* y, const float* x) const {
  ctx_.ops->LinearForward(ws_.tmp_full, x, w_, nullptr, ctx_.rows_full, k_, n_);
  TensorParallelRows(ctx_).Reduce(ws_.tmp_full, y, n_);
  if (b_ != nullptr) ctx_.ops->AddBias(y, b_, ctx_.rows_local, n_);
}

void RowParallelLinear::Backward(float* dx, const float* dy, const float* x) const {
  if (db_ != nullptr) ctx_.ops->BiasBackward(db_, dy, ctx_.rows_local, n_);
  const float* dy_full = TensorParallelRows(ctx_).Gather(dy, ws_.dfull, n_);
  ctx_.ops->LinearBackward(dx, dw_, nullptr, dy_full, x, w_, ctx_.rows_full, k_, n_, false);
}

void Norm::Forward(float* y, const Saved& s, const float* x) const {
  if (spec_.rms()) {
    ctx_.ops->RmsNormForward(y, s.rstd, x, w_, ctx_.rows_local, cols_, spec_.eps);
  } else {
    ctx_.ops->LayerNormForward(y, s.mean, s.rstd, x, w_, b_, ctx_.rows_local, cols_, spec_.eps);
  }
}

void Norm::Backward(float* dx, const float* dy, const Saved& s, const float* x) const {
  if (spec_.rms()) {
    ctx_.ops->RmsNormBackward(dx, dw_, dy, x, w_, s.rstd, ctx_.rows_local, cols_);
  } else {
    ctx_.ops->LayerNormBackward(dx, dw_, db_, dy, x, w_, s.mean, s.rstd, ctx_.rows_local, cols_);
  }
}

void SplitKeysValues(Ops& ops, float* kv, const float* qkv, int64_t rows, int64_t heads,
                     int64_t groups, int64_t head_dim) {
  const int64_t per = heads / groups, row = (heads + 2 * groups) * head_dim;
  for (int64_t g = 0; g < groups; ++g) {
    ops.Copy2D(kv + g * 2 * head_dim, groups * 2 * head_dim, qkv + (g * (per + 2) + per) * head_dim,
               row, rows, 2 * head_dim);
  }
}

void MergeKeyValueGrad(Ops& ops, float* dqkv, const float* dkv, int64_t rows, int64_t heads,
                       int64_t groups, int64_t head_dim) {
  const int64_t per = heads / groups, row = (heads + 2 * groups) * head_dim;
  for (int64_t g = 0; g < groups; ++g) {
    ops.Copy2D(dqkv + (g * (per + 2) + per) * head_dim, row, dkv + g * 2 * head_dim,
               groups * 2 * head_dim, rows, 2 * head_dim);
  }
}

namespace {
class LocalAttention final : public CoreAttention {
 public:
  LocalAttention(const Context& ctx, Workspace& ws, const LayerShard& shard)
      : ctx_(ctx), ws_(ws), shard_(shard) {}
  size_t saved_elements() const override {
    return static_cast<size_t>(ctx_.micro_batch) * shard_.heads * ctx_.seq_length * ctx_.seq_length;
  }
  size_t scratch_elements() const override { return 2 * kv_elements(); }
  void Forward(float* out, float* saved, const float* qkv, const AttentionInputs& in) override {
    if (in.documents == nullptr) {
      ctx_.ops->AttentionForward(out, saved, qkv, ctx_.micro_batch, ctx_.seq_length, shard_.heads,
                                 shard_.groups, shard_.head_dim, in.dropout);
      return;
    }
    float* kv = ws_.attention;
    SplitKeysValues(*ctx_.ops, kv, qkv, ctx_.rows_full, shard_.heads, shard_.groups,
                    shard_.head_dim);
    ctx_.ops->BlockAttentionForward(out, saved, qkv, kv, Block(in), in.dropout, false);
  }
  void Backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                const float* saved, const AttentionInputs& in) override {
    if (in.documents == nullptr) {
      ctx_.ops->AttentionBackward(dqkv, dout, qkv, saved, ctx_.micro_batch, ctx_.seq_length,
                                  shard_.heads, shard_.groups, shard_.head_dim, in.dropout);
      return;
    }
    float *kv = ws_.attention, *dkv = ws_.attention + kv_elements();
    SplitKeysValues(*ctx_.ops, kv, qkv, ctx_.rows_full, shard_.heads, shard_.groups,
                    shard_.head_dim);
    ctx_.ops->Zero(dkv, kv_elements());
    ctx_.ops->Zero(dqkv, ctx_.rows_full * shard_.qkv_width);
    ctx_.ops->BlockAttentionBackward(dqkv, dkv, dout, out, saved, qkv, kv, Block(in), in.dropout);
    MergeKeyValueGrad(*ctx_.ops, dqkv, dkv, ctx_.rows_full, shard_.heads, shard_.groups,
                      shard_.head_dim);
  }

 private:
  size_t kv_elements() const {
    return static_cast<size_t>(ctx_.rows_full) * shard_.groups * 2 * shard_.head_dim;
  }
  BlockAttentionArgs Block(const AttentionInputs& in) const {
    const int32_t* pos = ctx_.positions_of(0);
    return BlockAttentionArgs{ctx_.micro_batch,
                              ctx_.seq_length,
                              ctx_.seq_length,
                              shard_.heads,
                              shard_.groups,
                              shard_.head_dim,
                              ctx_.chunks.seq_length,
                              pos,
                              pos,
                              in.documents};
  }
  const Context& ctx_;
  Workspace& ws_;
  LayerShard shard_;
};
}  // namespace

std::unique_ptr<CoreAttention> MakeLocalAttention(const Context& ctx, Workspace& ws,
                                                  const LayerShard& shard) {
  return std::make_unique<LocalAttention>(ctx, ws, shard);
}

void AttentionBlock::Rope(float* qkv, const AttentionInputs& in, bool inverse) const {
  if (!spec_.rope) return;
  ctx_.ops->Rope(qkv, ctx_.micro_batch, ctx_.seq_length, shard_.heads, shard_.groups,
                 shard_.head_dim, inv_freq_, inverse, in.positions, ctx_.chunks.seq_length);
}

void AttentionBlock::Forward(float* y, const float* x, const Saved& s,
                             const AttentionInputs& in) const {
  qkv_.Forward(s.qkv, x, s.x_full);
  Rope(s.qkv, in, /*inverse=*/false);
  core_->Forward(s.attn, s.core, s.qkv, in);
  proj_.Forward(y, s.attn);
}

void AttentionBlock::RecomputeCore(const Saved& s, const AttentionInputs& in) const {
  // The output, already kept in s.attn, lands in scratch.
  core_->Forward(ws_.dattn, s.core, s.qkv, in);
}

void AttentionBlock::Backward(float* dx, const float* dy, const Saved& s,
                              const AttentionInputs& in) const {
  proj_.Backward(ws_.dattn, dy, s.attn);
  core_->Backward(ws_.dqkv, ws_.dattn, s.qkv, s.attn, s.core, in);
  Rope(ws_.dqkv, in, /*inverse=*/true);
  qkv_.Backward(dx, ws_.dqkv, s.x_full);
}

void MlpBlock::Forward(float* y, const float* x, const Saved& s) const {
  fc1_.Forward(s.fc1, x, s.x_full);
  if (spec_.gated()) {
    ctx_.ops->SwigluForward(s.act, s.fc1, ctx_.rows_full, shard_.ffn);
  } else {
    ctx_.ops->GeluForward(s.act, s.fc1, ctx_.rows_full * shard_.ffn,
                          spec_.activation == ckpt::Activation::kGeluTanh);
  }
  fc2_.Forward(y, s.act);
}

void MlpBlock::Backward(float* dx, const float* dy, const Saved& s) const {
  fc2_.Backward(ws_.dact, dy, s.act);
  if (spec_.gated()) {
    ctx_.ops->SwigluBackward(ws_.dfc1, ws_.dact, s.fc1, ctx_.rows_full, shard_.ffn);
  } else {
    ctx_.ops->GeluBackward(ws_.dfc1, ws_.dact, s.fc1, ctx_.rows_full * shard_.ffn,
                           spec_.activation == ckpt::Activation::kGeluTanh);
  }
  fc1_.Backward(dx, ws_.dfc1, s.x_full);
}

Embedding::Embedding(const Context& ctx, Workspace& ws, int64_t hidden, int64_t vocab_local,
                     const float* word, const float* positions, float* dword, float* dpositions)
    : ctx_(ctx),
      ws_(ws),
      h_(hidden),
      vocab_local_(vocab_local),
      word_(word),
      positions_(positions),
      dword_(dword),
      dpositions_(dpositions) {}

void Embedding::Forward(float* y, const int32_t* tokens, const int32_t* positions,
                        const HiddenDropout& drop) const {
  const int64_t vocab_begin = ctx_.tp_rank * vocab_local_;
  ctx_.ops->EmbeddingForward(ws_.tmp_full, tokens, word_, ctx_.rows_full, h_, vocab_begin,
                             vocab_begin + vocab_local_);
  TensorParallelRows(ctx_).Reduce(ws_.tmp_full, y, h_);
  if (positions_ != nullptr) {
    ctx_.ops->PositionForward(y, positions + ctx_.row_offset(), positions_, ctx_.rows_local, h_);
  }
  ctx_.ops->Dropout(y, ctx_.rows_local, h_, drop);
}

void Embedding::Backward(float* dy, const int32_t* tokens, const int32_t* positions,
                         const HiddenDropout& drop) const {
  ctx_.ops->Dropout(dy, ctx_.rows_local, h_, drop);
  if (dpositions_ != nullptr) {
    ctx_.ops->PositionBackward(dpositions_, dy, positions + ctx_.row_offset(), ctx_.rows_local, h_);
  }
  const float* d = TensorParallelRows(ctx_).Gather(dy, ws_.dfull, h_);
  const int64_t vocab_begin = ctx_.tp_rank * vocab_local_;
  ctx_.ops->EmbeddingBackward(dword_, d, tokens, ctx_.rows_full, h_, vocab_begin,
                              vocab_begin + vocab_local_);
}

OutputHead::OutputHead(const Context& ctx, Workspace& ws, int64_t hidden, int64_t vocab_local,
                       const float* w, float* dw, float* dlogits, float* dlosses)
    : ctx_(ctx),
      vocab_local_(vocab_local),
      linear_(ctx, ws, hidden, vocab_local, w, nullptr, dw, nullptr),
      dlogits_(dlogits),
      dlosses_(dlosses) {}

void OutputHead::Forward(const float* x, const int32_t* labels, const Saved& s) const {
  linear_.Forward(s.logits, x, s.x_full);
  ReduceHook max_hook, sum_hook;
  if (ctx_.tp_size > 1) {
    Communicator* tp = ctx_.tp;
    max_hook = [tp](float* d, int64_t n) { tp->AllReduceMax(d, n); };
    sum_hook = [tp](float* d, int64_t n) { tp->AllReduceSum(d, n); };
  }
  ctx_.ops->CrossEntropyForward(s.losses, s.stats, s.logits, labels, ctx_.rows_full, vocab_local_,
                                ctx_.tp_rank * vocab_local_, max_hook, sum_hook);
}

void OutputHead::Backward(float* dx, const std::vector<float>& row_grad, const int32_t* labels,
                          const Saved& s) const {
  ctx_.ops->CopyFromHost(dlosses_, row_grad.data(), ctx_.rows_full * sizeof(float));
  ctx_.ops->CrossEntropyBackward(dlogits_, dlosses_, s.stats, s.logits, labels, ctx_.rows_full,
                                 vocab_local_, ctx_.tp_rank * vocab_local_);
  linear_.Backward(dx, dlogits_, s.x_full);
}

}  // namespace leantron::trainer::reference
