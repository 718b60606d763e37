// The model's ends in bf16 (modules.h): Embedding on the first stage, OutputHead on the last.
#include <algorithm>
#include <vector>

#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/nn/modules.h"

namespace leantron::trainer::cuda {

Embedding::Embedding(const ModuleContext& ctx, int64_t hidden, int64_t vocab_local,
                     const float* word, const float* positions, float* dword, float* dpositions)
    : ctx_(ctx),
      h_(hidden),
      vocab_begin_(ctx.tp().rank() * vocab_local),
      vocab_end_(vocab_begin_ + vocab_local),
      word_(word),
      positions_(positions),
      dword_(dword),
      dpositions_(dpositions) {
  const RowGeometry& g = ctx.rows();
  position_ids_ = ctx.memory->Alloc<int32_t>(g.local_rows);
  std::vector<int32_t> ids(g.local_rows);
  for (int64_t r = 0; r < g.local_rows; ++r)
    ids[r] = static_cast<int32_t>((g.row_offset + r) % ctx.seq);
  LT_CUDA_CHECK(cudaMemcpyAsync(position_ids_, ids.data(), ids.size() * sizeof(int32_t),
                                cudaMemcpyHostToDevice, MainStream()));
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));  // `ids` goes
}

void Embedding::Forward(const int32_t* tokens, bf16* x, const HiddenDropout& drop) const {
  const RowGeometry& g = ctx_.rows();
  bf16* partial = ctx_.row_out.partial;
  ctx_.prof().Begin("embedding fwd");
  // Vocabulary-parallel lookup: each rank fills the rows whose ids it owns, the rest zero.
  EmbeddingForward<bf16>(partial, tokens, word_, g.rows, h_, vocab_begin_, vocab_end_,
                         MainStream());
  ctx_.tp().ReduceRows(partial, x);
  ctx_.prof().Begin("embedding fwd");
  if (positions_ != nullptr)
    PositionForward<bf16>(x, position_ids_, positions_, g.local_rows, h_, MainStream());
  Dropout<bf16>(x, g.local_rows, h_, drop, MainStream());
}

void Embedding::Backward(const bf16* dx_all, const int32_t* tokens) const {
  const RowGeometry& g = ctx_.rows();
  TensorParallel& tp = ctx_.tp();
  bf16* local = tp.LocalRows(ctx_.dbranch_full);
  ctx_.prof().Begin("embedding bwd");
  tp.GatherRowsFrom(local, ctx_.dbranch_full);
  ctx_.prof().Begin("embedding bwd");
  EmbeddingBackward<bf16>(dword_, dx_all, tokens, g.rows, h_, vocab_begin_, vocab_end_,
                          ctx_.linear.scratch, MainStream());
  if (dpositions_ != nullptr)
    PositionBackward<bf16>(dpositions_, tp.sequence_parallel() ? local : dx_all, position_ids_,
                           g.local_rows, h_, ctx_.linear.scratch, MainStream());
  ctx_.prof().End();
}

OutputHead::OutputHead(const ModuleContext& ctx, int64_t hidden, int64_t vocab_local,
                       int64_t chunk_rows, const bf16* w, float* dw, bool fp8)
    : ctx_(ctx),
      h_(hidden),
      vocab_l_(vocab_local),
      vocab_begin_(ctx.tp().rank() * vocab_local),
      chunk_rows_(chunk_rows),
      w_(w),
      dw_(dw) {
  DeviceMemory& m = *ctx.memory;
  if (fp8) fp8_ = ctx.linear.fp8->NewWeight(w, vocab_l_, h_);
  logits_ = m.Alloc<bf16>(chunk_rows_ * vocab_l_);
  ce_part_ = m.Alloc<float>(3 * chunk_rows_);
  ce_max_ = m.Alloc<float>(chunk_rows_);
  ce_sums_ = m.Alloc<float>(2 * chunk_rows_);
  loss_sum_ = m.Alloc<double>(1);
  LT_CUDA_CHECK(cudaMallocHost(&host_loss_sum_, sizeof(double)));
}

OutputHead::~OutputHead() { cudaFreeHost(host_loss_sum_); }

