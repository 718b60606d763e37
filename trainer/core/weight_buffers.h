// The weights a model computes with under --data-parallel-sharding-strategy optim_grads_params
// (ZeRO-3): never whole on a rank. Laid out as the sharded gradients are (SlotLayout): each model
// chunk's layer buckets take turns in two slots, into which the data-parallel ranks' parts are
// gathered just before a pass uses the bucket's layers (a listener of the model does that: the
// GPU's WeightGatherer, SlotWeightGatherer elsewhere); this rank's part of each layer bucket has
// storage of its own, which the optimizer writes; the embeddings' and head's buckets keep whole
// buffers, gathered once after each step. The element is the model's: bf16 (the bf16 model's
// copy, beside the sharded fp32 weights of ParamStore kSharded) or fp32 (the float32 model, whose
// fp32 weights these are: ParamStore kShardedCompute).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trainer/core/slot_layout.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {

class WeightBuffers {
 public:
  // `element_bytes`: 2 (bf16) or 4 (fp32).
  WeightBuffers(Ops* ops, size_t element_bytes, size_t size,
                const std::vector<std::vector<DpBucket>>& chunks, int rank, int ranks);
  ~WeightBuffers();
  WeightBuffers(const WeightBuffers&) = delete;
  WeightBuffers& operator=(const WeightBuffers&) = delete;

  const SlotLayout& layout() const { return layout_; }
  size_t element_bytes() const { return element_bytes_; }
  // Where the model reads flat index `flat`: its bucket's slot (valid once gathered) or whole
  // buffer. T must be the element's size.
  template <typename T>
  T* At(size_t flat) const {
    return reinterpret_cast<T*>(Element(layout_.At(flat), sizeof(T)));
  }
  // Where this rank keeps flat index `flat` of its part, up to layout().OwnedRunEnd(flat).
  template <typename T>
  T* Owned(size_t flat) const {
    return reinterpret_cast<T*>(Element(layout_.Owned(flat), sizeof(T)));
  }
  // Bytes of backend memory held.
  size_t backend_bytes() const { return layout_.elements() * element_bytes_; }

 private:
  char* Element(size_t index, size_t bytes) const;
  Ops* ops_;
  size_t element_bytes_;
  SlotLayout layout_;
  float* memory_ = nullptr;
};

}  // namespace leantron::trainer
