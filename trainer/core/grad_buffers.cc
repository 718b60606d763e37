#include "trainer/core/grad_buffers.h"

#include <algorithm>

namespace leantron::trainer {

GradBuffers::GradBuffers(Ops* ops, size_t size) : ops_(ops), size_(size) {
  whole_ = ops_->Alloc(size_);
  allocated_ = size_;
}

GradBuffers::GradBuffers(Ops* ops, size_t size, const std::vector<std::vector<DpBucket>>& chunks,
                         int rank, int ranks)
    : ops_(ops),
      layout_(std::make_unique<SlotLayout>(size, chunks, rank, ranks)),
      size_(size),
      sharded_(true) {
  allocated_ = layout_->elements();
  memory_ = ops_->Alloc(std::max<size_t>(allocated_, 1));
  for (const SlotLayout::Place& p : layout_->places()) {
    Bucket k;
    k.bucket = p.bucket;
    k.slot = p.slot;
    k.at = memory_ + p.at;
    k.part_begin = p.part_begin;
    k.part_end = p.part_end;
    if (p.part != SlotLayout::kNone) k.sum = memory_ + p.part;
    buckets_.push_back(k);
  }
  Zero();
}

GradBuffers::~GradBuffers() { ops_->Free(sharded_ ? memory_ : whole_); }

const GradBuffers::Bucket* GradBuffers::Find(size_t offset) const {
  if (!sharded_) return nullptr;
  const SlotLayout::Place* p = layout_->Find(offset);
  // buckets_ follows the layout's places, one for one.
  return p != nullptr ? &buckets_[p - layout_->places().data()] : nullptr;
}

float* GradBuffers::At(size_t flat) const {
  return sharded_ ? memory_ + layout_->At(flat) : whole_ + flat;
}

float* GradBuffers::Reduced(size_t flat) const {
  return sharded_ ? memory_ + layout_->Owned(flat) : whole_ + flat;
}

size_t GradBuffers::ReducedRunEnd(size_t flat) const {
  return sharded_ ? layout_->OwnedRunEnd(flat) : size_;
}

void GradBuffers::Zero() {
  if (!sharded_) return ops_->Zero(whole_, size_);
  // The whole buffers and the sums (the slots are zeroed before each use).
  const size_t begin = layout_->slot_elements();
  if (allocated_ > begin) ops_->Zero(memory_ + begin, allocated_ - begin);
}

}  // namespace leantron::trainer
