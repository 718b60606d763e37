// The bf16 model's linear layers in FP8 (Megatron's --fp8-format with TransformerEngine's
// recipes), in the row-major terms of Matmul (matmul.h):
//   Forward:        out[M, N]  = in[M, K] · W[N, K]ᵀ (+ bias)    E4M3 · E4M3, bf16 out
//   BackwardData:   din[M, K]  = dout[M, N] · W[N, K]             E4M3 Wᵀ · the gradient's format
//   BackwardWeight: dW[N, K]  += dout[M, N]ᵀ · in[M, K]           fp32, accumulated in place
// Hopper multiplies FP8 only along contiguous K (fp8_matmul.h), so the forward reads `in` and W as
// they are, the data gradient Wᵀ and dout, the weight gradient inᵀ and doutᵀ: a weight is cast
// once per new version of the weights (both layouts), dout once per backward (both layouts, the
// bias gradient summed on the way), and `in` in the forward, both layouts when the caller keeps
// the transpose for the backward (a byte per element, with its scale), else again, transposed, in
// the backward (the same scale, so the same bytes). What a cast
// reads may be computed on the way (fp8.h's Fp8Source): fc2's input is the activation of fc1's
// output, fc1's output gradient the activation's gradient through its derivative.
//
// Fp8Scaling holds every FP8 tensor's state on the device: per linear layer its input, its weight
// and its output gradient, each an amax history row (--fp8-amax-history-len), a scale and its
// inverse. Delayed scaling (--fp8-recipe delayed) casts with the scale from earlier steps'
// amaxes and records this cast's amax in the history; at each new version of the weights the
// histories are reduced over the amax group (max over data-parallel and context-parallel ranks,
// so their scales agree, as TransformerEngine does) and rolled, and the scales recomputed.
// Tensorwise scaling measures each tensor's amax just before its cast (current scaling).
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/device_memory.h"
#include "trainer/cuda/fp8_matmul.h"
#include "trainer/cuda/fp8_options.h"
#include "trainer/cuda/kernels/fp8.h"

namespace leantron::trainer {
class NcclCommunicator;
}  // namespace leantron::trainer

namespace leantron::trainer::cuda {

class Fp8Scaling {
 public:
  enum Kind { kInput = 0, kWeight = 1, kGrad = 2 };
  Fp8Scaling(const Fp8Options& options, int linears, DeviceMemory* memory);
  const Fp8Options& options() const { return opt_; }
  int linears() const { return linears_; }
  int AddLinear();  // the next linear layer's index
  Fp8Format format(Kind k) const {
    return k == kGrad && opt_.hybrid ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
  }
  float* history(int linear, Kind k) const { return histories_ + Index(linear, k) * len_; }
  const float* scale(int linear, Kind k) const { return Scale(Index(linear, k)); }
  const float* scale_inv(int linear, Kind k) const { return ScaleInv(Index(linear, k)); }
  // x [rows, cols] cast with the tensor's scale into `out` and/or its transpose `out_t`. Current
  // scaling measures the amax of x first; delayed scaling records the cast's amax (`record`).
  template <typename T>
  void Cast(int linear, Kind k, const T* x, int64_t rows, int64_t cols, uint8_t* out,
            uint8_t* out_t, bool record) const;
  // The same of a source's values (an MLP activation or its gradient computed on the way), with
  // `dbias` += their column sums when given (`workspace`: Fp8BiasWorkspace(rows, cols) floats).
  // `measure`: the scale from this tensor's own amax, measured first, under delayed scaling too
  // (its amax still recorded in the history).
  void Cast(int linear, Kind k, const Fp8Source& src, int64_t rows, int64_t cols, uint8_t* out,
            uint8_t* out_t, bool record, float* dbias = nullptr, float* workspace = nullptr,
            bool measure = false) const;
  // Delayed scaling before the first scales come from recorded amaxes (a new run, or one whose
  // checkpoint had no FP8 state of this layout): every scale is still 1.
  bool fresh() const { return opt_.delayed && fresh_; }
  // The state was loaded (SetFp8State): the scales are the saved ones.
  void Restored() { fresh_ = false; }
  // For new weights (before the optimizer step that makes them, or after initialisation or a
  // load): delayed scaling reduces the histories over `amax_group` (null: none), rolls them and
  // recomputes the scales. The weights' FP8 copies are cast again at their next use (unless the
  // step writes them: Fp8Products::StepWeight).
  void NewWeights(NcclCommunicator* amax_group);
  // The weights' FP8 copies are cast again at their next use (their bf16 copy was rewritten).
  void CopiesStale() { ++epoch_; }
  // Delayed scaling: the histories max-reduced over `amax_group` (idempotent until new amaxes are
  // recorded).
  void ReduceHistories(NcclCommunicator* amax_group);
  uint64_t epoch() const { return epoch_; }
  // The whole state (histories, scales, inverses) as floats, for checkpoints.
  float* state() const { return histories_; }
  size_t state_floats() const { return static_cast<size_t>(3 * linears_) * (len_ + kSlot) + kSlot; }

