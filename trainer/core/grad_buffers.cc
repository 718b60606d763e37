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
    : ops_(ops), size_(size), sharded_(true) {
  // One allocation: every chunk's slots, then the whole buffers, then the parts' sums. A chunk's
  // layer buckets take turns in min(kSlots, their number) slots, each the size of the largest
  // bucket it takes.
  size_t slots = 0, whole = 0, sums = 0;
  std::vector<std::vector<size_t>> slot_at(chunks.size());  // per chunk, per slot: its offset
  for (size_t c = 0; c < chunks.size(); ++c) {
    int layer_buckets = 0;
    for (const DpBucket& b : chunks[c]) layer_buckets += b.first_layer >= 0 ? 1 : 0;
    const int turns = std::min(kSlots, layer_buckets);
    std::vector<size_t> size(turns, 0);
    int turn = 0;
    for (const DpBucket& b : chunks[c]) {
      if (b.first_layer < 0) {
        whole += b.numel;
        continue;
      }
      size_t& s = size[turn++ % turns];
      s = std::max(s, b.numel);
      const auto [first, last] = b.Part(rank, ranks);
      sums += last - first;
    }
    for (size_t s : size) {
      slot_at[c].push_back(slots);
      slots += s;
    }
  }
  allocated_ = slots + whole + sums;
  memory_ = ops_->Alloc(std::max<size_t>(allocated_, 1));
  zero_begin_ = slots;
  size_t whole_at = slots, sum_at = slots + whole;
  for (size_t c = 0; c < chunks.size(); ++c) {
    int turn = 0;  // the chunk's layer buckets in the backward's order
    for (const DpBucket& b : chunks[c]) {
      Bucket k;
      k.bucket = b;
      const auto [first, last] = b.Part(rank, ranks);
      k.part_begin = first;
      k.part_end = last;
      if (b.first_layer < 0) {
        k.at = memory_ + whole_at;
        whole_at += b.numel;
      } else {
        k.slot = turn++ % static_cast<int>(slot_at[c].size());
        k.at = memory_ + slot_at[c][k.slot];
        k.sum = memory_ + sum_at;
        sum_at += last - first;
      }
      buckets_.push_back(k);
    }
  }
  std::sort(buckets_.begin(), buckets_.end(),
            [](const Bucket& a, const Bucket& b) { return a.bucket.offset < b.bucket.offset; });
  size_t at = 0;
  for (const Bucket& k : buckets_) {
    if (k.bucket.offset != at) Fail("the buckets do not tile the parameters", at);
    at += k.bucket.numel;
  }
  if (at != size_) Fail("the buckets do not tile the parameters", at);
  Zero();
}

GradBuffers::~GradBuffers() { ops_->Free(sharded_ ? memory_ : whole_); }

const GradBuffers::Bucket& GradBuffers::Containing(size_t flat) const {
  auto it = std::upper_bound(buckets_.begin(), buckets_.end(), flat,
                             [](size_t f, const Bucket& k) { return f < k.bucket.offset; });
  if (it == buckets_.begin() || flat >= size_) Fail("no bucket holds this index", flat);
  return *std::prev(it);
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
  if (allocated_ > zero_begin_) ops_->Zero(memory_ + zero_begin_, allocated_ - zero_begin_);
}

}  // namespace leantron::trainer
