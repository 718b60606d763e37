// The bf16 model's tensor-parallel linear layers (Megatron's ColumnParallelLinear and
// RowParallelLinear), shared by the attention and MLP blocks, with their communication overlapped
// with the products beside it:
//   ColumnParallelLinear  W's rows split over TP. Forward: under SP the input's rows are gathered
//     around the ring while each arrived block is multiplied. Backward: the input gradient's TP
//     reduction (reduce-scatter under SP) runs while the weight gradient is computed; on two GPUs
//     of one node the rows the peer keeps are computed first and sent while the rest is.
//   RowParallelLinear  W's columns split. Forward: partial sums of all rows, reduced over TP; under
//     SP on two ranks the rows the peer keeps are computed first and sent while this rank's are,
//     and the sum is left as two addends for the next fused residual + norm kernel. Backward:
//     under SP the output gradient's rows are gathered around the ring block by block, each
//     multiplied as it arrives.
// Rows are the micro-batch's tokens; "all rows" buffers hold every token, with this rank's rows
// (TensorParallel::LocalRows) in place under SP.
// A layer given an FP8 weight (fp8_products.h) multiplies in FP8: its input and output gradient
// are cast whole, so under SP the rows are gathered first and the gather is not overlapped with
// the product (the peer exchanges on two GPUs still are).
#pragma once

#include <cstdint>
#include <functional>

#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/fp8_products.h"
#include "trainer/cuda/matmul.h"
#include "trainer/cuda/op_profile.h"
#include "trainer/cuda/parallel/tensor_parallel.h"

namespace leantron::trainer::cuda {

// What every linear layer of a model shares: the products, the TP communication, the profile,
// and scratch for bias gradients.
struct LinearContext {
  Matmul* mm = nullptr;
  TensorParallel* tp = nullptr;
  OpProfile* prof = nullptr;
  float* bias_grad = nullptr;  // [widest output], the epilogue's bias gradient before it is added
  Scratch scratch;             // ColumnSumAccumulate's partial sums
  Fp8Products* fp8 = nullptr;  // the FP8 products (--fp8-format), null without
};

// A row-parallel output: this rank's rows of the sum are `local` plus `addend` (null when `local`
// holds the sum alone).
struct RowParallelOutput {
  const bf16* local = nullptr;
  const bf16* addend = nullptr;
};

// The output buffers every row-parallel layer of a model shares.
struct RowParallelBuffers {
  bf16* partial = nullptr;  // [rows, n] partial sums of all rows
  bf16* local = nullptr;    // this rank's rows of the sum (inside `partial` where it can be)
  bf16* peer = nullptr;     // SP on two ranks: the peer's partial sums of this rank's rows
};

class ColumnParallelLinear {
 public:
  // With `fp8` the products run in FP8 (ctx.fp8 gives the weight its FP8 copy).
  ColumnParallelLinear(const LinearContext& ctx, int64_t k, int64_t n, const bf16* w, const bf16* b,
                       float* dw, float* db, bool fp8 = false)
      : ctx_(ctx), k_(k), n_(n), w_(w), b_(b), dw_(dw), db_(db) {
    if (fp8) fp8_ = ctx.fp8->NewWeight(w, n, k);
  }
  // out [rows, n] = in · Wᵀ + b; `in` is all rows (under SP only this rank's are present yet: the
  // ring gathers the rest in place).
  // FP8 layers with `keep_t`: the input's transposed FP8 copy [k, rows] kept there (the same cast
  // writes it) for Backward's weight gradient.
  void Forward(const char* op, bf16* in, bf16* out, uint8_t* keep_t = nullptr) const;
  // FP8 layers under delayed scaling, no SP: where the input's producer writes it cast (a norm),
  // then Forward from there, its transpose kept in keep_t.
  Fp8Out InputTarget() const { return ctx_.fp8->InputTarget(fp8_); }
  void ForwardCast(const char* op, bf16* out, uint8_t* keep_t) const;
  // The same with tanh GELU in the epilogue: pre = in · Wᵀ + b, out = gelu(pre).
  void ForwardGelu(const char* op, bf16* in, bf16* pre, bf16* out) const;
  // Forward and ForwardGelu again when `in` holds all rows already (a recomputation in the
  // backward): no gather, the same products, so the same bits.
  void ForwardAgain(const char* op, const bf16* in, bf16* out) const;
  void ForwardGeluAgain(const char* op, const bf16* in, bf16* pre, bf16* out) const;
  // din = dout · W reduced over TP (this rank's rows in place inside the all-rows `din`; all rows
  // without SP), dW += doutᵀ · in and db += Σ dout meanwhile.
  // FP8 layers: `in_t`, when given, is Forward's keep_t (`in` is not read then).
  void Backward(const char* op, const bf16* dout, const bf16* in, bf16* din,
                const uint8_t* in_t = nullptr) const;
  // FP8 layers: the same with the output gradient computed by its cast (fc1's from the
  // activation's gradient, fp8.h), the bias gradient summed on the way.
  void Backward(const char* op, const Fp8Source& dout, const bf16* in, bf16* din,
                const uint8_t* in_t = nullptr) const;
  bool fp8() const { return fp8_.linear >= 0; }