// Logits a chunk of rows at a time: loss, and when training the gradient back to the final
// norm's output and into the output weight, scaled by grad_scale. Under TP each rank holds a
// vocabulary shard and the softmax statistics are combined across ranks.
void OutputHead::Forward(const bf16* x, const int32_t* labels, float* losses, float grad_scale,
                         bf16* dx_all, bf16* dx) const {
  const int64_t n = ctx_.rows().rows;
  TensorParallel& tp = ctx_.tp();
  OpProfile& prof = ctx_.prof();
  Matmul& mm = *ctx_.linear.mm;
  Fp8Products* fp8 = fp8_.linear >= 0 ? ctx_.linear.fp8 : nullptr;
  const bool grad = grad_scale != 0.0f;
  if (fp8 != nullptr) {
    prof.Begin("fp8 cast head weight");
    fp8->PrepareWeight(fp8_);
  }
  for (int64_t r0 = 0; r0 < n; r0 += chunk_rows_) {
    const int64_t rows = std::min(chunk_rows_, n - r0);
    const bf16* xr = x + r0 * h_;
    if (fp8 != nullptr) {
      prof.Begin("fp8 cast head fwd");
      fp8->CastInput(fp8_, Fp8Source{xr}, rows, h_);
      prof.Begin("fp8 head fwd");
      fp8->Forward(fp8_, logits_, nullptr, 0, rows, h_, vocab_l_);
    } else {
      prof.Begin("matmul head fwd");
      mm.Forward(logits_, xr, w_, nullptr, rows, h_, vocab_l_);
    }
    prof.Begin("cross-entropy");
    if (!tp.enabled()) {
      CrossEntropyForwardBackward<bf16>(losses + r0, logits_, labels + r0, rows, vocab_l_,
                                        grad_scale, MainStream());
    } else {
      CrossEntropyShardPartials<bf16>(ce_part_, logits_, labels + r0, rows, vocab_l_, vocab_begin_,
                                      MainStream());
      CrossEntropyShardMax(ce_max_, ce_part_, rows, MainStream());
      tp.AllReduce(ce_max_, rows, ReduceOp::kMax);
      prof.Begin("cross-entropy");
      CrossEntropyShardRescale(ce_sums_, ce_part_, ce_max_, rows, MainStream());
      tp.AllReduce(ce_sums_, 2 * rows, ReduceOp::kSum);
      prof.Begin("cross-entropy");
      CrossEntropyShardFinish<bf16>(losses + r0, logits_, labels + r0, ce_max_, ce_sums_, rows,
                                    vocab_l_, vocab_begin_, grad_scale, MainStream());
    }
    if (grad && fp8 != nullptr) {
      // The chunk's scales hold for all three products: tensorwise scaling measures the same
      // input again for the transposed cast.
      prof.Begin("fp8 cast head bwd");
      fp8->CastGrad(fp8_, Fp8Source{logits_}, rows, vocab_l_, nullptr,
                    /*measure_when_fresh=*/true);
      prof.Begin("fp8 head bwd");
      fp8->BackwardData(fp8_, dx_all + r0 * h_, 0, rows, h_, vocab_l_);
      prof.Begin("fp8 cast head bwd");
      fp8->CastInputTransposed(fp8_, Fp8Source{xr}, rows, h_);
      prof.Begin("fp8 head bwd");
      fp8->BackwardWeight(fp8_, dw_, rows, h_, vocab_l_);
    } else if (grad) {
      prof.Begin("matmul head bwd");
      mm.BackwardData(dx_all + r0 * h_, logits_, w_, rows, h_, vocab_l_);
      mm.BackwardWeight(dw_, logits_, xr, rows, h_, vocab_l_);
    }
  }
  if (grad) tp.ReduceRows(dx_all, dx);
  prof.End();
  AccumulateMeanLoss(loss_sum_, losses, labels, n, MainStream());
  loss_pending_ = true;
}

void OutputHead::BeginStep() {
  LT_CUDA_CHECK(cudaMemsetAsync(loss_sum_, 0, sizeof(double), MainStream()));
  loss_pending_ = false;
}

double OutputHead::TakeLoss() {
  if (!loss_pending_) return 0.0;
  loss_pending_ = false;
  LT_CUDA_CHECK(cudaMemcpyAsync(host_loss_sum_, loss_sum_, sizeof(double), cudaMemcpyDeviceToHost,
                                MainStream()));
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  return *host_loss_sum_;
}

}  // namespace leantron::trainer::cuda
