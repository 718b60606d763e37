// Error checks for the CUDA backend. Ops have no Status return (a failing kernel launch is a bug
// or a broken device, not bad input), so a failed call prints where it happened and aborts; an
// allocation that does not fit says so and exits with status 1.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace leantron::trainer::cuda {

using bf16 = __nv_bfloat16;

[[noreturn]] inline void Die(const char* what, const char* detail, const char* file, int line) {
  std::fprintf(stderr, "CUDA backend: %s failed (%s) at %s:%d\n", what, detail, file, line);
  std::fflush(stderr);
  std::abort();
}

// An allocation that does not fit is the user's to fix (a smaller micro-batch, recomputation,
// sharding), not a fault of the program: one line and exit status 1, without the core dump of an
// abort; quick_exit-style, since the destructors would call into the failed CUDA context.
[[noreturn]] inline void OutOfMemory(const char* what, const char* file, int line) {
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  std::fprintf(stderr,
               "CUDA backend: out of GPU memory in %s at %s:%d (%zu MB free of %zu MB); a "
               "smaller --micro-batch-size, recomputation or more sharding may fit\n",
               what, file, line, free_bytes >> 20, total_bytes >> 20);
  std::fflush(stderr);
  std::_Exit(1);
}

// Scratch memory a kernel may use (deterministic reductions keep per-block partials there).
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
};

}  // namespace leantron::trainer::cuda

#define LT_CUDA_CHECK(call)                                                                   \
  do {                                                                                        \
    cudaError_t lt_err_ = (call);                                                             \
    if (lt_err_ == cudaErrorMemoryAllocation)                                                 \
      ::leantron::trainer::cuda::OutOfMemory(#call, __FILE__, __LINE__);                      \
    if (lt_err_ != cudaSuccess)                                                               \
      ::leantron::trainer::cuda::Die(#call, cudaGetErrorString(lt_err_), __FILE__, __LINE__); \
  } while (0)

#define LT_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                          \
    cublasStatus_t lt_st_ = (call);                                                             \
    if (lt_st_ != CUBLAS_STATUS_SUCCESS)                                                        \
      ::leantron::trainer::cuda::Die(#call, cublasGetStatusString(lt_st_), __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next sync.
#define LT_CUDA_LAUNCH_CHECK() LT_CUDA_CHECK(cudaGetLastError())

namespace leantron::trainer::cuda {
// The compute stream (created on first use, non-blocking): kernels, cuBLASLt, cuDNN and copies of
// the models are ordered on it. Communication runs on streams of its own (the TP stream,
// the gradient reducer's, NCCL's point-to-point channels) ordered against it with events.
inline cudaStream_t MainStream() {
  static cudaStream_t stream = [] {
    cudaStream_t s;
    LT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return stream;
}
}  // namespace leantron::trainer::cuda