 private:
  // One of dout and dout_fp8 given.
  void BackwardImpl(const char* op, const bf16* dout, const Fp8Source* dout_fp8, const bf16* in,
                    const uint8_t* in_t, bf16* din) const;
  // The FP8 forward: `in` gathered whole when `gather` (under SP), out = in · Wᵀ + b. FP8 layers
  // have no GELU epilogue (ForwardGelu dies): their MLP casts fc2's input from fc1's output.
  void ForwardFp8(const char* op, bf16* in, bf16* out, bool gather,
                  uint8_t* keep_t = nullptr) const;

  const LinearContext& ctx_;
  int64_t k_, n_;
  const bf16 *w_, *b_;
  float *dw_, *db_;
  Fp8Weight fp8_;  // linear < 0: bf16 products
};

class RowParallelLinear {
 public:
  RowParallelLinear(const LinearContext& ctx, const RowParallelBuffers& out, int64_t k, int64_t n,
                    const bf16* w, const bf16* b, float* dw, float* db, bool fp8 = false)
      : ctx_(ctx), out_(out), k_(k), n_(n), w_(w), b_(b), dw_(dw), db_(db) {
    if (fp8) fp8_ = ctx.fp8->NewWeight(w, n, k);
  }
  // Σ_TP in · Wᵀ (+ b, added once by TP rank 0), `in` [rows, k] all rows.
  RowParallelOutput Forward(const char* op, const bf16* in, uint8_t* keep_t = nullptr) const;
  // FP8 layers: the same with the input computed by its cast (fc2's from fc1's output through the
  // activation, fp8.h); with `keep_t` its transposed FP8 copy [k, rows] kept there for Backward.
  RowParallelOutput Forward(const char* op, const Fp8Source& in, uint8_t* keep_t = nullptr) const;
  // din [rows, k] = dout · W (with `gelu_pre`, times tanh GELU's derivative at it, in the
  // epilogue), dW += doutᵀ · in, db += Σ dout. `dout` is all rows; under SP only this rank's are
  // present and the ring gathers the rest in place, block by block, each multiplied on arrival.
  void Backward(const char* op, bf16* dout, const bf16* in, bf16* din,
                const bf16* gelu_pre = nullptr, const uint8_t* in_t = nullptr) const;
  // FP8 layers: the same with the input computed by its cast, as Forward's, or read transposed
  // from `in_t` (Forward's keep_t) when given.
  void Backward(const char* op, bf16* dout, const Fp8Source& in, bf16* din,
                const uint8_t* in_t = nullptr) const;

 private:
  // One of in and in_fp8 given.
  RowParallelOutput ForwardImpl(const char* op, const bf16* in, const Fp8Source* in_fp8,
                                uint8_t* keep_t) const;
  void BackwardFp8(const char* op, bf16* dout, const Fp8Source& in, const uint8_t* in_t,
                   bf16* din) const;

  const LinearContext& ctx_;
  const RowParallelBuffers& out_;
  int64_t k_, n_;
  const bf16 *w_, *b_;
  float *dw_, *db_;
  Fp8Weight fp8_;
};

// The profile's names of an FP8 layer's ops, strings that live as long as the process: "fp8 " +
// op for its products, "fp8 cast " + op less its "matmul " for the casts that feed them (the
// profile counts every "fp8 cast ..." as a cast).
const char* Fp8OpName(const char* op);
const char* Fp8CastName(const char* op);

// dW += doutᵀ·in and db += Σ_rows dout over all rows (db may be null): the bias gradient from
// cuBLASLt's epilogue when it has one for this shape, else a column-sum kernel.
void WeightGrad(const LinearContext& ctx, float* dw, float* db, const bf16* dout, const bf16* in,
                int64_t k, int64_t n);

}  // namespace leantron::trainer::cuda
