#include "trainer/reference/block_attention_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "trainer/reference/cpu_math.h"

namespace leantron::trainer {
namespace {

using cpu::Axpy;
using cpu::Dot;
using cpu::QkvLayout;

// Which keys a query of sample b sees, and the dropout mask of (head, query, key) by their
// positions in the whole sample (the same element the whole-sequence attention drops).
struct Visibility {
  const BlockAttentionArgs& a;
  const AttentionDropout& drop;
  float keep_scale;
  Visibility(const BlockAttentionArgs& args, const AttentionDropout& dropout)
      : a(args), drop(dropout), keep_scale(dropout.p > 0 ? 1.0f / (1.0f - dropout.p) : 1.0f) {}
  bool Sees(int64_t b, int64_t qpos, int64_t kpos) const {
    if (kpos > qpos) return false;
    if (a.documents == nullptr) return true;
    const int32_t* doc = a.documents + b * a.seq_length;
    return doc[kpos] == doc[qpos];
  }
  // 0 or 1/(1 − p).
  float Mask(int64_t b, int64_t h, int64_t qpos, int64_t kpos) const {
    if (drop.p <= 0.0f) return 1.0f;
    const int64_t t = a.seq_length;
    const int64_t index = ((drop.head_offset + h) * t + qpos) * t + kpos;
    return DropoutUniform(drop.seed, drop.first_sample + b, index) >= drop.p ? keep_scale : 0.0f;
  }
};

}  // namespace

void CpuBlockAttentionForward(float* out, float* lse, const float* qkv, const float* kv,
                              const BlockAttentionArgs& a, const AttentionDropout& dropout,
                              bool merge) {
  const QkvLayout L(a.heads, a.groups, a.head_dim);
  const int64_t d = a.head_dim, kv_row = a.groups * 2 * d, out_row = a.heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Visibility vis(a, dropout);
  std::vector<double> s(a.keys);
  std::vector<char> seen(a.keys);
  std::vector<float> acc(d);
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      const int64_t g = h / L.per;
      for (int64_t i = 0; i < a.queries; ++i) {
        const int64_t qpos = a.query_pos[i];
        const float* q = qkv + (b * a.queries + i) * L.row + L.q(h);
        float* y = out + (b * a.queries + i) * out_row + h * d;
        float& l = lse[(b * a.heads + h) * a.queries + i];
        double mx = -INFINITY;
        for (int64_t j = 0; j < a.keys; ++j) {
          seen[j] = vis.Sees(b, qpos, a.key_pos[j]);
          if (!seen[j]) continue;
          const float* k = kv + (b * a.keys + j) * kv_row + g * 2 * d;
          s[j] = static_cast<double>(Dot(q, k, d) * scale);
          mx = std::max(mx, s[j]);
        }
        if (mx == -INFINITY) {  // this block shows the query no key
          if (!merge) {
            std::memset(y, 0, d * sizeof(float));
            l = -INFINITY;
          }
          continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < a.keys; ++j) {
          if (!seen[j]) continue;
          s[j] = std::exp(s[j] - mx);
          sum += s[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < a.keys; ++j) {
          if (!seen[j]) continue;
          const float w = static_cast<float>(s[j] / sum) * vis.Mask(b, h, qpos, a.key_pos[j]);
          if (w != 0.0f) Axpy(acc.data(), w, kv + (b * a.keys + j) * kv_row + g * 2 * d + d, d);
        }
        const double block_lse = mx + std::log(sum);
        if (!merge || l == -INFINITY) {
          std::memcpy(y, acc.data(), d * sizeof(float));
          l = static_cast<float>(block_lse);
          continue;
        }
        // softmax over both key sets = the two partial softmaxes weighted by their share of
        // exp(lse): out = e^(l − new)·out + e^(block − new)·acc.
        const double old = l, top = std::max(old, block_lse);
        const double total = top + std::log(std::exp(old - top) + std::exp(block_lse - top));
        const float wa = static_cast<float>(std::exp(old - total));
        const float wb = static_cast<float>(std::exp(block_lse - total));
        for (int64_t c = 0; c < d; ++c) y[c] = wa * y[c] + wb * acc[c];
        l = static_cast<float>(total);
      }
    }
  }
}

void CpuBlockAttentionBackward(float* dqkv, float* dkv, const float* dout, const float* out,
                               const float* lse, const float* qkv, const float* kv,
                               const BlockAttentionArgs& a, const AttentionDropout& dropout) {
  const QkvLayout L(a.heads, a.groups, a.head_dim);
  const int64_t d = a.head_dim, kv_row = a.groups * 2 * d, out_row = a.heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Visibility vis(a, dropout);
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads; ++h) {
      const int64_t g = h / L.per;
      for (int64_t i = 0; i < a.queries; ++i) {
        const int64_t qpos = a.query_pos[i];
        const float* dy = dout + (b * a.queries + i) * out_row + h * d;
        const float* y = out + (b * a.queries + i) * out_row + h * d;
        const float* q = qkv + (b * a.queries + i) * L.row + L.q(h);
        float* dq = dqkv + (b * a.queries + i) * L.row + L.q(h);
        const double l = lse[(b * a.heads + h) * a.queries + i];
        // Σ_j p_j·dp_j over every key of the whole attention = dout · out.
        double delta = 0.0;
        for (int64_t c = 0; c < d; ++c) delta += static_cast<double>(dy[c]) * y[c];
        const float pdp = static_cast<float>(delta);
        for (int64_t j = 0; j < a.keys; ++j) {
          const int64_t kpos = a.key_pos[j];
          if (!vis.Sees(b, qpos, kpos)) continue;
          const float* k = kv + (b * a.keys + j) * kv_row + g * 2 * d;
          const float* v = k + d;
          float* dk = dkv + (b * a.keys + j) * kv_row + g * 2 * d;
          float* dv = dk + d;
          const float p =
              static_cast<float>(std::exp(static_cast<double>(Dot(q, k, d) * scale) - l));
          const float mask = vis.Mask(b, h, qpos, kpos);
          if (mask != 0.0f) Axpy(dv, p * mask, dy, d);
          const float dp = Dot(dy, v, d) * mask;
          const float ds = p * (dp - pdp) * scale;
          if (ds == 0.0f) continue;
          Axpy(dq, ds, k, d);
          Axpy(dk, ds, q, d);
        }
      }
    }
  }
}

}  // namespace leantron::trainer
