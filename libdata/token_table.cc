#include "libdata/token_table.h"

namespace leantron::data {

uint64_t TokenTable::Hash(const uint8_t* p, size_t n) {
  // The first 8 bytes, the last 8 and the length tell almost all tokens apart; longer keys are
  // compared in full on a hit anyway.
  const uint64_t head = Head(p, n);
  uint64_t tail = 0;
  if (n > 8) std::memcpy(&tail, p + n - 8, 8);
  uint64_t x = head ^ (tail * 0xC2B2AE3D27D4EB4Full) ^ (n * 0x165667B19E3779F9ull);
  x ^= x >> 32;
  x *= 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29);
}

void TokenTable::Grow() {
  std::vector<Slot> old = std::move(slots_);
  std::vector<uint32_t> old_keys = std::move(keys_);
  const size_t cap = old.empty() ? 64 : old.size() * 2;
  slots_.assign(cap, Slot{0, 0, -1});
  keys_.assign(cap, 0);
  const size_t mask = cap - 1;
  for (size_t k = 0; k < old.size(); ++k) {
    if (old[k].value < 0) continue;
    const auto* key = reinterpret_cast<const uint8_t*>(blob_.data()) + old_keys[k];
    size_t i = Hash(key, old[k].len) & mask;
    while (slots_[i].value >= 0) i = (i + 1) & mask;
    slots_[i] = old[k];
    keys_[i] = old_keys[k];
  }
}

void TokenTable::Set(std::string_view key_view, int32_t value) {
  if (value < 0) return;
  const auto* key = reinterpret_cast<const uint8_t*>(key_view.data());
  const size_t n = key_view.size();
  if (n == 1) {
    count_ += short_[key[0]] < 0;
    short_[key[0]] = value;
    if (n > max_len_) max_len_ = n;
    return;
  }
  if (n == 2) {
    if (two_.empty()) two_.assign(1 << 16, -1);
    int32_t& slot = two_[(key[0] << 8) | key[1]];
    count_ += slot < 0;
    slot = value;
    if (n > max_len_) max_len_ = n;
    return;
  }
  if ((count_ + 1) * 4 > slots_.size() * 3) Grow();
  const size_t mask = slots_.size() - 1;
  const uint64_t head = Head(key, n);
  for (size_t i = Hash(key, n) & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.value < 0) {
      s = Slot{head, static_cast<uint32_t>(n), value};
      keys_[i] = static_cast<uint32_t>(blob_.size());
      blob_.append(key_view);
      ++count_;
      if (n > max_len_) max_len_ = n;
      return;
    }
    if (s.head == head && s.len == n && std::memcmp(blob_.data() + keys_[i], key, n) == 0) {
      s.value = value;
      return;
    }
  }
}

int32_t TokenTable::FindLong(const uint8_t* p, size_t n) const {
  if (slots_.empty() || n > max_len_) return -1;
  const uint64_t head = Head(p, n);
  const size_t mask = slots_.size() - 1;
  for (size_t i = Hash(p, n) & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.value < 0) return -1;
    if (s.head == head && s.len == n &&
        (n <= 8 || std::memcmp(blob_.data() + keys_[i] + 8, p + 8, n - 8) == 0)) {
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
