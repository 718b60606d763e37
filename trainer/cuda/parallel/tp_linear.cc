#include "trainer/cuda/parallel/tp_linear.h"

#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "trainer/cuda/kernels/kernels.h"

namespace leantron::trainer::cuda {

namespace {
using Names = std::map<std::string, std::string, std::less<>>;
// names[op] = prefix + op, kept for the life of the process (the profile keeps op names). Nodes
// stay put, so c_str() stays valid; the lookup allocates only for a new name.
const char* LastingName(Names& names, std::string_view prefix, std::string_view op) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto it = names.find(op);
  if (it == names.end()) {
    std::string name(prefix);
    name += op;
    it = names.emplace(std::string(op), std::move(name)).first;
  }
  return it->second.c_str();
}
}  // namespace

const char* Fp8OpName(const char* op) {
  static Names names;
  return LastingName(names, "fp8 ", op);
}

const char* Fp8CastName(const char* op) {
  static Names names;
  std::string_view name(op);
  if (name.starts_with("matmul ")) name.remove_prefix(7);
  return LastingName(names, "fp8 cast ", name);
}

void ColumnParallelLinear::ForwardFp8(const char* op, bf16* in, bf16* out, bool gather,
                                      uint8_t* keep_t) const {
  TensorParallel& tp = *ctx_.tp;
  OpProfile& prof = *ctx_.prof;
  if (gather && tp.sequence_parallel()) {
    prof.Begin("tensor-parallel communication");
    tp.GatherRows(in);
  }
  const int64_t rows = tp.rows().rows;
  Fp8Products& f = *ctx_.fp8;
  prof.Begin(Fp8CastName(op));
  f.PrepareWeight(fp8_);
  f.CastInput(fp8_, Fp8Source{in}, rows, k_, keep_t);
  prof.Begin(Fp8OpName(op));
  f.Forward(fp8_, out, b_, 0, rows, k_, n_);
}

// FP8 MLPs cast fc2's input from fc1's output (MlpBlock): no GELU epilogue.
static void NoFp8Gelu() {
  Die("tp_linear", "FP8 layers take the activation in fc2's cast (Fp8Source), not an epilogue",
      __FILE__, __LINE__);
}

void ColumnParallelLinear::ForwardCast(const char* op, bf16* out, uint8_t* keep_t) const {
  if (fp8_.linear < 0 || ctx_.tp->sequence_parallel())
    Die("ColumnParallelLinear", "a cast input needs an FP8 layer without SP", __FILE__, __LINE__);
  const int64_t rows = ctx_.tp->rows().rows;
  Fp8Products& f = *ctx_.fp8;
  ctx_.prof->Begin(Fp8CastName(op));
  f.PrepareWeight(fp8_);
  f.TransposeInput(rows, k_, keep_t);
  ctx_.prof->Begin(Fp8OpName(op));
  f.Forward(fp8_, out, b_, 0, rows, k_, n_);
}

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

void ColumnParallelLinear::Forward(const char* op, bf16* in, bf16* out, uint8_t* keep_t) const {
  if (fp8_.linear >= 0) return ForwardFp8(op, in, out, /*gather=*/true, keep_t);
  ctx_.tp->GatherRun(in, op, [&](int64_t r0, int64_t rows) {
    ctx_.mm->Forward(out + r0 * n_, in + r0 * k_, w_, b_, rows, k_, n_);
  });
}

void ColumnParallelLinear::ForwardGelu(const char* op, bf16* in, bf16* pre, bf16* out) const {
  if (fp8_.linear >= 0) return NoFp8Gelu();
  ctx_.tp->GatherRun(in, op, [&](int64_t r0, int64_t rows) {
    ctx_.mm->ForwardGelu(out + r0 * n_, pre + r0 * n_, in + r0 * k_, w_, b_, rows, k_, n_);
  });
}

