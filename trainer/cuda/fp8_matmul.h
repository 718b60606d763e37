// FP8 matrix products through cuBLASLt (Hopper's FP8 tensor cores). Hopper takes FP8 operands only
// in the "TN" form: both operands contiguous along the reduced dimension K. In the row-major
// terms of the bf16 model's Matmul (matmul.h):
//   Forward:        out[M, N]  = in[M, K] · W[N, K]ᵀ       Gemm(N, M, K, W, in, out, ldd N)
//   BackwardData:   din[M, K]  = dout[M, N] · W[N, K]      Gemm(K, M, N, Wᵀ[K, N], dout, din, ldd
//   K) BackwardWeight: dW[N, K]  += dout[M, N]ᵀ · in[M, K]    Gemm(K, N, M, inᵀ[K, M], doutᵀ[N, M],
//                                                               dW (fp32), ldd K, accumulate)
// so the backward reads transposed FP8 copies (CastToFp8's out_t). Each operand comes with the
// device pointer of its dequantisation scale (1 / the scale it was cast with); the product is
// computed in fp32 and written as bf16 (with a bias in the epilogue) or fp32. Plans are cached per
// shape and alignment.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/kernels/fp8.h"

namespace leantron::trainer::cuda {

struct Fp8Operand {
  const uint8_t* data = nullptr;  // [rows, K] row-major: each row contiguous over K
  Fp8Format format = Fp8Format::kE4M3;
  const float* scale_inv = nullptr;  // device, one float
};

class Fp8Matmul {
 public:
  explicit Fp8Matmul(size_t workspace_bytes = size_t{32} << 20);
  ~Fp8Matmul();
  Fp8Matmul(const Fp8Matmul&) = delete;
  Fp8Matmul& operator=(const Fp8Matmul&) = delete;

  // Column-major D[m, n] (leading dimension ldd) = a_scale_inv · b_scale_inv · Σ_k a[i, k]·b[j, k]
  // (+ bias[i], bf16 D only) (+ D when `accumulate`), a being m rows and b n rows of K contiguous
  // values. `fast_accum`: Hopper's faster, less precise accumulation (TransformerEngine uses it
  // for the forward only). Two E5M2 operands are refused (cuBLASLt has no such product); so are
  // shapes cuBLASLt cannot run (K and the leading dimensions multiples of 16). False, with
  // nothing done, when cuBLASLt has no FP8 kernel with the bias epilogue for this product (seen
  // on an H100 with cuBLAS 13): the caller adds the bias itself.
  bool Gemm(int64_t m, int64_t n, int64_t k, const Fp8Operand& a, const Fp8Operand& b, void* d,
            cudaDataType_t d_type, int64_t ldd, bool accumulate, bool fast_accum,
            const bf16* bias = nullptr);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int, int, int, bool, bool, int, int,
                         int, bool>;
  Plan* GetPlan(const Key& key);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace leantron::trainer::cuda
