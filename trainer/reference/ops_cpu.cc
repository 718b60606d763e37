// The `cpu` backend: float32 storage, float64 wherever a long sum decides the result (norm
// statistics, softmax denominators, bias/norm gradient sums over rows), so it can serve as the
// reference every faster backend is tested against. Straight loops, row-major, no threads: the
// machine's cores belong to the ranks.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "libckpt/dtype.h"
#include "trainer/core/adamw.h"
#include "trainer/core/layer_spec.h"
#include "trainer/reference/block_attention_cpu.h"
#include "trainer/reference/cpu_math.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {
namespace {

using cpu::Axpy;
using cpu::Dot;
using cpu::QkvLayout;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

class CpuOps final : public Ops {
 public:
  std::string name() const override { return "cpu"; }

  float* Alloc(size_t n) override {
    return static_cast<float*>(std::calloc(n == 0 ? 1 : n, sizeof(float)));
  }
  void Free(float* p) override { std::free(p); }
  void* AllocBytes(size_t bytes) override { return std::calloc(bytes == 0 ? 1 : bytes, 1); }
  void FreeBytes(void* p) override { std::free(p); }
  void CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    std::memcpy(dst, host_src, bytes);
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    std::memcpy(host_dst, src, bytes);
  }
  void* AllocPinned(size_t bytes) override { return AllocBytes(bytes); }
  void FreePinned(void* p) override { FreeBytes(p); }
  void CopyFence() override {}
  uint64_t CopyToHostAsync(void* host_dst, const void* src, size_t bytes) override {
    CopyToHost(host_dst, src, bytes);
    return 0;
  }
  uint64_t CopyFromHostAsync(void* dst, const void* host_src, size_t bytes) override {
    CopyFromHost(dst, host_src, bytes);
    return 0;
  }
  void WaitCopy(uint64_t) override {}
  void ComputeAfterCopy(uint64_t) override {}
  void ComputeAfterCopies() override {}
  void Zero(float* p, size_t n) override { std::memset(p, 0, n * sizeof(float)); }
  void Copy(float* dst, const float* src, size_t n) override {
    std::memcpy(dst, src, n * sizeof(float));
  }
  void AddInPlace(float* a, const float* b, size_t n) override {
    for (size_t i = 0; i < n; ++i) a[i] += b[i];
  }
  void AddBias(float* out, const float* bias, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] += bias[c];
  }
  void BiasBackward(float* dbias, const float* dout, int64_t rows, int64_t cols) override {
    std::vector<double> acc(cols, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) acc[c] += dout[r * cols + c];
    for (int64_t c = 0; c < cols; ++c) dbias[c] += static_cast<float>(acc[c]);
  }

  void LinearForward(float* out, const float* in, const float* weight, const float* bias, int64_t m,
                     int64_t k, int64_t n) override {
    for (int64_t r = 0; r < m; ++r) {
      const float* x = in + r * k;
      float* y = out + r * n;
      for (int64_t o = 0; o < n; ++o) y[o] = Dot(x, weight + o * k, k) + (bias ? bias[o] : 0.0f);
    }
  }

  void LinearBackward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                      const float* weight, int64_t m, int64_t k, int64_t n,
                      bool accumulate_din) override {
    if (din != nullptr) {
      for (int64_t r = 0; r < m; ++r) {
        float* dx = din + r * k;
        if (!accumulate_din) std::memset(dx, 0, k * sizeof(float));
        const float* dy = dout + r * n;
        for (int64_t o = 0; o < n; ++o)
          if (dy[o] != 0.0f) Axpy(dx, dy[o], weight + o * k, k);
      }
    }
    // dweight row o = Σ_r dout[r, o] · in[r]: accumulate each row in a float64 scratch row.
    std::vector<double> acc(k);
    for (int64_t o = 0; o < n; ++o) {
      std::fill(acc.begin(), acc.end(), 0.0);
      double bsum = 0.0;
      for (int64_t r = 0; r < m; ++r) {
        const float g = dout[r * n + o];
        bsum += g;
        if (g == 0.0f) continue;
        const float* x = in + r * k;
        for (int64_t i = 0; i < k; ++i) acc[i] += static_cast<double>(g) * x[i];
      }
      float* dw = dweight + o * k;
      for (int64_t i = 0; i < k; ++i) dw[i] += static_cast<float>(acc[i]);
      if (dbias != nullptr) dbias[o] += static_cast<float>(bsum);
    }
  }

  void LayerNormForward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                        const float* bias, int64_t rows, int64_t cols, float eps) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in + r * cols;
      double s = 0.0;
      for (int64_t c = 0; c < cols; ++c) s += x[c];
      const double mu = s / cols;
      double v = 0.0;
      for (int64_t c = 0; c < cols; ++c) v += (x[c] - mu) * (x[c] - mu);
      const double rs = 1.0 / std::sqrt(v / cols + eps);
      float* y = out + r * cols;
      for (int64_t c = 0; c < cols; ++c)
        y[c] = static_cast<float>((x[c] - mu) * rs) * weight[c] + bias[c];
      mean[r] = static_cast<float>(mu);
      rstd[r] = static_cast<float>(rs);
    }
  }

  void LayerNormBackward(float* din, float* dweight, float* dbias, const float* dout,
                         const float* in, const float* weight, const float* mean, const float* rstd,
                         int64_t rows, int64_t cols) override {
    std::vector<double> dw(cols, 0.0), db(cols, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in + r * cols;
      const float* dy = dout + r * cols;
      const double mu = mean[r], rs = rstd[r];
      double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        const double norm = (x[c] - mu) * rs;
        const double dnorm = static_cast<double>(weight[c]) * dy[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
        dw[c] += norm * dy[c];
        db[c] += dy[c];
      }
      dnorm_mean /= cols;
      dnorm_norm_mean /= cols;
      float* dx = din + r * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const double norm = (x[c] - mu) * rs;
        const double dnorm = static_cast<double>(weight[c]) * dy[c];
        dx[c] += static_cast<float>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs);
      }
    }
    for (int64_t c = 0; c < cols; ++c) {
      dweight[c] += static_cast<float>(dw[c]);
      dbias[c] += static_cast<float>(db[c]);
    }
  }

  void RmsNormForward(float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                      int64_t cols, float eps) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in + r * cols;
      double ss = 0.0;
      for (int64_t c = 0; c < cols; ++c) ss += static_cast<double>(x[c]) * x[c];
      const double rs = 1.0 / std::sqrt(ss / cols + eps);
      for (int64_t c = 0; c < cols; ++c)
        out[r * cols + c] = static_cast<float>(x[c] * rs) * weight[c];
      rstd[r] = static_cast<float>(rs);
    }
  }

  void RmsNormBackward(float* din, float* dweight, const float* dout, const float* in,
                       const float* weight, const float* rstd, int64_t rows,
                       int64_t cols) override {
    std::vector<double> dw(cols, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in + r * cols;
      const float* dy = dout + r * cols;
      const double rs = rstd[r];
      double dot = 0.0;  // Σ dnorm·norm
      for (int64_t c = 0; c < cols; ++c) {
        const double norm = x[c] * rs;
        dot += static_cast<double>(weight[c]) * dy[c] * norm;
        dw[c] += norm * dy[c];
      }
      dot /= cols;
      for (int64_t c = 0; c < cols; ++c) {
        const double norm = x[c] * rs;
        din[r * cols + c] +=
            static_cast<float>((static_cast<double>(weight[c]) * dy[c] - norm * dot) * rs);
      }
    }
    for (int64_t c = 0; c < cols; ++c) dweight[c] += static_cast<float>(dw[c]);
  }

  void SwigluForward(float* out, const float* in, int64_t rows, int64_t width) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* gate = in + r * 2 * width;
      const float* up = gate + width;
      for (int64_t c = 0; c < width; ++c)
        out[r * width + c] = gate[c] / (1.0f + std::exp(-gate[c])) * up[c];
    }
  }

  void SwigluBackward(float* din, const float* dout, const float* in, int64_t rows,
                      int64_t width) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* gate = in + r * 2 * width;
      const float* up = gate + width;
      float* dgate = din + r * 2 * width;
      float* dup = dgate + width;
      for (int64_t c = 0; c < width; ++c) {
        const float sig = 1.0f / (1.0f + std::exp(-gate[c]));
        const float dy = dout[r * width + c];
        dup[c] = dy * gate[c] * sig;
        dgate[c] = dy * up[c] * sig * (1.0f + gate[c] * (1.0f - sig));
      }
    }
  }

  void Rope(float* qkv, int64_t batch, int64_t seq, int64_t heads, int64_t groups, int64_t head_dim,
            const std::vector<double>& inv_freq, bool inverse, const int32_t* positions,
            int64_t positions_bound) override {
    const QkvLayout L(heads, groups, head_dim);
    const int64_t half = head_dim / 2;
    std::vector<float> cs, sn;
    RopeTable(inv_freq, positions != nullptr ? positions_bound : seq, &cs, &sn);
    if (inverse)
      for (float& x : sn) x = -x;
    // Rotate-half: (x1, x2) → (x1·cos − x2·sin, x2·cos + x1·sin); the inverse (the backward of
    // this orthogonal map) rotates by −angle. Queries of every head, keys of every group.
    auto rotate = [&](float* x, int64_t t) {
      for (int64_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half], c = cs[t * half + i], s = sn[t * half + i];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
      }
    };
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < seq; ++t) {
        float* row = qkv + (b * seq + t) * L.row;
        const int64_t pos = positions != nullptr ? positions[b * seq + t] : t;
        for (int64_t h = 0; h < heads; ++h) rotate(row + L.q(h), pos);
        for (int64_t g = 0; g < groups; ++g) rotate(row + L.k(g * L.per), pos);
      }
  }

  void GeluForward(float* out, const float* in, size_t n, bool tanh_approx) override {
    for (size_t i = 0; i < n; ++i) {
      const float x = in[i];
      if (tanh_approx) {
        out[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
      } else {
        out[i] = 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
      }
    }
  }

  void GeluBackward(float* din, const float* dout, const float* in, size_t n,
                    bool tanh_approx) override {
    for (size_t i = 0; i < n; ++i) {
      const float x = in[i];
      float g;
      if (tanh_approx) {
        const float t = std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x));
        g = 0.5f * (1.0f + t) +
            0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * x * x);
      } else {
        g = 0.5f * (1.0f + std::erf(x * kInvSqrt2)) + x * kInvSqrt2Pi * std::exp(-0.5f * x * x);
      }
      din[i] = g * dout[i];
    }
  }

  void AttentionForward(float* out, float* probs, const float* qkv, int64_t batch, int64_t seq,
                        int64_t heads, int64_t groups, int64_t head_dim,
                        const AttentionDropout& dropout) override {
    const QkvLayout L(heads, groups, head_dim);
    const int64_t d = head_dim, row = L.row;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const float keep_scale = dropout.p > 0 ? 1.0f / (1.0f - dropout.p) : 1.0f;
    std::vector<double> s(seq);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < seq; ++i) {
          const float* q = qkv + (b * seq + i) * row + L.q(h);
          double mx = -INFINITY;
          for (int64_t j = 0; j <= i; ++j) {
            const float* k = qkv + (b * seq + j) * row + L.k(h);
            s[j] = static_cast<double>(Dot(q, k, d) * scale);
            mx = std::max(mx, s[j]);
          }
          double sum = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            s[j] = std::exp(s[j] - mx);
            sum += s[j];
          }
          float* p = probs + ((b * heads + h) * seq + i) * seq;
          float* y = out + (b * seq + i) * heads * d + h * d;
          std::memset(y, 0, d * sizeof(float));
          for (int64_t j = 0; j < seq; ++j) {
            if (j > i) {
              p[j] = 0.0f;
              continue;
            }
            p[j] = static_cast<float>(s[j] / sum);
            const float w = p[j] * DropMask(dropout, b, h, i, j, seq) * keep_scale;
            if (w != 0.0f) Axpy(y, w, qkv + (b * seq + j) * row + L.v(h), d);
          }
        }
      }
    }
  }

  void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* probs,
                         int64_t batch, int64_t seq, int64_t heads, int64_t groups,
                         int64_t head_dim, const AttentionDropout& dropout) override {
    const QkvLayout L(heads, groups, head_dim);
    const int64_t d = head_dim, row = L.row;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    const float keep_scale = dropout.p > 0 ? 1.0f / (1.0f - dropout.p) : 1.0f;
    std::memset(dqkv, 0, batch * seq * row * sizeof(float));
    std::vector<float> dp(seq);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < seq; ++i) {
          const float* dy = dout + (b * seq + i) * heads * d + h * d;
          const float* p = probs + ((b * heads + h) * seq + i) * seq;
          const float* q = qkv + (b * seq + i) * row + L.q(h);
          float* dq = dqkv + (b * seq + i) * row + L.q(h);
          double pdp = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            const float mask = DropMask(dropout, b, h, i, j, seq) * keep_scale;
            const float* v = qkv + (b * seq + j) * row + L.v(h);
            float* dv = dqkv + (b * seq + j) * row + L.v(h);
            // out = Σ_j p_j·mask_j·v_j
            if (mask != 0.0f) Axpy(dv, p[j] * mask, dy, d);
            dp[j] = Dot(dy, v, d) * mask;
            pdp += static_cast<double>(p[j]) * dp[j];
          }
          for (int64_t j = 0; j <= i; ++j) {
            const float ds = p[j] * (dp[j] - static_cast<float>(pdp)) * scale;
            if (ds == 0.0f) continue;
            const float* k = qkv + (b * seq + j) * row + L.k(h);
            float* dk = dqkv + (b * seq + j) * row + L.k(h);
            Axpy(dq, ds, k, d);
            Axpy(dk, ds, q, d);
          }
        }
      }
    }
  }

  void BlockAttentionForward(float* out, float* lse, const float* qkv, const float* kv,
                             const BlockAttentionArgs& args, const AttentionDropout& dropout,
                             bool merge) override {
    CpuBlockAttentionForward(out, lse, qkv, kv, args, dropout, merge);
  }
  void BlockAttentionBackward(float* dqkv, float* dkv, const float* dout, const float* out,
                              const float* lse, const float* qkv, const float* kv,
                              const BlockAttentionArgs& args,
                              const AttentionDropout& dropout) override {
    CpuBlockAttentionBackward(dqkv, dkv, dout, out, lse, qkv, kv, args, dropout);
  }
  void Copy2D(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
              int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dst_stride, src + r * src_stride, cols * sizeof(float));
  }

  void Dropout(float* x, int64_t rows, int64_t cols, const HiddenDropout& dropout) override {
    if (dropout.p <= 0.0f) return;
    const float keep_scale = 1.0f / (1.0f - dropout.p);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t sample, position;
      DropoutRowPlace(dropout, r, &sample, &position);
      const int64_t base = position * cols;
      for (int64_t c = 0; c < cols; ++c) {
        const bool keep = DropoutUniform(dropout.seed, sample, base + c) >= dropout.p;
        x[r * cols + c] = keep ? x[r * cols + c] * keep_scale : 0.0f;
      }
    }
  }

  void EmbeddingForward(float* out, const int32_t* ids, const float* table, int64_t rows,
                        int64_t cols, int64_t vocab_begin, int64_t vocab_end) override {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = ids[r];
      if (id >= vocab_begin && id < vocab_end) {
        std::memcpy(out + r * cols, table + (id - vocab_begin) * cols, cols * sizeof(float));
      } else {
        std::memset(out + r * cols, 0, cols * sizeof(float));
      }
    }
  }

  void EmbeddingBackward(float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                         int64_t cols, int64_t vocab_begin, int64_t vocab_end) override {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = ids[r];
      if (id >= vocab_begin && id < vocab_end)
        AddInPlace(dtable + (id - vocab_begin) * cols, dout + r * cols, cols);
    }
  }

  void PositionForward(float* out, const int32_t* positions, const float* table, int64_t rows,
                       int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r)
      AddInPlace(out + r * cols, table + static_cast<int64_t>(positions[r]) * cols, cols);
  }

  void PositionBackward(float* dtable, const float* dout, const int32_t* positions, int64_t rows,
                        int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r)
      AddInPlace(dtable + static_cast<int64_t>(positions[r]) * cols, dout + r * cols, cols);
  }

  void CrossEntropyForward(float* losses, float* stats, const float* logits, const int32_t* targets,
                           int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                           const ReduceHook& reduce_max, const ReduceHook& reduce_sum) override {
    std::vector<float> mx(rows), sums(2 * rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* l = logits + r * vocab_local;
      float m = -INFINITY;
      for (int64_t v = 0; v < vocab_local; ++v) m = std::max(m, l[v]);
      mx[r] = m;
    }
    if (reduce_max) reduce_max(mx.data(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* l = logits + r * vocab_local;
      double s = 0.0;
      for (int64_t v = 0; v < vocab_local; ++v) s += std::exp(static_cast<double>(l[v]) - mx[r]);
      sums[2 * r] = static_cast<float>(s);
      const int64_t t = targets[r] - vocab_begin;
      sums[2 * r + 1] = (targets[r] >= 0 && t >= 0 && t < vocab_local) ? l[t] : 0.0f;
    }
    if (reduce_sum) reduce_sum(sums.data(), 2 * rows);
    for (int64_t r = 0; r < rows; ++r) {
      const double lse = mx[r] + std::log(static_cast<double>(sums[2 * r]));
      stats[2 * r] = mx[r];
      stats[2 * r + 1] = static_cast<float>(lse);
      losses[r] = targets[r] < 0 ? 0.0f : static_cast<float>(lse - sums[2 * r + 1]);
    }
  }

  void CrossEntropyBackward(float* dlogits, const float* dlosses, const float* stats,
                            const float* logits, const int32_t* targets, int64_t rows,
                            int64_t vocab_local, int64_t vocab_begin) override {
    for (int64_t r = 0; r < rows; ++r) {
      float* dl = dlogits + r * vocab_local;
      if (targets[r] < 0) {
        std::memset(dl, 0, vocab_local * sizeof(float));
        continue;
      }
      const float* l = logits + r * vocab_local;
      const double lse = stats[2 * r + 1];
      const float g = dlosses[r];
      for (int64_t v = 0; v < vocab_local; ++v)
        dl[v] = static_cast<float>(std::exp(static_cast<double>(l[v]) - lse)) * g;
      const int64_t t = targets[r] - vocab_begin;
      if (t >= 0 && t < vocab_local) dl[t] -= g;
    }
  }

  double SumSquares(const float* x, size_t n) override {
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
    return s;
  }

  void AdamWStep(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, size_t n,
                 float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                 float grad_scale, uint16_t* bf16_out) override {
    const AdamWConstants c =
        MakeAdamWConstants(lr, beta1, beta2, eps, weight_decay, step, grad_scale);
    for (size_t i = 0; i < n; ++i) {
      AdamWElement(c, grad[i], &param[i], &exp_avg[i], &exp_avg_sq[i]);
      if (bf16_out != nullptr) bf16_out[i] = ckpt::FloatToBFloat16(param[i]);
    }
  }

 private:
  static float DropMask(const AttentionDropout& dropout, int64_t b, int64_t h, int64_t i, int64_t j,
                        int64_t seq) {
    if (dropout.p <= 0.0f) return 1.0f;
    const int64_t index = ((dropout.head_offset + h) * seq + i) * seq + j;
    return DropoutUniform(dropout.seed, dropout.first_sample + b, index) >= dropout.p ? 1.0f : 0.0f;
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Ops>> CreateOps(const std::string& backend) {
  if (backend == "cpu") return std::make_unique<CpuOps>();
#ifdef LEANTRON_HAVE_CUDA
  if (backend == "cuda") return CreateCudaOps();
  return absl::InvalidArgumentError("unknown ops backend '" + backend +
                                    "' (this build has: cpu, cuda)");
#else
  return absl::InvalidArgumentError("unknown ops backend '" + backend +
                                    "' (this build has: cpu; cuda needs a CUDA toolkit at build "
                                    "time)");
#endif
}

}  // namespace leantron::trainer
