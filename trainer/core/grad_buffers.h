// Where the fp32 gradients of a rank's (tp, pp) shard live.
//   Whole (the default): one flat buffer in the flat order of the parameters. The backward adds
//   every micro-batch into it, and data parallelism sums it in buckets once per step.
//   Sharded (--data-parallel-sharding-strategy optim_grads, ZeRO-2): the layers' gradients are
//   never held whole. Each model chunk's layer buckets (DpBucket with first_layer >= 0, in the
//   backward's order) take turns in kSlots buffers (fewer if it has fewer buckets), each the size
//   of the largest bucket that uses it: the backward adds a micro-batch's gradient of a bucket
//   into its slot, zeroed just before; once the bucket's layers are done its slot is summed over
//   the data-parallel ranks and this rank's part (DpBucket::Part) added to the step's sum of that
//   part (Reduced), which frees the slot for the bucket after next. The saving is the layers'
//   share beyond 1/DP less the slots: buckets of a few layers shard most (--ddp-bucket-size). A
//   reducer listening to the model does that (the GPU's GradReducer, SlotGradReducer elsewhere).
//   The embeddings' and the head's buckets keep whole buffers of their own: the backward writes
//   them from its first moment to its last (and the bf16 model's loss computation in the forward),
//   so they are summed once per step in place, as whole ones.
// Every micro-batch's gradient is summed over the ranks this way, not the step's: the same sums
// in another order with gradient accumulation, the same bits with one micro-batch per step.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "trainer/core/params.h"
#include "trainer/core/slot_layout.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {

class GradBuffers {
 public:
  static constexpr int kSlots = SlotLayout::kSlots;

  // Whole: one flat buffer of `size` elements.
  GradBuffers(Ops* ops, size_t size);
  // Sharded: `chunks` holds each model chunk's buckets (PlanDpBuckets), which tile [0, size);
  // this rank is `rank` of the `ranks` that share them.
  GradBuffers(Ops* ops, size_t size, const std::vector<std::vector<DpBucket>>& chunks, int rank,
              int ranks);
  ~GradBuffers();
  GradBuffers(const GradBuffers&) = delete;
  GradBuffers& operator=(const GradBuffers&) = delete;

  bool sharded() const { return sharded_; }
  // The flat buffer (whole), or null.
  float* whole() const { return sharded_ ? nullptr : whole_; }
  size_t size() const { return size_; }

  // Where the backward adds the gradient of flat index `flat` and those after it, up to the end
  // of its bucket (sharded) or of the buffer.
  float* At(size_t flat) const;
  // Where the summed gradient of flat index `flat` is once data parallelism has reduced it, and
  // the elements after it up to ReducedRunEnd(flat). Whole: At(flat). Sharded: only this rank's
  // parts of the buckets (it aborts for another index): in the bucket's own buffer, or in the
  // step's sum of the part for a layer bucket.
  float* Reduced(size_t flat) const;
  size_t ReducedRunEnd(size_t flat) const;

  // Sharded: how one bucket's gradient is kept (null for an offset that starts no bucket).
  struct Bucket {
    DpBucket bucket;
    int slot = -1;          // in its chunk's slots; -1: a whole buffer of its own
    float* at = nullptr;    // its slot or buffer: At(bucket.offset)
    size_t part_begin = 0;  // this rank's part, flat indices
    size_t part_end = 0;
    float* sum = nullptr;  // layer buckets: the step's sum of the part
  };
  const Bucket* Find(size_t offset) const;

  // The start of a step: the whole buffers and the parts' sums to zero (the slots are zeroed
  // before each use).
  void Zero();
  // Elements of backend memory held: the flat buffer; or the slots, the whole buffers and the
  // parts' sums.
  size_t backend_elements() const { return allocated_; }

 private:
  Ops* ops_;
  std::unique_ptr<SlotLayout> layout_;  // sharded
  size_t size_;
  bool sharded_ = false;
  float* whole_ = nullptr;   // whole: the flat buffer
  float* memory_ = nullptr;  // sharded: every slot, whole buffer and sum, in one allocation
  size_t allocated_ = 0;
  std::vector<Bucket> buckets_;  // sharded, sorted by offset
};

}  // namespace leantron::trainer
