// numpy's legacy RandomState(seed) as far as Megatron's GPT dataset uses it: seeding with an
// integer and shuffle() of 1-D arrays. The generator is MT19937 seeded by init_genrand, which is
// exactly std::mt19937(seed); what numpy adds is its bounded draw (random_interval: mask to the
// smallest covering all-ones value, reject above the bound, 64-bit draws past 32 bits) and the
// Fisher-Yates order of shuffle (i from n-1 down to 1). Same seed, same calls, same arrays.
#pragma once

#include <cstdint>
#include <random>
#include <utility>

#include "absl/types/span.h"

namespace leantron::data {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  uint32_t NextUint32() { return static_cast<uint32_t>(mt_()); }
  // numpy's mt19937_next64: high word first.
  uint64_t NextUint64() {
    const uint64_t high = NextUint32();
    return (high << 32) | NextUint32();
  }
  // numpy's random_interval(max): uniform in [0, max].
  uint64_t RandomInterval(uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t value;
    if (max <= 0xffffffffULL) {
      while ((value = (NextUint32() & mask)) > max) {
      }
    } else {
      while ((value = (NextUint64() & mask)) > max) {
      }
    }
    return value;
  }
  // RandomState.shuffle on a 1-D array.
  template <typename T>
  void Shuffle(absl::Span<T> a) {
    for (size_t i = a.size() > 0 ? a.size() - 1 : 0; i >= 1; --i) {
      const size_t j = static_cast<size_t>(RandomInterval(i));
      std::swap(a[i], a[j]);
    }
  }

 private:
  std::mt19937 mt_;
};

}  // namespace leantron::data
