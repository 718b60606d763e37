#include "trainer/cuda/fp8_matmul.h"

#include <cstdio>
#include <vector>

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
  // The heuristic's candidates, best first; `used` the first that ran (some refuse at run time).
  std::vector<cublasLtMatmulAlgo_t> algos;
  size_t used = 0;
  bool refused = false;  // a bias plan no candidate runs: Gemm answers false at once
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
              align_d, bias] = key;
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
  if (bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                   &epilogue, sizeof(epilogue)));
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &bias_type, sizeof(bias_type)));
  }
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
  cublasLtMatmulHeuristicResult_t results[8] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle_, plan->desc, plan->a, plan->b, plan->d, plan->d, pref, 8, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    char what[256];
    std::snprintf(what, sizeof(what),
                  "cuBLASLt has no FP8 algorithm for m=%ld n=%ld k=%ld ldd=%ld (status %d)",
                  static_cast<long>(m), static_cast<long>(n), static_cast<long>(k),
                  static_cast<long>(ldd), static_cast<int>(st));
    Die("Fp8Matmul", what, __FILE__, __LINE__);
  }
  for (int i = 0; i < found; ++i) plan->algos.push_back(results[i].algo);
  Plan* p = plan.get();
  plans_.emplace(key, std::move(plan));
  return p;
}

bool Fp8Matmul::Gemm(int64_t m, int64_t n, int64_t k, const Fp8Operand& a, const Fp8Operand& b,
                     void* d, cudaDataType_t d_type, int64_t ldd, bool accumulate, bool fast_accum,
                     const bf16* bias) {
  if (a.format == Fp8Format::kE5M2 && b.format == Fp8Format::kE5M2)
    Die("Fp8Matmul", "two E5M2 operands: cuBLASLt multiplies E5M2 only by E4M3", __FILE__,
        __LINE__);
  if (bias != nullptr && d_type != CUDA_R_16BF)
    Die("Fp8Matmul", "a bias needs a bf16 output", __FILE__, __LINE__);
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
                Alignment(d),
                bias != nullptr};
  Plan* plan = GetPlan(key);
  LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                 &a.scale_inv, sizeof(a.scale_inv)));
  LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                 &b.scale_inv, sizeof(b.scale_inv)));
  if (bias != nullptr) {
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof(bias)));
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (plan->refused) return false;
  cublasStatus_t st;
  while (true) {
    st = cublasLtMatmul(handle_, plan->desc, &alpha, a.data, plan->a, b.data, plan->b, &beta, d,
                        plan->d, d, plan->d, &plan->algos[plan->used], workspace_, workspace_bytes_,
                        MainStream());
    if (st != CUBLAS_STATUS_NOT_SUPPORTED || plan->used + 1 >= plan->algos.size()) break;
    ++plan->used;  // the next candidate, from now on
  }
  if (st == CUBLAS_STATUS_NOT_SUPPORTED && bias != nullptr) {
    plan->refused = true;
    return false;
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    char what[320];
    std::snprintf(
        what, sizeof(what),
        "cuBLASLt ran none of its %zu FP8 algorithms for m=%ld n=%ld k=%ld ldd=%ld "
        "(a %s, b %s, %s out%s%s): status %d",
        plan->algos.size(), static_cast<long>(m), static_cast<long>(n), static_cast<long>(k),
        static_cast<long>(ldd), a.format == Fp8Format::kE4M3 ? "E4M3" : "E5M2",
        b.format == Fp8Format::kE4M3 ? "E4M3" : "E5M2", d_type == CUDA_R_32F ? "fp32" : "bf16",
        accumulate ? ", accumulating" : "", bias != nullptr ? ", bias" : "", static_cast<int>(st));
    Die("Fp8Matmul", what, __FILE__, __LINE__);
  }
  return true;
}

}  // namespace leantron::trainer::cuda
