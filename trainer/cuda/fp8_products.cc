#include "trainer/cuda/fp8_products.h"

#include <algorithm>

#include "trainer/cuda/kernels/kernels.h"
#include "trainer/dist/nccl_comm.h"

namespace leantron::trainer::cuda {

Fp8Scaling::Fp8Scaling(const Fp8Options& options, int linears, DeviceMemory* memory)
    : opt_(options), linears_(linears), len_(options.delayed ? options.amax_history_len : 1) {
  const int64_t tensors = int64_t{3} * linears_;
  histories_ = memory->Alloc<float>(state_floats());
  // The slots start at a multiple of 16 bytes (cudaMalloc's memory is 256-byte aligned).
  const int64_t slot_floats = (tensors * len_ + kSlot - 1) / kSlot * kSlot;
  slots_ = histories_ + slot_floats;
  measured_ = memory->Alloc<float>(1);
  // Scales start at 1, as TransformerEngine's do (the first delayed step casts unscaled).
  std::vector<float> slots(tensors * kSlot, 0.0f);
  for (int64_t t = 0; t < tensors; ++t) slots[t * kSlot] = slots[t * kSlot + 1] = 1.0f;
  LT_CUDA_CHECK(cudaMemcpyAsync(slots_, slots.data(), slots.size() * sizeof(float),
                                cudaMemcpyHostToDevice, MainStream()));
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
}

int Fp8Scaling::AddLinear() {
  if (added_ >= linears_) Die("Fp8Scaling", "more linear layers than counted", __FILE__, __LINE__);
  return added_++;
}

template <typename T>
void Fp8Scaling::Cast(int linear, Kind k, const T* x, int64_t rows, int64_t cols, uint8_t* out,
                      uint8_t* out_t, bool record) const {
  const int64_t t = Index(linear, k);
  float* amax = histories_ + t * len_;
  if (!opt_.delayed) {
    LT_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), MainStream()));
    AbsMax<T>(amax, x, static_cast<size_t>(rows * cols), MainStream());
    ComputeFp8Scale(Scale(t), ScaleInv(t), amax, format(k), opt_.margin, MainStream());
    record = false;
  }
  recorded_ = recorded_ || record;
  CastToFp8<T>(out, out_t, record ? amax : nullptr, x, rows, cols, Scale(t), format(k),
               MainStream());
}

void Fp8Scaling::Cast(int linear, Kind k, const Fp8Source& src, int64_t rows, int64_t cols,
                      uint8_t* out, uint8_t* out_t, bool record, float* dbias, float* workspace,
                      bool measure) const {
  if (src.act == Fp8Activation::kNone && dbias == nullptr && (!measure || !opt_.delayed))
    return Cast<bf16>(linear, k, src.x, rows, cols, out, out_t, record);
  const int64_t t = Index(linear, k);
  float* amax = histories_ + t * len_;
  if (!opt_.delayed || measure) {  // the amax of the values first, computed the same way
    float* m = opt_.delayed ? measured_ : amax;
    LT_CUDA_CHECK(cudaMemsetAsync(m, 0, sizeof(float), MainStream()));
    CastSourceToFp8(nullptr, nullptr, m, src, rows, cols, Scale(t), format(k), nullptr, nullptr,
                    MainStream());
    ComputeFp8Scale(Scale(t), ScaleInv(t), m, format(k), opt_.margin, MainStream());
    record = record && opt_.delayed;
  }
  recorded_ = recorded_ || record;
  CastSourceToFp8(out, out_t, record ? amax : nullptr, src, rows, cols, Scale(t), format(k), dbias,
                  workspace, MainStream());
}

void Fp8Scaling::ReduceHistories(NcclCommunicator* amax_group) {
  if (!opt_.delayed || amax_group == nullptr || amax_group->size() <= 1) return;
  amax_group->AllReduce(histories_, static_cast<size_t>(3 * linears_) * len_, CommType::kF32,
                        MainStream(), ReduceOp::kMax);
}

