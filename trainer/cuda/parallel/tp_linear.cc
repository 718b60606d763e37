#include "trainer/cuda/parallel/tp_linear.h"

#include "trainer/cuda/kernels/kernels.h"

namespace leantron::trainer::cuda {

void WeightGrad(const LinearContext& ctx, float* dw, float* db, const bf16* dout, const bf16* in,
                int64_t k, int64_t n) {
  const int64_t rows = ctx.tp->rows().rows;
  if (db != nullptr && ctx.mm->BackwardWeightBias(dw, ctx.bias_grad, dout, in, rows, k, n)) {
    AddInPlace(db, ctx.bias_grad, n, MainStream());
    return;
  }
  ctx.mm->BackwardWeight(dw, dout, in, rows, k, n);
  if (db != nullptr) ColumnSumAccumulate<bf16>(db, dout, rows, n, ctx.scratch, MainStream());
}

void ColumnParallelLinear::Forward(const char* op, bf16* in, bf16* out) const {
  ctx_.tp->GatherRun(in, op, [&](int64_t r0, int64_t rows) {
    ctx_.mm->Forward(out + r0 * n_, in + r0 * k_, w_, b_, rows, k_, n_);
  });
}

void ColumnParallelLinear::ForwardGelu(const char* op, bf16* in, bf16* pre, bf16* out) const {
  ctx_.tp->GatherRun(in, op, [&](int64_t r0, int64_t rows) {
    ctx_.mm->ForwardGelu(out + r0 * n_, pre + r0 * n_, in + r0 * k_, w_, b_, rows, k_, n_);
  });
}

void ColumnParallelLinear::ForwardAgain(const char* op, const bf16* in, bf16* out) const {
  ctx_.tp->RunBlocks(op, [&](int64_t r0, int64_t rows) {
    ctx_.mm->Forward(out + r0 * n_, in + r0 * k_, w_, b_, rows, k_, n_);
  });
}

void ColumnParallelLinear::ForwardGeluAgain(const char* op, const bf16* in, bf16* pre,
                                            bf16* out) const {
  ctx_.tp->RunBlocks(op, [&](int64_t r0, int64_t rows) {
    ctx_.mm->ForwardGelu(out + r0 * n_, pre + r0 * n_, in + r0 * k_, w_, b_, rows, k_, n_);
  });
}

// Under SP on two ranks of one node: the rows the peer keeps first, sent while the weight
// gradient is computed, then this rank's rows accumulated onto the peer's partial sums of them.
// Otherwise the whole product, then its TP reduction beside the weight gradient.
void ColumnParallelLinear::Backward(const char* op, const bf16* dout, const bf16* in,
                                    bf16* din) const {
  TensorParallel& tp = *ctx_.tp;
  const RowGeometry& g = tp.rows();
  OpProfile& prof = *ctx_.prof;
  Matmul& mm = *ctx_.mm;
  prof.Begin(op);
  auto weight_grad = [&] { WeightGrad(ctx_, dw_, db_, dout, in, k_, n_); };
  if (PeerExchange* exchange = tp.exchange(); exchange != nullptr && tp.size() == 2) {
    const int peer = 1 - tp.rank();
    const size_t count = static_cast<size_t>(g.local_rows * k_);
    mm.BackwardData(din + peer * count, dout + peer * g.local_rows * n_, w_, g.local_rows, k_, n_);
    exchange->Send(din + peer * count, count * sizeof(bf16), MainStream());
    weight_grad();
    prof.Begin("tensor-parallel communication");
    exchange->Receive(tp.LocalRows(din), count * sizeof(bf16), MainStream());
    prof.Begin(op);
    mm.BackwardData(tp.LocalRows(din), dout + tp.rank() * g.local_rows * n_, w_, g.local_rows, k_,
                    n_, /*accumulate=*/true);
    exchange->WaitSent(MainStream());
    return;
  }
  mm.BackwardData(din, dout, w_, g.rows, k_, n_);
  tp.ReduceRows(din, tp.LocalRows(din), /*wait=*/false);
  prof.Begin(op);
  weight_grad();
  tp.Wait();
}

RowParallelOutput RowParallelLinear::Forward(const char* op, const bf16* in) const {
  TensorParallel& tp = *ctx_.tp;
  const RowGeometry& g = tp.rows();
  // The bias is added once (TP rank 0) before the partial sums are reduced.
  const bf16* bias = tp.rank() == 0 ? b_ : nullptr;
  auto gemm = [&](int64_t r0, int64_t rows) {
    ctx_.mm->Forward(out_.partial + r0 * n_, in + r0 * k_, w_, bias, rows, k_, n_);
  };
  OpProfile& prof = *ctx_.prof;
  prof.Begin(op);
  if (out_.peer == nullptr) {
    gemm(0, g.rows);
    tp.ReduceRows(out_.partial, out_.local);
    return {out_.local, nullptr};
  }
  const int peer = 1 - tp.rank();
  const size_t count = static_cast<size_t>(g.local_rows * n_);
  gemm(peer * g.local_rows, g.local_rows);
  bf16* send = out_.partial + peer * count;
  if (PeerExchange* exchange = tp.exchange(); exchange != nullptr) {
    exchange->Send(send, count * sizeof(bf16), MainStream());
    prof.Begin(op);
    gemm(tp.rank() * g.local_rows, g.local_rows);
    prof.Begin("tensor-parallel communication");
    exchange->Receive(out_.peer, count * sizeof(bf16), MainStream());
    exchange->WaitSent(MainStream());  // `partial` is written again by the next product
    return {out_.local, out_.peer};
  }
  tp.FollowMain();
  tp.SendRecv("partial-sum exchange", send, peer, out_.peer, peer, count);
  prof.Begin(op);
  gemm(tp.rank() * g.local_rows, g.local_rows);
  tp.Wait();
  return {out_.local, out_.peer};
}

void RowParallelLinear::Backward(const char* op, bf16* dout, const bf16* in, bf16* din,
                                 const bf16* gelu_pre) const {
  TensorParallel& tp = *ctx_.tp;
  const RowGeometry& g = tp.rows();
  auto dgrad = [&](int64_t r0, int64_t rows) {
    if (gelu_pre != nullptr) {
      ctx_.mm->BackwardDataGelu(din + r0 * k_, dout + r0 * n_, w_, gelu_pre + r0 * k_, rows, k_,
                                n_);
    } else {
      ctx_.mm->BackwardData(din + r0 * k_, dout + r0 * n_, w_, rows, k_, n_);
    }
  };
  ctx_.prof->Begin(op);
  if (!tp.sequence_parallel()) {
    WeightGrad(ctx_, dw_, db_, dout, in, k_, n_);
    dgrad(0, g.rows);
    return;
  }
  // The bias's gradient from this rank's rows (summed over TP by the optimizer).
  if (db_ != nullptr)
    ColumnSumAccumulate<bf16>(db_, tp.LocalRows(dout), g.local_rows, n_, ctx_.scratch,
                              MainStream());
  tp.GatherRun(dout, op, [&](int64_t r0, int64_t rows) {
    ctx_.mm->BackwardWeight(dw_, dout + r0 * n_, in + r0 * k_, rows, k_, n_);
    dgrad(r0, rows);
  });
}

}  // namespace leantron::trainer::cuda
