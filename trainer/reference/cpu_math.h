// Inner loops the cpu backend's ops share (reference/ops_cpu.cc, block_attention_cpu.cc).
#pragma once

#include <cstdint>

namespace leantron::trainer::cpu {

// Eight independent partial sums keep the dependency chain short and the rounding error of long
// dot products lower than one running sum.
inline float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

inline void Axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

// Megatron-Core's grouped QKV row of one token: per query group its heads/groups query heads,
// then its key head, then its value head ([q k v] per head without grouping).
struct QkvLayout {
  QkvLayout(int64_t heads, int64_t groups, int64_t d)
      : per(heads / groups), d(d), row((heads + 2 * groups) * d) {}
  int64_t q(int64_t h) const { return (h / per) * (per + 2) * d + (h % per) * d; }
  int64_t k(int64_t h) const { return (h / per) * (per + 2) * d + per * d; }
  int64_t v(int64_t h) const { return k(h) + d; }
  int64_t per, d, row;
};

}  // namespace leantron::trainer::cpu