void ColumnParallelLinear::ForwardAgain(const char* op, const bf16* in, bf16* out) const {
  if (fp8_.linear >= 0) return ForwardFp8(op, const_cast<bf16*>(in), out, false);
  ctx_.tp->RunBlocks(op, [&](int64_t r0, int64_t rows) {
    ctx_.mm->Forward(out + r0 * n_, in + r0 * k_, w_, b_, rows, k_, n_);
  });
}

void ColumnParallelLinear::ForwardGeluAgain(const char* op, const bf16* in, bf16* pre,
                                            bf16* out) const {
  if (fp8_.linear >= 0) return NoFp8Gelu();
  ctx_.tp->RunBlocks(op, [&](int64_t r0, int64_t rows) {
    ctx_.mm->ForwardGelu(out + r0 * n_, pre + r0 * n_, in + r0 * k_, w_, b_, rows, k_, n_);
  });
}

// Under SP on two ranks of one node: the rows the peer keeps first, sent while the weight
// gradient is computed, then this rank's rows accumulated onto the peer's partial sums of them.
// Otherwise the whole product, then its TP reduction beside the weight gradient.
void ColumnParallelLinear::Backward(const char* op, const bf16* dout, const bf16* in, bf16* din,
                                    const uint8_t* in_t) const {
  BackwardImpl(op, dout, nullptr, in, in_t, din);
}

void ColumnParallelLinear::Backward(const char* op, const Fp8Source& dout, const bf16* in,
                                    bf16* din, const uint8_t* in_t) const {
  if (!fp8()) Die("ColumnParallelLinear", "an FP8 source for a bf16 layer", __FILE__, __LINE__);
  BackwardImpl(op, nullptr, &dout, in, in_t, din);
}

void ColumnParallelLinear::BackwardImpl(const char* op, const bf16* dout, const Fp8Source* dout_fp8,
                                        const bf16* in, const uint8_t* in_t, bf16* din) const {
  TensorParallel& tp = *ctx_.tp;
  const RowGeometry& g = tp.rows();
  OpProfile& prof = *ctx_.prof;
  Matmul& mm = *ctx_.mm;
  Fp8Products* f = fp8_.linear >= 0 ? ctx_.fp8 : nullptr;
  const char* cast = f != nullptr ? Fp8CastName(op) : nullptr;
  if (f != nullptr) {
    prof.Begin(cast);  // the bias gradient summed on the way
    f->CastGrad(fp8_, dout_fp8 != nullptr ? *dout_fp8 : Fp8Source{dout}, g.rows, n_, db_);
    op = Fp8OpName(op);
  }
  prof.Begin(op);
  auto weight_grad = [&] {
    if (f == nullptr) return WeightGrad(ctx_, dw_, db_, dout, in, k_, n_);
    if (in_t == nullptr) {
      prof.Begin(cast);
      f->CastInputTransposed(fp8_, Fp8Source{in}, g.rows, k_);
      prof.Begin(op);
    }
    f->BackwardWeight(fp8_, dw_, g.rows, k_, n_, in_t);
  };
  // din's rows [r0, r0 + rows) from dout's (+= with `accumulate`).
  auto dgrad = [&](int64_t r0, int64_t rows, bool accumulate) {
    if (f != nullptr) return f->BackwardData(fp8_, din, r0, rows, k_, n_, accumulate);
    mm.BackwardData(din + r0 * k_, dout + r0 * n_, w_, rows, k_, n_, accumulate);
  };
  if (PeerExchange* exchange = tp.exchange(); exchange != nullptr && tp.size() == 2) {
    const int peer = 1 - tp.rank();
    const size_t count = static_cast<size_t>(g.local_rows * k_);
    dgrad(peer * g.local_rows, g.local_rows, false);
    exchange->Send(din + peer * count, count * sizeof(bf16), MainStream());
    weight_grad();
    prof.Begin("tensor-parallel communication");
    exchange->Receive(tp.LocalRows(din), count * sizeof(bf16), MainStream());
    prof.Begin(op);
    dgrad(tp.rank() * g.local_rows, g.local_rows, /*accumulate=*/true);
    exchange->WaitSent(MainStream());
    return;
  }
  dgrad(0, g.rows, false);
  tp.ReduceRows(din, tp.LocalRows(din), /*wait=*/false);
  prof.Begin(op);
  weight_grad();
  tp.Wait();
}

