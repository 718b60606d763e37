// Device memory a model allocates once, up front (the steady state makes no cudaMalloc):
// zero-filled in stream order, counted for the memory report, freed with the owner.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "trainer/cuda/cuda_util.h"

namespace leantron::trainer::cuda {

class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory() {
    for (void* p : allocations_) cudaFree(p);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  template <typename T>
  T* Alloc(size_t n) {
    void* p = nullptr;
    LT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    LT_CUDA_CHECK(cudaMemsetAsync(p, 0, std::max<size_t>(n, 1) * sizeof(T), MainStream()));
    allocations_.push_back(p);
    bytes_ += static_cast<int64_t>(n * sizeof(T));
    return static_cast<T*>(p);
  }
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<void*> allocations_;
  int64_t bytes_ = 0;
};

}  // namespace leantron::trainer::cuda
