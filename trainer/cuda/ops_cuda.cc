// The `cuda` backend: CpuOps's float32 semantics on the current GPU. Everything runs on
// MainStream(); kernels come from kernels.h (their float instantiations), matrix products from
// cuBLAS in plain fp32 (no TF32). Only the transfers synchronise (and the reduce hooks of the
// cross-entropy, which may read the device buffers they are handed from the host).
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "trainer/core/layer_spec.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {
namespace cuda {
namespace {

// A device buffer that only grows (one cudaMalloc per new high-water mark).
class GrowBuffer {
 public:
  ~GrowBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  void* Get(size_t bytes) {
    if (bytes > bytes_) {
      if (ptr_ != nullptr) {
        LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));  // queued work may still use it
        LT_CUDA_CHECK(cudaFree(ptr_));
        ptr_ = nullptr;
      }
      const size_t rounded = (bytes + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
      LT_CUDA_CHECK(cudaMalloc(&ptr_, rounded));
      bytes_ = rounded;
    }
    return ptr_;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Two copy streams (to and from the host, so both directions of the bus run at once) beside the
// main stream, and a completion event per copy, handed out as increasing tickets. Copies may come
// from another host thread than the main stream's (the offloaded optimizer's step runs beside the
// next forward): one lock, and the device made current on the issuing thread.
struct SideCopies {
  struct Direction {
    cudaStream_t stream = nullptr;
    uint64_t last = 0;  // ticket of its latest copy
  };
  std::mutex mu;
  Direction down, up;
  int device = -1;
  cudaEvent_t fence = nullptr;              // the main stream's work at the last Fence
  std::map<uint64_t, cudaEvent_t> pending;  // copies not known to have finished
  uint64_t next = 0;

