// An owned, contiguous, row-major tensor of raw bytes: what moves between a checkpoint source and
// a writer one parameter at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "libckpt/dtype.h"

namespace leantron::ckpt {

struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;

  void Reset(DType new_dtype, std::vector<int64_t> new_shape) {
    dtype = new_dtype;
    shape = std::move(new_shape);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t bytes = static_cast<size_t>(n) * DTypeSize(dtype);
    // Growing through assign() would hold the old and the new buffer at once.
    if (bytes > data.capacity()) std::vector<std::byte>().swap(data);
    data.assign(bytes, std::byte{0});
  }
  std::span<const std::byte> bytes() const { return data; }
  std::span<std::byte> mutable_bytes() { return data; }
};

}  // namespace leantron::ckpt