 private:
  // Each tensor's inverse scale and scale share a 16-byte slot {scale_inv, scale, 0, 0}: the
  // products read the inverse through an aligned pointer.
  static constexpr int kSlot = 4;
  int64_t Index(int linear, Kind k) const { return int64_t{k} * linears_ + linear; }
  float* ScaleInv(int64_t t) const { return slots_ + t * kSlot; }
  float* Scale(int64_t t) const { return slots_ + t * kSlot + 1; }
  Fp8Options opt_;
  int linears_, len_, added_ = 0;
  float* histories_;  // [3·linears·len]
  float* slots_;      // [3·linears·kSlot], 16-byte aligned
  float* measured_;   // a measured cast's amax under delayed scaling
  uint64_t epoch_ = 0;
  bool fresh_ = true;
  mutable bool recorded_ = false;  // a cast recorded its amax since the scales were last set
};

// One linear layer's FP8 weight: W [N, K] and Wᵀ [K, N], and the inverse scale they were cast with
// (the tensor's scale may move on before the next cast).
struct Fp8Weight {
  int linear = -1;
  uint8_t *w = nullptr, *w_t = nullptr;
  float* scale_inv = nullptr;
};

// The FP8 products of one model chunk, with scratch sized for its widest layer (and, for an FP8
// output layer, for a chunk of its output gradient: at least `grad_elems` of each layout).
class Fp8Products {
 public:
  Fp8Products(Fp8Scaling* scaling, int64_t rows, int64_t widest_in, int64_t widest_out,
              DeviceMemory* memory, int64_t grad_elems = 0);
  Fp8Scaling& scaling() { return *scaling_; }
  // The FP8 copy [n, k] of a linear layer's bf16 weight w16, allocated where the scratch is.
  Fp8Weight NewWeight(const bf16* w16, int64_t n, int64_t k);
  // Whether forwards record their inputs' amaxes (training micro-batches; evaluations do not).
  void set_record(bool record) { record_ = record; }

  // Casts W (NewWeight's w16) when the weights changed since its last cast (Fp8Scaling's epoch).
  void PrepareWeight(const Fp8Weight& w);
  // The weights NewWeight made, in the order made: where each one's bf16 copy is, and its shape.
  struct WeightCopy {
    Fp8Weight fp8;
    const bf16* w16;
    int64_t n, k;
  };
  const std::vector<WeightCopy>& weights() const { return weights_; }
  // Delayed scaling, after the scales moved on for the new weights (Fp8Scaling::NewWeights):
  // AdamW of weights()[i] from its fp32 values, gradient and moments, writing its bf16 copy w16
  // (weights()[i].w16) and, in the same pass, its FP8 copy in both layouts as PrepareWeight would
  // cast it (the same bytes and amax), so that PrepareWeight then has nothing to do.
  void StepWeight(size_t i, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                  const AdamWConstants& c, bf16* w16);
  // A kept transpose (CastInput's keep_t): the bytes [k, rows], then 16 bytes holding the inverse
  // scale they were cast with. Tensorwise scaling moves a layer's input scale at every cast, and
  // under pipeline parallelism later micro-batches' forwards run before this one's backward.
  static int64_t KeptBytes(int64_t rows, int64_t k) { return rows * k + 16; }
  // The forward's input, all `rows` rows, cast for Forward; with `keep_t` also its transpose
  // there (KeptBytes), for BackwardWeight (the same kernel writes both).
  void CastInput(const Fp8Weight& w, const Fp8Source& in, int64_t rows, int64_t k,
                 uint8_t* keep_t = nullptr);
  // Delayed scaling: where w's forward input goes when its producer casts it (a norm): E4M3 with
  // the input's scale, its amax recorded (not in evaluations). Forward reads it as CastInput's.
  Fp8Out InputTarget(const Fp8Weight& w) const;
  // The input its producer wrote there, transposed into keep_t (KeptBytes) for BackwardWeight.
  void TransposeInput(int64_t rows, int64_t k, uint8_t* keep_t);
  // out = rows [r0, r0 + rows) of the cast input · Wᵀ (+ bias).
  void Forward(const Fp8Weight& w, bf16* out, const bf16* bias, int64_t r0, int64_t rows, int64_t k,
               int64_t n);
  // The backward's output gradient, all `rows` rows, cast for BackwardData and BackwardWeight;
  // with `dbias`, += its column sums. `measure_when_fresh`: while the scaling state is fresh,
  // with a scale from its own amax (the output layer's: a unit scale would flush the small
  // probabilities' gradients and leave only the labels').
  void CastGrad(const Fp8Weight& w, const Fp8Source& dout, int64_t rows, int64_t n,
                float* dbias = nullptr, bool measure_when_fresh = false);
  // din (rows [r0, r0 + rows)) = (+=) the cast gradient's rows · W.
  void BackwardData(const Fp8Weight& w, bf16* din, int64_t r0, int64_t rows, int64_t k, int64_t n,
                    bool accumulate = false);
  // The forward's input (all `rows` rows) cast again, transposed, for BackwardWeight.
  void CastInputTransposed(const Fp8Weight& w, const Fp8Source& in, int64_t rows, int64_t k);
  // dW += the cast gradientᵀ · the transposed input (CastInputTransposed's, or `in_t` that
  // CastInput kept).
  void BackwardWeight(const Fp8Weight& w, float* dw, int64_t rows, int64_t k, int64_t n,
                      const uint8_t* in_t = nullptr);

 private:
  // After w's copy was cast: the inverse scale it was cast with kept beside it, and its epoch.
  void WeightCast(const Fp8Weight& w);

  Fp8Scaling* scaling_;
  DeviceMemory* memory_;
  Fp8Matmul mm_;
  uint8_t *in_, *in_t_, *grad_, *grad_t_;
  float* bias_workspace_;  // CastGrad's column sums
  bool record_ = true;
  std::vector<WeightCopy> weights_;
  std::vector<uint64_t> cast_epoch_;  // per weight, the scaling epoch its FP8 copy is of
};

}  // namespace leantron::trainer::cuda