void Fp8Scaling::NewWeights(NcclCommunicator* amax_group) {
  ++epoch_;
  if (!opt_.delayed) return;
  fresh_ = fresh_ && !recorded_;  // the scales now come from recorded amaxes
  ReduceHistories(amax_group);
  // Inputs and weights in E4M3; gradients in E5M2 under the hybrid format.
  UpdateFp8DelayedScales(histories_, 2 * linears_, len_, opt_.amax_most_recent, Scale(0),
                         ScaleInv(0), kSlot, Fp8Format::kE4M3, opt_.margin, MainStream());
  const int64_t g = Index(0, kGrad);
  UpdateFp8DelayedScales(histories_ + g * len_, linears_, len_, opt_.amax_most_recent, Scale(g),
                         ScaleInv(g), kSlot, format(kGrad), opt_.margin, MainStream());
}

template void Fp8Scaling::Cast<bf16>(int, Kind, const bf16*, int64_t, int64_t, uint8_t*, uint8_t*,
                                     bool) const;

Fp8Products::Fp8Products(Fp8Scaling* scaling, int64_t rows, int64_t widest_in, int64_t widest_out,
                         DeviceMemory* memory, int64_t grad_elems)
    : scaling_(scaling), memory_(memory) {
  in_ = memory->Alloc<uint8_t>(rows * widest_in);
  in_t_ = memory->Alloc<uint8_t>(rows * widest_in);
  grad_elems = std::max(grad_elems, rows * widest_out);
  grad_ = memory->Alloc<uint8_t>(grad_elems);
  grad_t_ = memory->Alloc<uint8_t>(grad_elems);
  bias_workspace_ = memory->Alloc<float>(Fp8BiasWorkspace(rows, widest_out));
}

Fp8Weight Fp8Products::NewWeight(const bf16* w16, int64_t n, int64_t k) {
  DeviceMemory* memory = memory_;
  Fp8Weight w;
  w.linear = scaling_->AddLinear();
  w.w = memory->Alloc<uint8_t>(n * k);
  w.w_t = memory->Alloc<uint8_t>(n * k);
  w.scale_inv = memory->Alloc<float>(1);
  if (static_cast<size_t>(w.linear) != weights_.size())
    Die("Fp8Products", "the weights of one scaling state come from one Fp8Products", __FILE__,
        __LINE__);
  weights_.push_back({w, w16, n, k});
  cast_epoch_.push_back(~uint64_t{0});
  return w;
}

void Fp8Products::PrepareWeight(const Fp8Weight& w) {
  const WeightCopy& c = weights_[w.linear];
  if (cast_epoch_[w.linear] == scaling_->epoch()) return;
  scaling_->Cast<bf16>(w.linear, Fp8Scaling::kWeight, c.w16, c.n, c.k, w.w, w.w_t,
                       /*record=*/true);
  WeightCast(w);
}

void Fp8Products::WeightCast(const Fp8Weight& w) {
  LT_CUDA_CHECK(cudaMemcpyAsync(w.scale_inv, scaling_->scale_inv(w.linear, Fp8Scaling::kWeight),
                                sizeof(float), cudaMemcpyDeviceToDevice, MainStream()));
  cast_epoch_[w.linear] = scaling_->epoch();
}

void Fp8Products::StepWeight(size_t i, float* param, const float* grad, float* exp_avg,
                             float* exp_avg_sq, const AdamWConstants& c, bf16* w16) {
  if (!scaling_->options().delayed)
    Die("Fp8Products::StepWeight", "the step casts with delayed scales only", __FILE__, __LINE__);
  const WeightCopy& wc = weights_[i];
  const Fp8Weight& w = wc.fp8;
  if (w16 != wc.w16)
    Die("Fp8Products::StepWeight", "the bf16 copy is not the one the layer reads", __FILE__,
        __LINE__);
  AdamWToFp8(param, grad, exp_avg, exp_avg_sq, c, w16, wc.n, wc.k, w.w, w.w_t,
             scaling_->history(w.linear, Fp8Scaling::kWeight),
             scaling_->scale(w.linear, Fp8Scaling::kWeight), scaling_->format(Fp8Scaling::kWeight),
             MainStream());
  WeightCast(w);
}

void Fp8Products::CastInput(const Fp8Weight& w, const Fp8Source& in, int64_t rows, int64_t k,
                            uint8_t* keep_t) {
  scaling_->Cast(w.linear, Fp8Scaling::kInput, in, rows, k, in_, keep_t, record_);
  // Delayed scales hold still within a step; tensorwise ones move at the next cast of the layer.
  if (keep_t != nullptr && !scaling_->options().delayed) {
    LT_CUDA_CHECK(cudaMemcpyAsync(keep_t + rows * k,
                                  scaling_->scale_inv(w.linear, Fp8Scaling::kInput), sizeof(float),
                                  cudaMemcpyDeviceToDevice, MainStream()));
  }
}

