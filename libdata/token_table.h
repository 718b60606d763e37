// Lookup tables on the tokenizers' hot paths: byte strings -> id (TokenTable) and pairs of ids ->
// (merge rank, merged id) (PairTable). Both are open addressing with linear probing, built once
// and then read concurrently without locks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace leantron::data {

class TokenTable {
 public:
  TokenTable() { std::fill(std::begin(short_), std::end(short_), -1); }

  // Sets key -> value; a key set twice keeps the last value (as a JSON object's last duplicate).
  void Set(std::string_view key, int32_t value);
  // Value of key, or -1.
  int32_t Find(const uint8_t* p, size_t n) const {
    if (n == 1) return short_[p[0]];
    if (n == 2) return two_.empty() ? -1 : two_[(p[0] << 8) | p[1]];
    return FindLong(p, n);
  }
  int32_t Find(std::string_view s) const {
    return Find(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  size_t size() const { return count_; }
  size_t max_key_length() const { return max_len_; }

 private:
  // 16 bytes, so a probe touches one cache line; the key's bytes are in blob_ at keys_[slot].
  struct Slot {
    uint64_t head;  // first 8 bytes of the key, zero-padded
    uint32_t len;
    int32_t value;  // -1: empty slot
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
  static uint64_t Hash(const uint8_t* p, size_t n);
  int32_t FindLong(const uint8_t* p, size_t n) const;
  void Grow();

  int32_t short_[256];        // one-byte keys
  std::vector<int32_t> two_;  // two-byte keys, indexed by first << 8 | second (when any)
  std::string blob_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> keys_;
  size_t count_ = 0;
  size_t max_len_ = 0;
};

class PairTable {
 public:
  struct Merge {
    int32_t rank;    // INT32_MAX when the pair does not merge
    int32_t merged;  // id of the merged token
  };
  static constexpr Merge kNoMerge = {INT32_MAX, -1};

  PairTable() = default;
  // Sets (left, right) -> merge; a pair set twice keeps the last.
  void Set(int32_t left, int32_t right, Merge merge);
  Merge Find(int32_t left, int32_t right) const {
    if (slots_.empty()) return kNoMerge;
    const uint64_t key = Key(left, right);
    const size_t mask = slots_.size() - 1;
    for (size_t i = Hash(key) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.merge;
      if (s.key == kEmpty) return kNoMerge;
    }
  }
  size_t size() const { return count_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  static uint64_t Key(int32_t a, int32_t b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
  static size_t Hash(uint64_t key) {
    key ^= key >> 29;
    key *= 0xBF58476D1CE4E5B9ull;
    key ^= key >> 32;
    return static_cast<size_t>(key);
  }
  void Grow();

  std::vector<Slot> slots_;
  size_t count_ = 0;
};

// Merges the pairs of symbols id[0, count) in the order of their merge's key (`key_of(Merge)`,
// `none` for a pair that does not merge), lowest first and leftmost on ties, by scanning the keys
// after every merge: for words short enough that a scan beats a heap. `key` and `merged` hold one
// entry per pair (count - 1). Returns the number of symbols left in id.
template <typename Key, typename KeyOf>
size_t ScanMerge(const PairTable& merges, KeyOf key_of, Key none, int32_t* id, size_t count,
                 Key* key, int32_t* merged) {
  const auto pair = [&](size_t i) {
    const PairTable::Merge m = merges.Find(id[i], id[i + 1]);
    key[i] = key_of(m);
    merged[i] = m.merged;
  };
  for (size_t i = 0; i + 1 < count; ++i) pair(i);
  for (;;) {
    Key best = none;
    for (size_t i = 0; i + 1 < count; ++i) best = std::min(best, key[i]);
    if (best == none) break;
    size_t at = 0;
    while (key[at] != best) ++at;
    id[at] = merged[at];
    const size_t tail = count - at - 2;
    std::memmove(id + at + 1, id + at + 2, tail * sizeof(int32_t));
    if (tail > 0) {
      std::memmove(key + at + 1, key + at + 2, (tail - 1) * sizeof(Key));
      std::memmove(merged + at + 1, merged + at + 2, (tail - 1) * sizeof(int32_t));
    }
    --count;
    if (at + 1 < count) pair(at);
    if (at > 0) pair(at - 1);
  }
  return count;
}

}  // namespace leantron::data
