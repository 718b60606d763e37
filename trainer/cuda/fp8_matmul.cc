#include "trainer/cuda/fp8_matmul.h"

#include <cstdio>

namespace leantron::trainer::cuda {
namespace {

int Alignment(const void* p) {
  const auto x = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && x % a != 0) a /= 2;
  return a;
}

cudaDataType_t LtType(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

}  // namespace

struct Fp8Matmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Fp8Matmul::Fp8Matmul(size_t workspace_bytes) : workspace_bytes_(workspace_bytes) {
  LT_CUBLAS_CHECK(cublasLtCreate(&handle_));
  LT_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Fp8Matmul::~Fp8Matmul() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

Fp8Matmul::Plan* Fp8Matmul::GetPlan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  const auto [m, n, k, ldd, d_type_int, a_fmt, b_fmt, accumulate, fast_accum, align_a, align_b,
              align_d] = key;
  const auto d_type = static_cast<cudaDataType_t>(d_type_int);
  auto plan = std::make_unique<Plan>();
  LT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;
  LT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  LT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const int8_t fast = fast_accum ? 1 : 0;
  LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                 sizeof(fast)));
  LT_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->a, LtType(static_cast<Fp8Format>(a_fmt)), k, m, k));
  LT_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->b, LtType(static_cast<Fp8Format>(b_fmt)), k, n, k));
  LT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, d_type, m, n, ldd));

  cublasLtMatmulPreference_t pref;
  LT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  LT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof(workspace_bytes_)));
  const uint32_t aligns[4] = {static_cast<uint32_t>(align_a), static_cast<uint32_t>(align_b),
                              static_cast<uint32_t>(align_d), static_cast<uint32_t>(align_d)};
  const cublasLtMatmulPreferenceAttributes_t attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    LT_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, attrs[i], &aligns[i], sizeof(aligns[i])));
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle_, plan->desc, plan->a, plan->b, plan->d, plan->d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    char what[256];
    std::snprintf(what, sizeof(what),
                  "cuBLASLt has no FP8 algorithm for m=%ld n=%ld k=%ld ldd=%ld (status %d)",
                  static_cast<long>(m), static_cast<long>(n), static_cast<long>(k),
                  static_cast<long>(ldd), static_cast<int>(st));
    Die("Fp8Matmul", what, __FILE__, __LINE__);
  }
  plan->algo = result.algo;
  Plan* p = plan.get();
  plans_.emplace(key, std::move(plan));
  return p;
}

void Fp8Matmul::Gemm(int64_t m, int64_t n, int64_t k, const Fp8Operand& a, const Fp8Operand& b,
                     void* d, cudaDataType_t d_type, int64_t ldd, bool accumulate,
                     bool fast_accum) {
  if (a.format == Fp8Format::kE5M2 && b.format == Fp8Format::kE5M2)
    Die("Fp8Matmul", "two E5M2 operands: cuBLASLt multiplies E5M2 only by E4M3", __FILE__,
        __LINE__);
  if (accumulate && d_type != CUDA_R_32F)
    Die("Fp8Matmul", "accumulation needs an fp32 output", __FILE__, __LINE__);
  const Key key{m,
                n,
                k,
                ldd,
                int{d_type},
                static_cast<int>(a.format),
                static_cast<int>(b.format),
                accumulate,
                fast_accum,
                Alignment(a.data),
                Alignment(b.data),
                Alignment(d)};
  Plan* plan = GetPlan(key);
  LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                 &a.scale_inv, sizeof(a.scale_inv)));
  LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                 &b.scale_inv, sizeof(b.scale_inv)));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  LT_CUBLAS_CHECK(cublasLtMatmul(handle_, plan->desc, &alpha, a.data, plan->a, b.data, plan->b,
                                 &beta, d, plan->d, d, plan->d, &plan->algo, workspace_,
                                 workspace_bytes_, MainStream()));
}

}  // namespace leantron::trainer::cuda
