#include "trainer/core/slot_layout.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace leantron::trainer {
namespace {

[[noreturn]] void Fail(const char* what, size_t flat) {
  std::fprintf(stderr, "SlotLayout: %s (flat index %zu)\n", what, flat);
  std::abort();
}

}  // namespace

SlotLayout::SlotLayout(size_t size, const std::vector<std::vector<DpBucket>>& chunks, int rank,
                       int ranks)
    : size_(size) {
  size_t parts = 0;
  std::vector<std::vector<size_t>> slot_at(chunks.size());  // per chunk, per slot: its offset
  for (size_t c = 0; c < chunks.size(); ++c) {
    int layer_buckets = 0;
    for (const DpBucket& b : chunks[c]) layer_buckets += b.first_layer >= 0 ? 1 : 0;
    const int turns = std::min(kSlots, layer_buckets);
    std::vector<size_t> sizes(turns, 0);
    int turn = 0;
    for (const DpBucket& b : chunks[c]) {
      if (b.first_layer < 0) {
        whole_ += b.numel;
        continue;
      }
      size_t& s = sizes[turn++ % turns];
      s = std::max(s, b.numel);
      const auto [first, last] = b.Part(rank, ranks);
      parts += last - first;
    }
    for (size_t s : sizes) {
      slot_at[c].push_back(slots_);
      slots_ += s;
    }
  }
  elements_ = slots_ + whole_ + parts;
  size_t whole_at = slots_, part_at = slots_ + whole_;
  for (size_t c = 0; c < chunks.size(); ++c) {
    int turn = 0;  // the chunk's layer buckets in the backward's order
    for (const DpBucket& b : chunks[c]) {
      Place k;
      k.bucket = b;
      const auto [first, last] = b.Part(rank, ranks);
      k.part_begin = first;
      k.part_end = last;
      if (b.first_layer < 0) {
        k.at = whole_at;
        whole_at += b.numel;
      } else {
        k.slot = turn++ % static_cast<int>(slot_at[c].size());
        k.at = slot_at[c][k.slot];
        k.part = part_at;
        part_at += last - first;
      }
      places_.push_back(k);
    }
  }
  std::sort(places_.begin(), places_.end(),
            [](const Place& a, const Place& b) { return a.bucket.offset < b.bucket.offset; });
  size_t at = 0;
  for (const Place& k : places_) {
    if (k.bucket.offset != at) Fail("the buckets do not tile the parameters", at);
    at += k.bucket.numel;
  }
  if (at != size_) Fail("the buckets do not tile the parameters", at);
}

const SlotLayout::Place& SlotLayout::Containing(size_t flat) const {
  auto it = std::upper_bound(places_.begin(), places_.end(), flat,
                             [](size_t f, const Place& k) { return f < k.bucket.offset; });
  if (it == places_.begin() || flat >= size_) Fail("no bucket holds this index", flat);
  return *std::prev(it);
}

const SlotLayout::Place* SlotLayout::Find(size_t offset) const {
  if (offset >= size_) return nullptr;
  const Place& k = Containing(offset);
  return k.bucket.offset == offset ? &k : nullptr;
}

std::vector<const SlotLayout::Place*> SlotLayout::PlacesOf(const std::vector<DpBucket>& buckets,
                                                           const char* who) const {
  std::vector<const Place*> out;
  for (const DpBucket& b : buckets) {
    const Place* k = Find(b.offset);
    if (k == nullptr || k->bucket.numel != b.numel) {
      std::fprintf(stderr, "%s: the buffers are not sharded over these buckets\n", who);
      std::abort();
    }
    out.push_back(k);
  }
  return out;
}

size_t SlotLayout::At(size_t flat) const {
  const Place& k = Containing(flat);
  return k.at + (flat - k.bucket.offset);
}

size_t SlotLayout::Owned(size_t flat) const {
  const Place& k = Containing(flat);
  if (flat < k.part_begin || flat >= k.part_end)
    Fail("an index outside this rank's part of its bucket", flat);
  return k.part != kNone ? k.part + (flat - k.part_begin) : k.at + (flat - k.bucket.offset);
}

}  // namespace leantron::trainer
