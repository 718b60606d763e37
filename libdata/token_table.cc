#include "libdata/token_table.h"

namespace leantron::data {

uint64_t TokenTable::Hash(const uint8_t* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0x165667B19E3779F9ull);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 31;
  }
  if (i < n) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, n - i);
    h = (h ^ w) * 0xC2B2AE3D27D4EB4Full;
  }
  h ^= h >> 32;
  h *= 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 29);
}

void TokenTable::Grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{0, 0, 0, -1});
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.value < 0) continue;
    const auto* key = reinterpret_cast<const uint8_t*>(blob_.data()) + s.key;
    size_t i = Hash(key, s.len) & mask;
    while (slots_[i].value >= 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void TokenTable::Set(std::string_view key_view, int32_t value) {
  if (value < 0) return;
  if ((count_ + 1) * 2 > slots_.size()) Grow();
  const auto* key = reinterpret_cast<const uint8_t*>(key_view.data());
  const size_t n = key_view.size();
  const size_t mask = slots_.size() - 1;
  const uint64_t head = Head(key, n);
  for (size_t i = Hash(key, n) & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.value < 0) {
      s = Slot{head, static_cast<uint32_t>(n), static_cast<uint32_t>(blob_.size()), value};
      blob_.append(key_view);
      ++count_;
      if (n > max_len_) max_len_ = n;
      return;
    }
    if (s.head == head && s.len == n && std::memcmp(blob_.data() + s.key, key, n) == 0) {
      s.value = value;
      return;
    }
  }
}

int32_t TokenTable::Find(const uint8_t* p, size_t n) const {
  if (slots_.empty() || n > max_len_) return -1;
  const uint64_t head = Head(p, n);
  const size_t mask = slots_.size() - 1;
  for (size_t i = Hash(p, n) & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.value < 0) return -1;
    if (s.head == head && s.len == n &&
        (n <= 8 || std::memcmp(blob_.data() + s.key + 8, p + 8, n - 8) == 0)) {
      return s.value;
    }
  }
}

void PairTable::Grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 64 : old.size() * 2, Slot{kEmpty, kNoMerge});
  const size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    size_t i = Hash(s.key) & mask;
    while (slots_[i].key != kEmpty) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void PairTable::Set(int32_t left, int32_t right, Merge merge) {
  if ((count_ + 1) * 2 > slots_.size()) Grow();
  const uint64_t key = Key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = Hash(key) & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.key == kEmpty) {
      s = Slot{key, merge};
      ++count_;
      return;
    }
    if (s.key == key) {
      s.merge = merge;
      return;
    }
  }
}

}  // namespace leantron::data
