#include "trainer/core/weight_buffers.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace leantron::trainer {

WeightBuffers::WeightBuffers(Ops* ops, size_t element_bytes, size_t size,
                             const std::vector<std::vector<DpBucket>>& chunks, int rank, int ranks)
    : ops_(ops), element_bytes_(element_bytes), layout_(size, chunks, rank, ranks) {
  if (element_bytes_ != 2 && element_bytes_ != 4) {
    std::fprintf(stderr, "WeightBuffers: elements of %zu bytes\n", element_bytes_);
    std::abort();
  }
  const size_t floats = (layout_.elements() * element_bytes_ + 3) / 4;
  memory_ = ops_->Alloc(std::max<size_t>(floats, 1));
  ops_->Zero(memory_, std::max<size_t>(floats, 1));
}

WeightBuffers::~WeightBuffers() { ops_->Free(memory_); }

char* WeightBuffers::Element(size_t index, size_t bytes) const {
  if (bytes != element_bytes_) {
    std::fprintf(stderr, "WeightBuffers: read as %zu-byte elements, held as %zu\n", bytes,
                 element_bytes_);
    std::abort();
  }
  return reinterpret_cast<char*>(memory_) + index * element_bytes_;
}

}  // namespace leantron::trainer