  ~SideCopies() {
    for (auto& [t, e] : pending) cudaEventDestroy(e);
    for (Direction* d : {&down, &up})
      if (d->stream != nullptr) cudaStreamDestroy(d->stream);
    if (fence != nullptr) cudaEventDestroy(fence);
  }
  void Fence() {
    std::lock_guard<std::mutex> lock(mu);
    if (fence == nullptr) {
      LT_CUDA_CHECK(cudaGetDevice(&device));
      LT_CUDA_CHECK(cudaEventCreateWithFlags(&fence, cudaEventDisableTiming));
      for (Direction* d : {&down, &up})
        LT_CUDA_CHECK(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    }
    LT_CUDA_CHECK(cudaEventRecord(fence, MainStream()));
  }
  uint64_t Copy(Direction* d, void* dst, const void* src, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    if (fence == nullptr)
      Die("SideCopies", "a copy beside the computation before any CopyFence", __FILE__, __LINE__);
    LT_CUDA_CHECK(cudaSetDevice(device));
    LT_CUDA_CHECK(cudaStreamWaitEvent(d->stream, fence, 0));
    if (bytes > 0) LT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, d->stream));
    // Copies done already need no event (a ticket not pending is a finished copy).
    for (auto it = pending.begin(); it != pending.end();) {
      const cudaError_t q = cudaEventQuery(it->second);
      if (q == cudaErrorNotReady) {
        ++it;
        continue;
      }
      LT_CUDA_CHECK(q);
      LT_CUDA_CHECK(cudaEventDestroy(it->second));
      it = pending.erase(it);
    }
    cudaEvent_t done = nullptr;
    LT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    LT_CUDA_CHECK(cudaEventRecord(done, d->stream));
    d->last = ++next;
    pending[d->last] = done;
    return d->last;
  }
  void Wait(uint64_t ticket) {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = pending.find(ticket);
      if (it == pending.end()) return;  // waited for already
      e = it->second;
      pending.erase(it);
    }
    LT_CUDA_CHECK(cudaEventSynchronize(e));
    LT_CUDA_CHECK(cudaEventDestroy(e));
  }
  void ComputeWaits(cudaStream_t compute, uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = pending.find(ticket);
    if (it != pending.end()) LT_CUDA_CHECK(cudaStreamWaitEvent(compute, it->second, 0));
  }
  void ComputeWaitsAll(cudaStream_t compute) {
    uint64_t last[2];
    {
      std::lock_guard<std::mutex> lock(mu);
      last[0] = down.last;
      last[1] = up.last;
    }
    for (uint64_t t : last) ComputeWaits(compute, t);
  }
};

class CudaOps final : public Ops {
 public:
  CudaOps() {
    LT_CUBLAS_CHECK(cublasCreate(&blas_));
    LT_CUBLAS_CHECK(cublasSetStream(blas_, MainStream()));
    LT_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));  // fp32, no TF32
  }
  ~CudaOps() override {
    cudaStreamSynchronize(MainStream());
    cublasDestroy(blas_);
  }

  std::string name() const override { return "cuda"; }

  float* Alloc(size_t n) override { return static_cast<float*>(AllocBytes(n * sizeof(float))); }
  void Free(float* p) override { FreeBytes(p); }
  void* AllocBytes(size_t bytes) override {
    const size_t size = std::max<size_t>(bytes, 1);
    void* p = nullptr;
    LT_CUDA_CHECK(cudaMalloc(&p, size));
    LT_CUDA_CHECK(cudaMemsetAsync(p, 0, size, stream()));
    return p;
  }
  void FreeBytes(void* p) override {
    if (p == nullptr) return;
    LT_CUDA_CHECK(cudaStreamSynchronize(stream()));
    LT_CUDA_CHECK(cudaFree(p));
  }
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    LT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, stream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    LT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, stream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void* AllocPinned(size_t bytes) override {
    const size_t size = std::max<size_t>(bytes, 1);
    void* p = nullptr;
    LT_CUDA_CHECK(cudaHostAlloc(&p, size, cudaHostAllocDefault));
    std::memset(p, 0, size);
    return p;
  }
  void FreePinned(void* p) override {
    if (p == nullptr) return;
    cudaDeviceSynchronize();  // copies in flight may read it (destructor path: not checked)
    cudaFreeHost(p);
  }
  void CopyFence() override { copies_.Fence(); }
  uint64_t CopyToHostAsync(void* host_dst, const void* src, size_t bytes) override {
    return copies_.Copy(&copies_.down, host_dst, src, bytes);
  }
  uint64_t CopyFromHostAsync(void* dst, const void* host_src, size_t bytes) override {
    return copies_.Copy(&copies_.up, dst, host_src, bytes);
  }
  void WaitCopy(uint64_t ticket) override { copies_.Wait(ticket); }
  void ComputeAfterCopy(uint64_t ticket) override { copies_.ComputeWaits(stream(), ticket); }
  void ComputeAfterCopies() override { copies_.ComputeWaitsAll(stream()); }
  void Zero(float* p, size_t n) override {
    if (n > 0) LT_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream()));
  }
  void Copy(float* dst, const float* src, size_t n) override {
    if (n > 0 && dst != src) {
      LT_CUDA_CHECK(
          cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
    }
  }
  void AddInPlace(float* a, const float* b, size_t n) override {
    cuda::AddInPlace(a, b, n, stream());
  }
  void AddBias(float* out, const float* bias, int64_t rows, int64_t cols) override {
    cuda::AddBias(out, bias, rows, cols, stream());
  }
  void BiasBackward(float* dbias, const float* dout, int64_t rows, int64_t cols) override {
    ColumnSumAccumulate(dbias, dout, rows, cols, scratch(ColumnSumScratchBytes(rows, cols)),
                        stream());
  }

  // Row-major out[M, N] = in[M, K]·W[N, K]ᵀ is column-major outᵀ = W·inᵀ: GEMM(T, N).
  void LinearForward(float* out, const float* in, const float* weight, const float* bias, int64_t m,
                     int64_t k, int64_t n) override {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      Zero(out, m * n);
    } else {
      Gemm(CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, weight, k, in, k, 0.0f, out, n);
    }
    if (bias != nullptr) cuda::AddBias(out, bias, m, n, stream());
  }

  void LinearBackward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                      const float* weight, int64_t m, int64_t k, int64_t n,
                      bool accumulate_din) override {
    if (m == 0 || n == 0 || k == 0) {
      if (din != nullptr && !accumulate_din) Zero(din, m * k);
      if (dbias != nullptr && m > 0 && n > 0) BiasBackward(dbias, dout, m, n);
      return;
    }
    // din[M, K] = dout[M, N]·W[N, K]: column-major dinᵀ = Wᵀ·doutᵀ, GEMM(N, N).
    if (din != nullptr) {
      Gemm(CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, weight, k, dout, n, accumulate_din ? 1.0f : 0.0f, din,
           k);
    }
    // dW[N, K] += doutᵀ·in: column-major dWᵀ += inᵀ·dout, GEMM(N, T).
    Gemm(CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, in, k, dout, n, 1.0f, dweight, k);
    if (dbias != nullptr) BiasBackward(dbias, dout, m, n);
  }

  void LayerNormForward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                        const float* bias, int64_t rows, int64_t cols, float eps) override {
    AddLayerNormForward<float>(nullptr, out, mean, rstd, nullptr, in, weight, bias, rows, cols, eps,
                               HiddenDropout{}, stream());
  }
  void LayerNormBackward(float* din, float* dweight, float* dbias, const float* dout,
                         const float* in, const float* weight, const float* mean, const float* rstd,
                         int64_t rows, int64_t cols) override {
    // din += ∂: din is both the residual gradient and the output.
    cuda::LayerNormBackward<float>(din, nullptr, dweight, dbias, dout, din, in, weight, mean, rstd,
                                   rows, cols, HiddenDropout{},
                                   scratch(LayerNormBackwardScratchBytes(rows, cols)), stream());
  }
  void RmsNormForward(float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                      int64_t cols, float eps) override {
    AddRmsNormForward<float>(nullptr, out, rstd, nullptr, in, weight, rows, cols, eps,
                             HiddenDropout{}, stream());
  }
  void RmsNormBackward(float* din, float* dweight, const float* dout, const float* in,
                       const float* weight, const float* rstd, int64_t rows,
                       int64_t cols) override {
    cuda::RmsNormBackward<float>(din, nullptr, dweight, dout, din, in, weight, rstd, rows, cols,
                                 HiddenDropout{}, scratch(RmsNormBackwardScratchBytes(rows, cols)),
                                 stream());
  }
  void SwigluForward(float* out, const float* in, int64_t rows, int64_t width) override {
    cuda::SwigluForward<float>(out, in, rows, width, stream());
  }
  void SwigluBackward(float* din, const float* dout, const float* in, int64_t rows,
                      int64_t width) override {
    cuda::SwigluBackward<float>(din, dout, in, rows, width, stream());
  }
  void Rope(float* qkv, int64_t batch, int64_t seq, int64_t heads, int64_t groups, int64_t head_dim,
            const std::vector<double>& inv_freq, bool inverse, const int32_t* positions,
            int64_t positions_bound) override {
    // The same table CpuOps rotates by, computed on the host and staged in scratch.
    std::vector<float> cs, sn;
    RopeTable(inv_freq, positions != nullptr ? positions_bound : seq, &cs, &sn);
    if (inverse)
      for (float& x : sn) x = -x;
    const size_t bytes = cs.size() * sizeof(float);
    char* table = static_cast<char*>(scratch(2 * bytes + 256).ptr);
    float* dcs = reinterpret_cast<float*>(table);
    float* dsn = reinterpret_cast<float*>(table + (bytes + 255) / 256 * 256);
    LT_CUDA_CHECK(cudaMemcpyAsync(dcs, cs.data(), bytes, cudaMemcpyHostToDevice, stream()));
    LT_CUDA_CHECK(cudaMemcpyAsync(dsn, sn.data(), bytes, cudaMemcpyHostToDevice, stream()));
    cuda::Rope(qkv, batch, seq, heads, groups, head_dim, dcs, dsn, positions, stream());
    LT_CUDA_CHECK(cudaStreamSynchronize(stream()));  // the host tables go
  }
  void GeluForward(float* out, const float* in, size_t n, bool tanh_approx) override {
    cuda::GeluForward<float>(out, in, n, tanh_approx, stream());
  }
  void GeluBackward(float* din, const float* dout, const float* in, size_t n,
                    bool tanh_approx) override {
    cuda::GeluBackward<float>(din, dout, in, n, tanh_approx, stream());
  }

  void AttentionForward(float* out, float* probs, const float* qkv, int64_t batch, int64_t seq,
                        int64_t heads, int64_t groups, int64_t head_dim,
                        const AttentionDropout& dropout) override {
    AttentionForwardReference(out, probs, qkv, batch, seq, heads, groups, head_dim, dropout,
                              scratch(AttentionForwardScratchBytes(batch, seq, heads)), stream());
  }
  void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                         int64_t batch, int64_t seq, int64_t heads, int64_t groups,
                         int64_t head_dim, const AttentionDropout& dropout) override {
    AttentionBackwardReference(dqkv, dout, qkv, probs, batch, seq, heads, groups, head_dim, dropout,
                               scratch(AttentionBackwardScratchBytes(batch, seq, heads)), stream());
  }

  void BlockAttentionForward(float* out, float* lse, const float* qkv, const float* kv,
                             const BlockAttentionArgs& args, const AttentionDropout& dropout,
                             bool merge) override {
    BlockAttentionForwardReference(out, lse, qkv, kv, args, dropout, merge,
                                   scratch(BlockAttentionForwardScratchBytes(args)), stream());
  }
  void BlockAttentionBackward(float* dqkv, float* dkv, const float* dout, const float* out,
                              const float* lse, const float* qkv, const float* kv,
                              const BlockAttentionArgs& args,
                              const AttentionDropout& dropout) override {
    BlockAttentionBackwardReference(dqkv, dkv, dout, out, lse, qkv, kv, args, dropout,
                                    scratch(BlockAttentionBackwardScratchBytes(args)), stream());
  }
  void Copy2D(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
              int64_t cols) override {
    if (rows == 0 || cols == 0) return;
    LT_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_stride * sizeof(float), src,
                                    src_stride * sizeof(float), cols * sizeof(float), rows,
                                    cudaMemcpyDeviceToDevice, stream()));
  }

  void Dropout(float* x, int64_t rows, int64_t cols, const HiddenDropout& dropout) override {
    cuda::Dropout<float>(x, rows, cols, dropout, stream());
  }

  void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t rows,
                        int64_t cols, int64_t vocab_begin, int64_t vocab_end) override {
    cuda::EmbeddingForward<float>(out, ids, table, rows, cols, vocab_begin, vocab_end, stream());
  }
  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                         int64_t cols, int64_t vocab_begin, int64_t vocab_end) override {
    cuda::EmbeddingBackward<float>(dtable, dout, ids, rows, cols, vocab_begin, vocab_end,
                                   scratch(EmbeddingBackwardScratchBytes(rows, cols)), stream());
  }
  void PositionForward(float* out, const int32_t* positions, const float* table, int64_t rows,
                       int64_t cols) override {
    cuda::PositionForward<float>(out, positions, table, rows, cols, stream());
  }
  void PositionBackward(float* dtable, const float* dout, const int32_t* positions, int64_t rows,
                        int64_t cols) override {
    cuda::PositionBackward<float>(dtable, dout, positions, rows, cols,
                                  scratch(EmbeddingBackwardScratchBytes(rows, cols)), stream());
  }

  // The hooks get device pointers, called after the stream has synchronised (so they may also
  // copy through the host); whatever they enqueue must be ordered before MainStream's next work.
  void CrossEntropyForward(float* losses, float* stats, const float* logits, const int32_t* targets,
                           int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                           const ReduceHook& reduce_max, const ReduceHook& reduce_sum) override {
    if (rows == 0) return;
    float* row_max = static_cast<float*>(ce_buffer_.Get(3 * rows * sizeof(float)));
    float* sums = row_max + rows;
    CrossEntropyRowMax(row_max, logits, rows, vocab_local, stream());
    if (reduce_max) {
      LT_CUDA_CHECK(cudaStreamSynchronize(stream()));
      reduce_max(row_max, rows);
    }
    CrossEntropyRowSums(sums, logits, row_max, targets, rows, vocab_local, vocab_begin, stream());
    if (reduce_sum) {
      LT_CUDA_CHECK(cudaStreamSynchronize(stream()));
      reduce_sum(sums, 2 * rows);
    }
    CrossEntropyFinish(losses, stats, row_max, sums, targets, rows, stream());
  }
  void CrossEntropyBackward(float* dlogits, const float* dlosses, const float* stats,
                            const float* logits, const int32_t* targets, int64_t rows,
                            int64_t vocab_local, int64_t vocab_begin) override {
    cuda::CrossEntropyBackward(dlogits, dlosses, stats, logits, targets, rows, vocab_local,
                               vocab_begin, stream());
  }

  double SumSquares(const float* x, size_t n) override {
    return cuda::SumSquares(x, n, scratch(SumSquaresScratchBytes(n)), stream());
  }

  void AdamWStep(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                 float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                 float grad_scale, uint16_t* bf16_out) override {
    AdamW(param, grad, exp_avg, exp_avg_sq, n, lr, beta1, beta2, eps, weight_decay, step,
          grad_scale, reinterpret_cast<bf16*>(bf16_out), stream());
  }

 private:
  static cudaStream_t stream() { return MainStream(); }
  Scratch scratch(size_t bytes) { return {scratch_.Get(bytes), bytes}; }
  SideCopies copies_;

  // Column-major C[m, n] = alpha·op(A)·op(B) + beta·C, fp32 throughout.
  void Gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
            int64_t ldc) {
    const float alpha = 1.0f;
    LT_CUBLAS_CHECK(cublasGemmEx_64(blas_, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda, b,
                                    CUDA_R_32F, ldb, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
  }

  cublasHandle_t blas_ = nullptr;
  GrowBuffer scratch_;
  GrowBuffer ce_buffer_;  // cross-entropy row maxima and sums, handed to the reduce hooks
};

}  // namespace
}  // namespace cuda

absl::StatusOr<std::unique_ptr<Ops>> CreateCudaOps() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return absl::UnavailableError(
        absl::StrCat("cuda ops backend: cudaGetDeviceCount failed: ", cudaGetErrorString(err)));
  }
  if (count == 0) return absl::UnavailableError("cuda ops backend: no CUDA device");
  return std::unique_ptr<Ops>(new cuda::CudaOps());
}

}  // namespace leantron::trainer
