// cuBLASLt matrix products for the bf16 model, in the row-major terms the model thinks in:
//   Forward:      out[M, N]  = in[M, K] · W[N, K]ᵀ (+ bias[N])          bf16 out
//   BackwardData: din[M, K]  = dout[M, N] · W[N, K]                     bf16 out
//   BackwardWeight: dW[N, K] += dout[M, N]ᵀ · in[M, K]                   fp32 accumulate in place
// Plans (descriptors, layouts and the chosen algorithm) are cached per shape and pointer alignment,
// so the steady state makes no heuristic queries and no allocations. With `tune`, the first call
// of a shape times the heuristic's best few algorithms and keeps its first choice unless another
// is clearly (15%) faster; on tiny products timing noise can still tip that choice, so two runs
// may then differ in their last bits. Without it (--deterministic-mode) the heuristic's first
// choice is taken: runs are bitwise repeatable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "trainer/cuda/cuda_util.h"

namespace leantron::trainer::cuda {

class Matmul {
 public:
  explicit Matmul(bool tune = true, size_t workspace_bytes = size_t{64} << 20);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  void Forward(bf16* out, const bf16* in, const bf16* weight, const bf16* bias, int64_t m,
               int64_t k, int64_t n);
  // din = dout · W; with accumulate, din += (bf16 in, fp32 math).
  void BackwardData(bf16* din, const bf16* dout, const bf16* weight, int64_t m, int64_t k,
                    int64_t n, bool accumulate = false);
  void BackwardWeight(float* dweight, const bf16* dout, const bf16* in, int64_t m, int64_t k,
                      int64_t n);
  // The same with the bias gradient from cuBLASLt's epilogue: dbias_out[N] = Σ_rows dout
  // (written, not accumulated). False (and nothing done) when cuBLASLt has no such kernel.
  bool BackwardWeightBias(float* dweight, float* dbias_out, const bf16* dout, const bf16* in,
                          int64_t m, int64_t k, int64_t n);
  // Fused tanh GELU (GPT-2's, Megatron's --openai-gelu), in cuBLASLt's epilogues:
  //   ForwardGelu:      pre = in · Wᵀ + bias; out = gelu(pre)         (both kept, bf16)
  //   BackwardDataGelu: dpre = (dout · W) ⊙ gelu'(pre)
  void ForwardGelu(bf16* out, bf16* pre, const bf16* in, const bf16* weight, const bf16* bias,
                   int64_t m, int64_t k, int64_t n);
  void BackwardDataGelu(bf16* dpre, const bf16* dout, const bf16* weight, const bf16* pre,
                        int64_t m, int64_t k, int64_t n);

  enum class Epilogue { kNone, kBias, kGeluAux, kGeluAuxBias, kDGelu, kBGradB };

  // A general column-major product D = alpha·op(A)·op(B) + beta·C (C = D), with an optional bias
  // epilogue (bias of length m, broadcast over columns). Types: A, B bf16; D bf16 or fp32.
  // False when an optional epilogue (kBGradB) has no kernel; any other failure aborts.
  bool Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda,
            const bf16* b, int64_t ldb, void* d, cudaDataType_t d_type, int64_t ldd, float alpha,
            float beta, const bf16* bias, Epilogue epilogue = Epilogue::kNone, void* aux = nullptr,
            int64_t ld_aux = 0);

 private:
  struct Plan;
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                         int, int, int, bool, int64_t>;
  Plan* GetPlan(const Key& key);  // null: no algorithm for an optional epilogue
  void Tune(Plan* plan, float alpha, const void* a, const void* b, float beta, void* d,
            cudaDataType_t d_type, int64_t d_elements);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool tune_ = true;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace leantron::trainer::cuda
