#include "trainer/core/grad_buffers.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace leantron::trainer {
namespace {

[[noreturn]] void Fail(const char* what, size_t flat) {
  std::fprintf(stderr, "GradBuffers: %s (flat index %zu)\n", what, flat);
  std::abort();
}

}  // namespace

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

const GradBuffers::Bucket& GradBuffers::Containing(size_t flat) const {
  // buckets_ follows the layout's places, one for one.
  return buckets_[&layout_->Containing(flat) - layout_->places().data()];
}

const GradBuffers::Bucket* GradBuffers::Find(size_t offset) const {
  if (!sharded_ || offset >= size_) return nullptr;
  const Bucket& k = Containing(offset);
  return k.bucket.offset == offset ? &k : nullptr;
}

float* GradBuffers::At(size_t flat) const {
  if (!sharded_) return whole_ + flat;
  const Bucket& k = Containing(flat);
  return k.at + (flat - k.bucket.offset);
}

float* GradBuffers::Reduced(size_t flat) const {
  if (!sharded_) return whole_ + flat;
  const Bucket& k = Containing(flat);
  if (flat < k.part_begin || flat >= k.part_end)
    Fail("a reduced gradient outside this rank's part of its bucket", flat);
  return k.sum != nullptr ? k.sum + (flat - k.part_begin) : k.at + (flat - k.bucket.offset);
}

size_t GradBuffers::ReducedRunEnd(size_t flat) const {
  return sharded_ ? Containing(flat).part_end : size_;
}

void GradBuffers::Zero() {
  if (!sharded_) return ops_->Zero(whole_, size_);
  // The whole buffers and the sums (the slots are zeroed before each use).
  const size_t begin = layout_->slot_elements();
  if (allocated_ > begin) ops_->Zero(memory_ + begin, allocated_ - begin);
}

}  // namespace leantron::trainer
