#include "trainer/cuda/matmul.h"

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace leantron::trainer::cuda {
namespace {

// Largest power of two (≤ 256) dividing the address: what the kernel may assume about it.
int Alignment(const void* p) {
  const auto x = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && x % a != 0) a /= 2;
  return a;
}

}  // namespace

struct Matmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's best few, for Tune()
  bool tuned = false;
  bool has_bias = false;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

Matmul::Matmul(bool tune, size_t workspace_bytes) : workspace_bytes_(workspace_bytes), tune_(tune) {
  LT_CUBLAS_CHECK(cublasLtCreate(&handle_));
  LT_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Matmul::~Matmul() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

Matmul::Plan* Matmul::GetPlan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();  // may be null: known to be unsupported
  const auto [ta, tb, m, n, k, lda, ldb, ldd, d_type_int, epilogue_int, align_a, align_b, align_d,
              accumulate, ld_aux] = key;
  const auto epilogue = static_cast<Epilogue>(epilogue_int);
  const bool has_bias = epilogue == Epilogue::kBias || epilogue == Epilogue::kGeluAuxBias;
  const auto d_type = static_cast<cudaDataType_t>(d_type_int);
  auto plan = std::make_unique<Plan>();
  LT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  LT_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (epilogue != Epilogue::kNone) {
    cublasLtEpilogue_t lt = CUBLASLT_EPILOGUE_DGELU;
    if (epilogue == Epilogue::kBias) lt = CUBLASLT_EPILOGUE_BIAS;
    if (epilogue == Epilogue::kGeluAux) lt = CUBLASLT_EPILOGUE_GELU_AUX;
    if (epilogue == Epilogue::kGeluAuxBias) lt = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if (epilogue == Epilogue::kBGradB) lt = CUBLASLT_EPILOGUE_BGRADB;
    LT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &lt, sizeof(lt)));
  }
  if (epilogue == Epilogue::kBGradB) {
    const cudaDataType_t bias_type = CUDA_R_32F;
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &bias_type, sizeof(bias_type)));
  }
  if (has_bias) {
    const cudaDataType_t bias_type = CUDA_R_16BF;
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &bias_type, sizeof(bias_type)));
  }
  if (epilogue == Epilogue::kGeluAux || epilogue == Epilogue::kGeluAuxBias ||
      epilogue == Epilogue::kDGelu) {
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &ld_aux, sizeof(ld_aux)));
    const cudaDataType_t aux_type = CUDA_R_16BF;
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)));
  }
  plan->has_bias = has_bias;
  LT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, ta ? k : m, ta ? m : k, lda));
  LT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, tb ? n : k, tb ? k : n, ldb));
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
  constexpr int kCandidates = 8;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle_, plan->desc, plan->a, plan->b, plan->d, plan->d, pref, kCandidates, results, &found);
  const cublasLtMatmulHeuristicResult_t& result = results[0];
  cublasLtMatmulPreferenceDestroy(pref);
  if (epilogue == Epilogue::kBGradB && (st != CUBLAS_STATUS_SUCCESS || found == 0)) {
    plans_.emplace(key, nullptr);
    return nullptr;
  }
  LT_CUBLAS_CHECK(st);
  if (found == 0) {
    char what[256];
    std::snprintf(what, sizeof(what), "cuBLASLt has no algorithm for m=%ld n=%ld k=%ld (beta %d)",
                  static_cast<long>(m), static_cast<long>(n), static_cast<long>(k),
                  accumulate ? 1 : 0);
    Die("cublasLtMatmulAlgoGetHeuristic", what, __FILE__, __LINE__);
  }
  plan->algo = result.algo;
  for (int i = 0; i < found; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->candidates.push_back(results[i].algo);
  }
  Plan* p = plan.get();
  plans_.emplace(key, std::move(plan));
  return p;
}

bool Matmul::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a,
                  int64_t lda, const bf16* b, int64_t ldb, void* d, cudaDataType_t d_type,
                  int64_t ldd, float alpha, float beta, const bf16* bias, Epilogue epilogue,
                  void* aux, int64_t ld_aux) {
  if (epilogue == Epilogue::kNone && bias != nullptr) epilogue = Epilogue::kBias;
  const Key key{trans_a,
                trans_b,
                m,
                n,
                k,
                lda,
                ldb,
                ldd,
                int{d_type},
                static_cast<int>(epilogue),
                Alignment(a),
                Alignment(b),
                Alignment(d),
                beta != 0.0f,
                ld_aux};
  Plan* plan = GetPlan(key);
  if (plan == nullptr) return false;
  if (epilogue == Epilogue::kBGradB) {  // `aux` is the bias-gradient output here
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &aux, sizeof(aux)));
    aux = nullptr;
  }
  if (bias != nullptr) {
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof(bias)));
  }
  if (aux != nullptr) {
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  if (tune_ && !plan->tuned) Tune(plan, alpha, a, b, beta, d, d_type, ldd * n);
  LT_CUBLAS_CHECK(cublasLtMatmul(handle_, plan->desc, &alpha, a, plan->a, b, plan->b, &beta, d,
                                 plan->d, d, plan->d, &plan->algo, workspace_, workspace_bytes_,
                                 MainStream()));
  return true;
}

