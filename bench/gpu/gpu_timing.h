// What the GPU benchmarks share: the mean time of a call on the main stream, and zeroed device
// buffers (left to the process's end).
#pragma once

#include <cstddef>

#include "trainer/cuda/cuda_util.h"

namespace leantron::bench {

// Milliseconds per call of f (enqueueing work on MainStream), over `reps` calls after one warm-up.
template <typename F>
float TimeMs(F&& f, int reps = 10) {
  using trainer::cuda::MainStream;
  f();
  cudaEvent_t a, b;
  LT_CUDA_CHECK(cudaEventCreate(&a));
  LT_CUDA_CHECK(cudaEventCreate(&b));
  LT_CUDA_CHECK(cudaEventRecord(a, MainStream()));
  for (int i = 0; i < reps; ++i) f();
  LT_CUDA_CHECK(cudaEventRecord(b, MainStream()));
  LT_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  LT_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

// `n` zeroed elements of T on the device.
template <typename T>
T* DeviceZeros(size_t n) {
  void* p;
  LT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
  LT_CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T)));
  return static_cast<T*>(p);
}

}  // namespace leantron::bench
