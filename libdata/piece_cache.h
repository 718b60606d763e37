// A per-thread cache of byte strings -> token ids for the tokenizers' pieces that are not one
// token: open addressing keyed like TokenTable (first and last 8 bytes, length), keys and ids in
// two arenas, so a hit is one probe and a copy, and an insertion allocates nothing once warm.
// When it holds max_entries it is emptied and refilled (recent text's pieces come back first).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace leantron::data {

class PieceCache {
 public:
  explicit PieceCache(size_t max_entries = size_t{1} << 17) : max_entries_(max_entries) {
    size_t cap = 64;
    while (cap < 2 * max_entries_) cap <<= 1;
    slots_.assign(cap, Slot{});
  }

  // Appends the cached ids of [p, p+n) to out and returns true, or returns false.
  bool Lookup(const uint8_t* p, size_t n, std::vector<int32_t>* out) const {
    const uint64_t head = Head(p, n);
    const uint64_t tail = Tail(p, n);
    const size_t mask = slots_.size() - 1;
    for (size_t i = Hash(head, tail, n) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.len == 0) return false;
      // Up to 16 bytes, the first and the last 8 cover the key.
      if (s.head == head && s.len == n &&
          (n <= 8 || (n <= 16 ? Tail(keys_.data() + s.key, n) == tail
                              : std::memcmp(keys_.data() + s.key + 8, p + 8, n - 8) == 0))) {
        const int32_t* ids = ids_.data() + s.ids;
        if (s.count == 1) {
          out->push_back(ids[0]);
        } else {
          out->insert(out->end(), ids, ids + s.count);
        }
        return true;
      }
    }
  }

  void Insert(const uint8_t* p, size_t n, const int32_t* ids, size_t count) {
    if (n == 0 || n > UINT32_MAX) return;
    if (entries_ >= max_entries_) Clear();
    const uint64_t head = Head(p, n);
    const size_t mask = slots_.size() - 1;
    size_t i = Hash(head, Tail(p, n), n) & mask;
    while (slots_[i].len != 0) i = (i + 1) & mask;
    slots_[i] = Slot{head, static_cast<uint32_t>(n), static_cast<uint32_t>(keys_.size()),
                     static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(count)};
    keys_.insert(keys_.end(), p, p + n);
    ids_.insert(ids_.end(), ids, ids + count);
    ++entries_;
  }

  void Clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    entries_ = 0;
  }

 private:
  struct Slot {
    uint64_t head = 0;
    uint32_t len = 0;  // 0: empty
    uint32_t key = 0, ids = 0, count = 0;
  };
  static uint64_t Head(const uint8_t* p, size_t n) {
    uint64_t h = 0;
    if (n >= 8) {
      std::memcpy(&h, p, 8);
    } else {
      for (size_t i = 0; i < n; ++i) h |= uint64_t{p[i]} << (8 * i);
    }
    return h;
  }
  static uint64_t Tail(const uint8_t* p, size_t n) {  // the last 8 bytes when there are more
    uint64_t tail = 0;
    if (n > 8) std::memcpy(&tail, p + n - 8, 8);
    return tail;
  }
  static size_t Hash(uint64_t head, uint64_t tail, size_t n) {
    uint64_t x = head ^ (tail * 0xC2B2AE3D27D4EB4Full) ^ (n * 0x165667B19E3779F9ull);
    x ^= x >> 32;
    x *= 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(x ^ (x >> 29));
  }

  size_t max_entries_;
  size_t entries_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint8_t> keys_;
  std::vector<int32_t> ids_;
};

}  // namespace leantron::data