Fp8Out Fp8Products::InputTarget(const Fp8Weight& w) const {
  if (!scaling_->options().delayed)
    Die("Fp8Products", "a producer's cast needs delayed scaling", __FILE__, __LINE__);
  return {in_, scaling_->scale(w.linear, Fp8Scaling::kInput),
          record_ ? scaling_->history(w.linear, Fp8Scaling::kInput) : nullptr, Fp8Format::kE4M3};
}

void Fp8Products::TransposeInput(int64_t rows, int64_t k, uint8_t* keep_t) {
  TransposeFp8(keep_t, in_, rows, k, MainStream());
}

void Fp8Products::Forward(const Fp8Weight& w, bf16* out, const bf16* bias, int64_t r0, int64_t rows,
                          int64_t k, int64_t n) {
  const Fp8Operand a{w.w, Fp8Format::kE4M3, w.scale_inv};
  const Fp8Operand b{in_ + r0 * k, Fp8Format::kE4M3,
                     scaling_->scale_inv(w.linear, Fp8Scaling::kInput)};
  // Hopper's fast accumulation in the forward only, as TransformerEngine does.
  bf16* d = out + r0 * n;
  // The bias in the epilogue where cuBLASLt runs it for this plan (decided at its first call, so
  // a recomputed forward takes the same path), else added after.
  if (bias != nullptr &&
      mm_.Gemm(n, rows, k, a, b, d, CUDA_R_16BF, n, false, /*fast_accum=*/true, bias))
    return;
  mm_.Gemm(n, rows, k, a, b, d, CUDA_R_16BF, n, /*accumulate=*/false, /*fast_accum=*/true);
  if (bias != nullptr) AddBias<bf16>(d, bias, rows, n, MainStream());
}

void Fp8Products::CastGrad(const Fp8Weight& w, const Fp8Source& dout, int64_t rows, int64_t n,
                           float* dbias, bool measure_when_fresh) {
  scaling_->Cast(w.linear, Fp8Scaling::kGrad, dout, rows, n, grad_, grad_t_, /*record=*/true, dbias,
                 bias_workspace_, measure_when_fresh && scaling_->fresh());
}

void Fp8Products::BackwardData(const Fp8Weight& w, bf16* din, int64_t r0, int64_t rows, int64_t k,
                               int64_t n, bool accumulate) {
  const Fp8Operand a{w.w_t, Fp8Format::kE4M3, w.scale_inv};
  const Fp8Operand b{grad_ + r0 * n, scaling_->format(Fp8Scaling::kGrad),
                     scaling_->scale_inv(w.linear, Fp8Scaling::kGrad)};
  mm_.Gemm(k, rows, n, a, b, din + r0 * k, CUDA_R_16BF, k, accumulate, /*fast_accum=*/false);
}

void Fp8Products::CastInputTransposed(const Fp8Weight& w, const Fp8Source& in, int64_t rows,
                                      int64_t k) {
  // The forward's scale: delayed scales hold still within a step; current scaling measures the
  // same amax again. Recorded already in the forward.
  scaling_->Cast(w.linear, Fp8Scaling::kInput, in, rows, k, nullptr, in_t_, /*record=*/false);
}

void Fp8Products::BackwardWeight(const Fp8Weight& w, float* dw, int64_t rows, int64_t k, int64_t n,
                                 const uint8_t* in_t) {
  const bool kept_scale = in_t != nullptr && !scaling_->options().delayed;
  const Fp8Operand a{in_t != nullptr ? in_t : in_t_, Fp8Format::kE4M3,
                     kept_scale ? reinterpret_cast<const float*>(in_t + rows * k)
                                : scaling_->scale_inv(w.linear, Fp8Scaling::kInput)};
  const Fp8Operand b{grad_t_, scaling_->format(Fp8Scaling::kGrad),
                     scaling_->scale_inv(w.linear, Fp8Scaling::kGrad)};
  mm_.Gemm(k, n, rows, a, b, dw, CUDA_R_32F, k, /*accumulate=*/true, /*fast_accum=*/false);
}

}  // namespace leantron::trainer::cuda
