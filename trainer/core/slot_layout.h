// Where sharded per-bucket buffers put each data-parallel bucket of a rank's flat order, counted
// in elements of one allocation, whatever the element type: the gradients of
// --data-parallel-sharding-strategy optim_grads (GradBuffers) and the weights the model computes
// with under optim_grads_params (WeightBuffers) share it.
//   Each model chunk's layer buckets (DpBucket with first_layer >= 0, in the backward's order)
//   take turns in kSlots slots (fewer if it has fewer buckets), each the size of the largest
//   bucket that uses it; this rank's part of each (DpBucket::Part) has storage of its own.
//   The embeddings' and the head's buckets (first_layer < 0) keep whole buffers of their own, in
//   which this rank's part is in place.
// The allocation holds every chunk's slots first, then the whole buffers, then the parts.
#pragma once

#include <cstddef>
#include <vector>

#include "trainer/core/params.h"

namespace leantron::trainer {

class SlotLayout {
 public:
  static constexpr int kSlots = 2;
  static constexpr size_t kNone = ~size_t{0};

  struct Place {
    DpBucket bucket;
    int slot = -1;          // in its chunk's slots; -1: a whole buffer of its own
    size_t at = 0;          // where its slot or buffer begins in the allocation
    size_t part_begin = 0;  // this rank's part, flat indices
    size_t part_end = 0;
    size_t part = kNone;  // layer buckets: where the part's own storage begins
  };

  // `chunks` holds each model chunk's buckets (PlanDpBuckets), which tile [0, size); this rank is
  // `rank` of the `ranks` that share them. It aborts when they do not tile.
  SlotLayout(size_t size, const std::vector<std::vector<DpBucket>>& chunks, int rank, int ranks);

  // Every bucket's place, sorted by flat offset.
  const std::vector<Place>& places() const { return places_; }
  // The place of the bucket holding flat index `flat` (it aborts past the end).
  const Place& Containing(size_t flat) const;
  // The place of the bucket that begins at `offset`, or null.
  const Place* Find(size_t offset) const;
  // The places of `buckets` (a chunk's), in their order; it aborts, naming `who`, when this
  // layout does not hold them.
  std::vector<const Place*> PlacesOf(const std::vector<DpBucket>& buckets, const char* who) const;
  // Where flat index `flat` is in its slot or whole buffer.
  size_t At(size_t flat) const;
  // Where this rank's flat index `flat` is kept: in its part's storage, or in place in a whole
  // buffer (it aborts for an index outside this rank's part).
  size_t Owned(size_t flat) const;
  // Where the run of Owned(flat) contiguous from `flat` on ends: the end of the part.
  size_t OwnedRunEnd(size_t flat) const { return Containing(flat).part_end; }

  size_t size() const { return size_; }
  size_t slot_elements() const { return slots_; }   // [0, slot_elements()): the slots
  size_t whole_elements() const { return whole_; }  // then the whole buffers
  size_t elements() const { return elements_; }     // everything, the parts last

 private:
  size_t size_;
  std::vector<Place> places_;
  size_t slots_ = 0, whole_ = 0, elements_ = 0;
};

}  // namespace leantron::trainer