RowParallelOutput RowParallelLinear::Forward(const char* op, const bf16* in,
                                             uint8_t* keep_t) const {
  return ForwardImpl(op, in, nullptr, keep_t);
}

RowParallelOutput RowParallelLinear::Forward(const char* op, const Fp8Source& in,
                                             uint8_t* keep_t) const {
  if (fp8_.linear < 0)
    Die("RowParallelLinear", "an FP8 source for a bf16 layer", __FILE__, __LINE__);
  return ForwardImpl(op, nullptr, &in, keep_t);
}

RowParallelOutput RowParallelLinear::ForwardImpl(const char* op, const bf16* in,
                                                 const Fp8Source* in_fp8, uint8_t* keep_t) const {
  TensorParallel& tp = *ctx_.tp;
  const RowGeometry& g = tp.rows();
  // The bias is added once (TP rank 0) before the partial sums are reduced.
  const bf16* bias = tp.rank() == 0 ? b_ : nullptr;
  OpProfile& prof = *ctx_.prof;
  Fp8Products* f = fp8_.linear >= 0 ? ctx_.fp8 : nullptr;
  if (f != nullptr) {
    prof.Begin(Fp8CastName(op));
    f->PrepareWeight(fp8_);
    f->CastInput(fp8_, in_fp8 != nullptr ? *in_fp8 : Fp8Source{in}, g.rows, k_, keep_t);
    op = Fp8OpName(op);
  }
  auto gemm = [&](int64_t r0, int64_t rows) {
    if (f != nullptr) return f->Forward(fp8_, out_.partial, bias, r0, rows, k_, n_);
    ctx_.mm->Forward(out_.partial + r0 * n_, in + r0 * k_, w_, bias, rows, k_, n_);
  };
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

void RowParallelLinear::Backward(const char* op, bf16* dout, const Fp8Source& in, bf16* din,
                                 const uint8_t* in_t) const {
  if (fp8_.linear < 0)
    Die("RowParallelLinear", "an FP8 source for a bf16 layer", __FILE__, __LINE__);
  BackwardFp8(op, dout, in, in_t, din);
}

void RowParallelLinear::BackwardFp8(const char* op, bf16* dout, const Fp8Source& in,
                                    const uint8_t* in_t, bf16* din) const {
  TensorParallel& tp = *ctx_.tp;
  const RowGeometry& g = tp.rows();
  OpProfile& prof = *ctx_.prof;
  Fp8Products& f = *ctx_.fp8;
  const bool sp = tp.sequence_parallel();
  if (db_ != nullptr && sp) {  // from this rank's rows (summed over TP by the optimizer)
    prof.Begin("bias gradient");
    ColumnSumAccumulate<bf16>(db_, tp.LocalRows(dout), g.local_rows, n_, ctx_.scratch,
                              MainStream());
  }
  if (sp) {
    prof.Begin("tensor-parallel communication");
    tp.GatherRows(dout);
  }
  prof.Begin(Fp8CastName(op));  // without SP the bias gradient summed on the way
  f.CastGrad(fp8_, Fp8Source{dout}, g.rows, n_, sp ? nullptr : db_);
  if (in_t == nullptr) f.CastInputTransposed(fp8_, in, g.rows, k_);
  prof.Begin(Fp8OpName(op));
  f.BackwardWeight(fp8_, dw_, g.rows, k_, n_, in_t);
  f.BackwardData(fp8_, din, 0, g.rows, k_, n_);
}

void RowParallelLinear::Backward(const char* op, bf16* dout, const bf16* in, bf16* din,
                                 const bf16* gelu_pre, const uint8_t* in_t) const {
  if (fp8_.linear >= 0) {
    if (gelu_pre != nullptr) NoFp8Gelu();
    return BackwardFp8(op, dout, Fp8Source{in}, in_t, din);
  }
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