// Times the heuristic's candidates once per shape (on a scratch output when the product
// accumulates, so no result is disturbed) and keeps the fastest only when it beats the
// heuristic's first choice by a clear margin: a choice that timing noise could flip would make
// two runs pick different kernels, and so differ in their last bits.
void Matmul::Tune(Plan* plan, float alpha, const void* a, const void* b, float beta, void* d,
                  cudaDataType_t d_type, int64_t d_elements) {
  plan->tuned = true;
  if (plan->candidates.size() < 2) return;
  void* out = d;
  if (beta != 0.0f) {
    const size_t bytes = static_cast<size_t>(d_elements) * (d_type == CUDA_R_32F ? 4 : 2);
    LT_CUDA_CHECK(cudaMalloc(&out, bytes));
    LT_CUDA_CHECK(cudaMemsetAsync(out, 0, bytes, MainStream()));
  }
  cudaEvent_t start, stop;
  LT_CUDA_CHECK(cudaEventCreate(&start));
  LT_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms(plan->candidates.size(), 1e30f);
  for (size_t i = 0; i < plan->candidates.size(); ++i) {
    auto run = [&] {
      return cublasLtMatmul(handle_, plan->desc, &alpha, a, plan->a, b, plan->b, &beta, out,
                            plan->d, out, plan->d, &plan->candidates[i], workspace_,
                            workspace_bytes_, MainStream());
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; a failing candidate is skipped
    LT_CUDA_CHECK(cudaEventRecord(start, MainStream()));
    constexpr int kReps = 5;
    for (int r = 0; r < kReps; ++r) LT_CUBLAS_CHECK(run());
    LT_CUDA_CHECK(cudaEventRecord(stop, MainStream()));
    LT_CUDA_CHECK(cudaEventSynchronize(stop));
    LT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (out != d) LT_CUDA_CHECK(cudaFree(out));
  size_t best = 0;
  for (size_t i = 1; i < ms.size(); ++i) {
    if (ms[i] < ms[best]) best = i;
  }
  if (ms[best] < 0.85f * ms[0]) plan->algo = plan->candidates[best];
}

// Row-major X[r, c] is column-major Xᵀ with leading dimension c; each product below is written
// as the column-major product of the transposes.
void Matmul::Forward(bf16* out, const bf16* in, const bf16* weight, const bf16* bias, int64_t m,
                     int64_t k, int64_t n) {
  // outᵀ[N, M] = W[N, K] · inᵀ[K, M]: W is stored as column-major [K, N], so transpose it.
  Gemm(true, false, n, m, k, weight, k, in, k, out, CUDA_R_16BF, n, 1.0f, 0.0f, bias);
}

void Matmul::BackwardData(bf16* din, const bf16* dout, const bf16* weight, int64_t m, int64_t k,
                          int64_t n, bool accumulate) {
  // dinᵀ[K, M] = Wᵀ[K, N] · doutᵀ[N, M].
  Gemm(false, false, k, m, n, weight, k, dout, n, din, CUDA_R_16BF, k, 1.0f,
       accumulate ? 1.0f : 0.0f, nullptr);
}

void Matmul::BackwardWeight(float* dweight, const bf16* dout, const bf16* in, int64_t m, int64_t k,
                            int64_t n) {
  // dWᵀ[K, N] += inᵀ[K, M] · dout[M, N]: dout is stored as column-major [N, M], so transpose it.
  Gemm(false, true, k, n, m, in, k, dout, n, dweight, CUDA_R_32F, k, 1.0f, 1.0f, nullptr);
}

bool Matmul::BackwardWeightBias(float* dweight, float* dbias_out, const bf16* dout, const bf16* in,
                                int64_t m, int64_t k, int64_t n) {
  return Gemm(false, true, k, n, m, in, k, dout, n, dweight, CUDA_R_32F, k, 1.0f, 1.0f, nullptr,
              Epilogue::kBGradB, dbias_out, 0);
}

void Matmul::ForwardGelu(bf16* out, bf16* pre, const bf16* in, const bf16* weight, const bf16* bias,
                         int64_t m, int64_t k, int64_t n) {
  Gemm(true, false, n, m, k, weight, k, in, k, out, CUDA_R_16BF, n, 1.0f, 0.0f, bias,
       bias ? Epilogue::kGeluAuxBias : Epilogue::kGeluAux, pre, n);
}

void Matmul::BackwardDataGelu(bf16* dpre, const bf16* dout, const bf16* weight, const bf16* pre,
                              int64_t m, int64_t k, int64_t n) {
  Gemm(false, false, k, m, n, weight, k, dout, n, dpre, CUDA_R_16BF, k, 1.0f, 0.0f, nullptr,
       Epilogue::kDGelu, const_cast<bf16*>(pre), k);
}

}  // namespace leantron::trainer::cuda
