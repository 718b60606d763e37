// Every cpu op against a float64 reference written here: forwards compared directly, backwards
// against central finite differences of the float64 reference (d/dx Σ out·R for a random R).
#include "trainer/reference/ops.h"

#include <barrier>
#include <cmath>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "libckpt/dtype.h"
#include "trainer/core/layer_spec.h"

namespace leantron::trainer {
namespace {

using Vec = std::vector<double>;
using Fn = std::function<double(const Vec&)>;

std::vector<float> Rand(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}
Vec D(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// Central differences of f at x.
Vec NumGrad(const Fn& f, Vec x, double eps = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + eps;
    const double up = f(x);
    x[i] = keep - eps;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

void ExpectNear(const std::vector<float>& got, const Vec& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << " [" << i << "]";
}

double Dotted(const Vec& out, const Vec& r) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * r[i];
  return s;
}

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override { ops_ = *CreateOps("cpu"); }
  std::unique_ptr<Ops> ops_;
};

TEST_F(OpsTest, UnknownBackendIsAnError) { EXPECT_FALSE(CreateOps("tpu").ok()); }

// ---------------------------------------------------------------- linear
Vec LinearRef(const Vec& in, const Vec& w, const Vec& b, int m, int k, int n) {
  Vec out(m * n);
  for (int r = 0; r < m; ++r)
    for (int o = 0; o < n; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int i = 0; i < k; ++i) s += in[r * k + i] * w[o * k + i];
      out[r * n + o] = s;
    }
  return out;
}

TEST_F(OpsTest, LinearForwardAndBackward) {
  const int m = 5, k = 19, n = 6;
  auto in = Rand(m * k, 1), w = Rand(n * k, 2), b = Rand(n, 3), r = Rand(m * n, 4);
  std::vector<float> out(m * n);
  ops_->LinearForward(out.data(), in.data(), w.data(), b.data(), m, k, n);
  ExpectNear(out, LinearRef(D(in), D(w), D(b), m, k, n), 1e-5, "out");

  std::vector<float> din(m * k, 7.0f), dw(n * k, 0.5f), db(n, 0.25f);
  ops_->LinearBackward(din.data(), dw.data(), db.data(), r.data(), in.data(), w.data(), m, k, n,
                       false);
  const Vec R = D(r);
  Vec gin =
      NumGrad([&](const Vec& x) { return Dotted(LinearRef(x, D(w), D(b), m, k, n), R); }, D(in));
  Vec gw =
      NumGrad([&](const Vec& x) { return Dotted(LinearRef(D(in), x, D(b), m, k, n), R); }, D(w));
  Vec gb =
      NumGrad([&](const Vec& x) { return Dotted(LinearRef(D(in), D(w), x, m, k, n), R); }, D(b));
  for (double& g : gw) g += 0.5;  // parameter gradients accumulate
  for (double& g : gb) g += 0.25;
  ExpectNear(din, gin, 1e-4, "din");
  ExpectNear(dw, gw, 1e-4, "dweight");
  ExpectNear(db, gb, 1e-4, "dbias");

  // accumulate_din adds to what is there.
  std::vector<float> din2(m * k, 1.0f), dw2(n * k, 0.0f);
  ops_->LinearBackward(din2.data(), dw2.data(), nullptr, r.data(), in.data(), w.data(), m, k, n,
                       true);
  for (double& g : gin) g += 1.0;
  ExpectNear(din2, gin, 1e-4, "din accumulated");
}

// ---------------------------------------------------------------- layer norm
Vec LayerNormRef(const Vec& x, const Vec& w, const Vec& b, int rows, int cols, double eps) {
  Vec out(x.size());
  for (int r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int c = 0; c < cols; ++c) mu += x[r * cols + c];
    mu /= cols;
    for (int c = 0; c < cols; ++c) var += (x[r * cols + c] - mu) * (x[r * cols + c] - mu);
    var /= cols;
    for (int c = 0; c < cols; ++c)
      out[r * cols + c] = (x[r * cols + c] - mu) / std::sqrt(var + eps) * w[c] + b[c];
  }
  return out;
}

TEST_F(OpsTest, LayerNormForwardAndBackward) {
  const int rows = 4, cols = 13;
  auto x = Rand(rows * cols, 5, 2.0f), w = Rand(cols, 6), b = Rand(cols, 7),
       r = Rand(rows * cols, 8);
  for (float& v : x) v += 3.0f;  // an offset mean tests the centring
  std::vector<float> out(rows * cols), mean(rows), rstd(rows);
  ops_->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows,
                         cols, 1e-5f);
  ExpectNear(out, LayerNormRef(D(x), D(w), D(b), rows, cols, 1e-5), 1e-5, "out");
  std::vector<float> dx(rows * cols, 0.0f), dw(cols, 0.0f), db(cols, 0.0f);
  ops_->LayerNormBackward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), rows, cols);
  const Vec R = D(r);
  ExpectNear(
      dx,
      NumGrad(
          [&](const Vec& v) { return Dotted(LayerNormRef(v, D(w), D(b), rows, cols, 1e-5), R); },
          D(x)),
      1e-4, "dx");
  ExpectNear(
      dw,
      NumGrad(
          [&](const Vec& v) { return Dotted(LayerNormRef(D(x), v, D(b), rows, cols, 1e-5), R); },
          D(w)),
      1e-4, "dw");
  ExpectNear(
      db,
      NumGrad(
          [&](const Vec& v) { return Dotted(LayerNormRef(D(x), D(w), v, rows, cols, 1e-5), R); },
          D(b)),
      1e-4, "db");
}

// ---------------------------------------------------------------- GELU
Vec GeluRef(const Vec& x, bool tanh_approx) {
  Vec out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    out[i] = tanh_approx
                 ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))
                 : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  }
  return out;
}

TEST_F(OpsTest, GeluBothForms) {
  for (bool tanh_approx : {false, true}) {
    auto x = Rand(64, 9, 2.5f), r = Rand(64, 10);
    std::vector<float> out(64), dx(64);
    ops_->GeluForward(out.data(), x.data(), 64, tanh_approx);
    ExpectNear(out, GeluRef(D(x), tanh_approx), 1e-6, "gelu");
    ops_->GeluBackward(dx.data(), r.data(), x.data(), 64, tanh_approx);
    const Vec R = D(r);
    ExpectNear(dx, NumGrad([&](const Vec& v) { return Dotted(GeluRef(v, tanh_approx), R); }, D(x)),
               1e-5, "dgelu");
  }
  // The two forms differ (so --openai-gelu matters).
  std::vector<float> x = {1.0f}, a(1), b(1);
  ops_->GeluForward(a.data(), x.data(), 1, false);
  ops_->GeluForward(b.data(), x.data(), 1, true);
  EXPECT_NE(a[0], b[0]);
}

// ---------------------------------------------------------------- attention
Vec AttentionRef(const Vec& qkv, int B, int T, int H, int G, int Dh, const AttentionDropout& drop) {
  Vec out(B * T * H * Dh, 0.0);
  const int per = H / G, row = (H + 2 * G) * Dh;
  auto q_at = [&](int h) { return (h / per) * (per + 2) * Dh + (h % per) * Dh; };
  auto k_at = [&](int h) { return (h / per) * (per + 2) * Dh + per * Dh; };
  const double keep_scale = drop.p > 0 ? 1.0 / (1.0 - drop.p) : 1.0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        Vec s(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int c = 0; c < Dh; ++c)
            d += qkv[(b * T + i) * row + q_at(h) + c] * qkv[(b * T + j) * row + k_at(h) + c];
          s[j] = d / std::sqrt(static_cast<double>(Dh));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int j = 0; j <= i; ++j) {
          double p = s[j] / sum;
          if (drop.p > 0) {
            const int64_t idx = ((drop.head_offset + h) * T + i) * T + j;
            p *= DropoutUniform(drop.seed, drop.first_sample + b, idx) >= drop.p ? keep_scale : 0.0;
          }
          for (int c = 0; c < Dh; ++c)
            out[(b * T + i) * H * Dh + h * Dh + c] += p * qkv[(b * T + j) * row + k_at(h) + Dh + c];
        }
      }
  return out;
}

TEST_F(OpsTest, CausalAttentionWithAndWithoutDropoutAndGroups) {
  const int B = 2, T = 5, H = 4, Dh = 4;
  for (int G : {4, 2, 1}) {
    for (float p : {0.0f, 0.3f}) {
      AttentionDropout drop{p, 99, 10, 1, 5};
      auto qkv = Rand(B * T * (H + 2 * G) * Dh, 11), r = Rand(B * T * H * Dh, 12);
      std::vector<float> out(B * T * H * Dh), probs(B * H * T * T), dqkv(qkv.size());
      ops_->AttentionForward(out.data(), probs.data(), qkv.data(), B, T, H, G, Dh, drop);
      ExpectNear(out, AttentionRef(D(qkv), B, T, H, G, Dh, drop), 1e-5, "attention");
      ops_->AttentionBackward(dqkv.data(), r.data(), qkv.data(), probs.data(), B, T, H, G, Dh,
                              drop);
      const Vec R = D(r);
      ExpectNear(
          dqkv,
          NumGrad([&](const Vec& v) { return Dotted(AttentionRef(v, B, T, H, G, Dh, drop), R); },
                  D(qkv)),
          1e-4, "dqkv");
    }
  }
}

// ---------------------------------------------------------------- RMSNorm, SwiGLU, RoPE
TEST_F(OpsTest, RmsNormForwardAndBackward) {
  const int rows = 4, cols = 11;
  auto x = Rand(rows * cols, 31, 2.0f), w = Rand(cols, 32), r = Rand(rows * cols, 33);
  auto ref = [&](const Vec& xv, const Vec& wv) {
    Vec out(rows * cols);
    for (int i = 0; i < rows; ++i) {
      double ss = 0;
      for (int c = 0; c < cols; ++c) ss += xv[i * cols + c] * xv[i * cols + c];
      for (int c = 0; c < cols; ++c)
        out[i * cols + c] = xv[i * cols + c] / std::sqrt(ss / cols + 1e-5) * wv[c];
    }
    return out;
  };
  std::vector<float> out(rows * cols), rstd(rows), dx(rows * cols, 0.0f), dw(cols, 0.0f);
  ops_->RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), rows, cols, 1e-5f);
  ExpectNear(out, ref(D(x), D(w)), 1e-5, "rmsnorm");
  ops_->RmsNormBackward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), rows,
                        cols);
  const Vec R = D(r);
  ExpectNear(dx, NumGrad([&](const Vec& v) { return Dotted(ref(v, D(w)), R); }, D(x)), 1e-4, "dx");
  ExpectNear(dw, NumGrad([&](const Vec& v) { return Dotted(ref(D(x), v), R); }, D(w)), 1e-4, "dw");
}

TEST_F(OpsTest, SwigluForwardAndBackward) {
  const int rows = 3, width = 7;
  auto in = Rand(rows * 2 * width, 34, 2.0f), r = Rand(rows * width, 35);
  auto ref = [&](const Vec& x) {
    Vec out(rows * width);
    for (int i = 0; i < rows; ++i)
      for (int c = 0; c < width; ++c) {
        const double g = x[i * 2 * width + c], u = x[i * 2 * width + width + c];
        out[i * width + c] = g / (1 + std::exp(-g)) * u;
      }
    return out;
  };
  std::vector<float> out(rows * width), din(in.size());
  ops_->SwigluForward(out.data(), in.data(), rows, width);
  ExpectNear(out, ref(D(in)), 1e-6, "swiglu");
  ops_->SwigluBackward(din.data(), r.data(), in.data(), rows, width);
  const Vec R = D(r);
  ExpectNear(din, NumGrad([&](const Vec& v) { return Dotted(ref(v), R); }, D(in)), 1e-5, "din");
}

TEST_F(OpsTest, RopeRotatesQueriesAndKeysAndItsInverseIsTheBackward) {
  const int B = 2, T = 6, H = 4, G = 2, Dh = 8;
  const double base = 10000.0;
  auto qkv = Rand(B * T * (H + 2 * G) * Dh, 36);
  auto ref = [&](const Vec& x) {  // rotate-half on q of every head and k of every group
    Vec out = x;
    const int per = H / G, row = (H + 2 * G) * Dh;
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int g = 0; g < G; ++g)
          for (int slot = 0; slot <= per; ++slot) {  // per query heads, then the key
            const int off = (b * T + t) * row + g * (per + 2) * Dh + slot * Dh;
            for (int i = 0; i < Dh / 2; ++i) {
              const double a = t * std::pow(base, -2.0 * i / Dh);
              const double x1 = x[off + i], x2 = x[off + i + Dh / 2];
              out[off + i] = x1 * std::cos(a) - x2 * std::sin(a);
              out[off + i + Dh / 2] = x2 * std::cos(a) + x1 * std::sin(a);
            }
          }
    return out;
  };
  const std::vector<double> inv_freq = RopeInverseFrequencies(base, Dh, {});
  auto y = qkv;
  ops_->Rope(y.data(), B, T, H, G, Dh, inv_freq, false, nullptr, 0);
  ExpectNear(y, ref(D(qkv)), 1e-5, "rope");
  // The backward of a linear map is its transpose: <rope(x), r> == <x, rope⁻¹(r)>.
  auto r = Rand(qkv.size(), 37);
  auto back = r;
  ops_->Rope(back.data(), B, T, H, G, Dh, inv_freq, true, nullptr, 0);
  const Vec R = D(r);
  ExpectNear(back, NumGrad([&](const Vec& v) { return Dotted(ref(v), R); }, D(qkv)), 1e-5, "drope");
  // Rows at given positions (a CP rank's chunks, documents' restarted positions) rotate as the
  // rows at those positions: sample 1's rows of the whole rotation, in shuffled order.
  const int row = (H + 2 * G) * Dh;
  std::vector<int32_t> pos = {4, 0, 5, 2, 1, 3};
  std::vector<float> picked(T * row);
  for (int t = 0; t < T; ++t)
    std::copy(&qkv[(T + pos[t]) * row], &qkv[(T + pos[t] + 1) * row], &picked[t * row]);
  ops_->Rope(picked.data(), 1, T, H, G, Dh, inv_freq, false, pos.data(), T);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < row; ++c)
      ASSERT_EQ(picked[t * row + c], y[(T + pos[t]) * row + c]) << t << "," << c;
}

// ---------------------------------------------------------------- dropout
TEST_F(OpsTest, DropoutMaskDependsOnSampleAndPositionOnly) {
  const int rows = 8, cols = 16, seq = 4;
  HiddenDropout d{0.25f, 5, 100, seq, 0};
  std::vector<float> x(rows * cols, 1.0f);
  ops_->Dropout(x.data(), rows, cols, d);
  int dropped = 0;
  for (float v : x) {
    ASSERT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.75f) < 1e-6f);
    dropped += v == 0.0f;
  }
  EXPECT_GT(dropped, 10);
  EXPECT_LT(dropped, 55);
  // A shard of rows (sequence parallelism) sees the same mask as the whole.
  std::vector<float> shard(4 * cols, 1.0f);
  HiddenDropout ds = d;
  ds.row_offset = 4;
  ops_->Dropout(shard.data(), 4, cols, ds);
  for (int i = 0; i < 4 * cols; ++i) ASSERT_EQ(shard[i], x[4 * cols + i]);
  // A context-parallel rank's rows (its chunks of each sample; here the second half of SP's
  // rows) see the whole sample's mask at their positions: CP 2, rank 1 holds positions 1 and 2.
  std::vector<float> cp_rows(2 * cols, 1.0f);
  HiddenDropout dc = d;
  dc.cp_rank = 1;
  dc.cp_size = 2;
  dc.row_offset = 2;  // the second sample's two tokens
  ops_->Dropout(cp_rows.data(), 2, cols, dc);
  for (int t = 0; t < 2; ++t)
    for (int c = 0; c < cols; ++c)
      ASSERT_EQ(cp_rows[t * cols + c], x[(seq + 1 + t) * cols + c]) << t << "," << c;
  // p = 0 is the identity.
  std::vector<float> y(rows * cols, 2.0f);
  ops_->Dropout(y.data(), rows, cols, HiddenDropout{});
  for (float v : y) ASSERT_EQ(v, 2.0f);
}

// ---------------------------------------------------------------- embeddings
TEST_F(OpsTest, VocabShardedEmbeddingSumsToTheFullLookup) {
  const int V = 10, C = 3, rows = 6;
  auto table = Rand(V * C, 13), r = Rand(rows * C, 14);
  std::vector<int32_t> ids = {0, 9, 4, 5, 4, 7};
  std::vector<float> full(rows * C), a(rows * C), b(rows * C);
  ops_->EmbeddingForward(full.data(), ids.data(), table.data(), rows, C, 0, V);
  ops_->EmbeddingForward(a.data(), ids.data(), table.data(), rows, C, 0, 5);
  ops_->EmbeddingForward(b.data(), ids.data(), table.data() + 5 * C, rows, C, 5, V);
  for (int i = 0; i < rows * C; ++i) {
    ASSERT_EQ(full[i], table[ids[i / C] * C + i % C]);
    ASSERT_EQ(a[i] + b[i], full[i]);
  }
  auto ref = [&](const Vec& t) {
    Vec out(rows * C);
    for (int i = 0; i < rows * C; ++i) out[i] = t[ids[i / C] * C + i % C];
    return out;
  };
  std::vector<float> dtable(V * C, 0.0f);
  ops_->EmbeddingBackward(dtable.data(), r.data(), ids.data(), rows, C, 0, 5);
  ops_->EmbeddingBackward(dtable.data() + 5 * C, r.data(), ids.data(), rows, C, 5, V);
  const Vec R = D(r);
  ExpectNear(dtable, NumGrad([&](const Vec& t) { return Dotted(ref(t), R); }, D(table)), 1e-6,
             "dtable");

  std::vector<int32_t> pos = {0, 1, 2, 0, 1, 2};
  std::vector<float> out(rows * C, 1.0f), dpos(V * C, 0.0f);
  ops_->PositionForward(out.data(), pos.data(), table.data(), rows, C);
  for (int i = 0; i < rows * C; ++i) ASSERT_FLOAT_EQ(out[i], 1.0f + table[pos[i / C] * C + i % C]);
  ops_->PositionBackward(dpos.data(), r.data(), pos.data(), rows, C);
  for (int c = 0; c < C; ++c) ASSERT_NEAR(dpos[c], r[c] + r[3 * C + c], 1e-6);
}

// ---------------------------------------------------------------- cross-entropy
Vec CrossEntropyRef(const Vec& logits, const std::vector<int32_t>& t, int rows, int V) {
  Vec loss(rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    if (t[r] < 0) continue;
    double mx = -1e300, s = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[r * V + v]);
    for (int v = 0; v < V; ++v) s += std::exp(logits[r * V + v] - mx);
    loss[r] = mx + std::log(s) - logits[r * V + t[r]];
  }
  return loss;
}

TEST_F(OpsTest, CrossEntropyWholeAndVocabParallel) {
  const int rows = 5, V = 12;
  auto logits = Rand(rows * V, 15, 3.0f), dl = Rand(rows, 16);
  std::vector<int32_t> t = {3, 11, -1, 0, 6};
  std::vector<float> loss(rows), stats(2 * rows), dlogits(rows * V);
  ops_->CrossEntropyForward(loss.data(), stats.data(), logits.data(), t.data(), rows, V, 0, nullptr,
                            nullptr);
  const Vec want = CrossEntropyRef(D(logits), t, rows, V);
  ExpectNear(loss, want, 1e-6, "loss");
  ops_->CrossEntropyBackward(dlogits.data(), dl.data(), stats.data(), logits.data(), t.data(), rows,
                             V, 0);
  const Vec R = D(dl);
  const Vec grad =
      NumGrad([&](const Vec& x) { return Dotted(CrossEntropyRef(x, t, rows, V), R); }, D(logits));
  ExpectNear(dlogits, grad, 1e-5, "dlogits");

  // Two vocabulary shards in two threads, combined through the reduce hooks.
  const int half = V / 2;
  std::vector<std::vector<float>> shard(2, std::vector<float>(rows * half));
  for (int s = 0; s < 2; ++s)
    for (int r = 0; r < rows; ++r)
      for (int v = 0; v < half; ++v) shard[s][r * half + v] = logits[r * V + s * half + v];
  std::vector<float> exchange[2];
  std::barrier sync(2);
  auto reducer = [&](int me, bool is_max) {
    return [&, me, is_max](float* d, int64_t n) {
      exchange[me].assign(d, d + n);
      sync.arrive_and_wait();
      for (int64_t i = 0; i < n; ++i)
        d[i] = is_max ? std::max(exchange[0][i], exchange[1][i]) : exchange[0][i] + exchange[1][i];
      sync.arrive_and_wait();
    };
  };
  std::vector<float> sloss[2], sstats[2], sd[2];
  auto run = [&](int me) {
    auto ops = *CreateOps("cpu");
    sloss[me].resize(rows);
    sstats[me].resize(2 * rows);
    sd[me].resize(rows * half);
    ops->CrossEntropyForward(sloss[me].data(), sstats[me].data(), shard[me].data(), t.data(), rows,
                             half, me * half, reducer(me, true), reducer(me, false));
    ops->CrossEntropyBackward(sd[me].data(), dl.data(), sstats[me].data(), shard[me].data(),
                              t.data(), rows, half, me * half);
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  for (int me = 0; me < 2; ++me) {
    ExpectNear(sloss[me], want, 1e-6, "sharded loss");
    for (int r = 0; r < rows; ++r)
      for (int v = 0; v < half; ++v)
        ASSERT_NEAR(sd[me][r * half + v], grad[r * V + me * half + v], 1e-5);
  }
}

// ---------------------------------------------------------------- bias, norms, AdamW
TEST_F(OpsTest, BiasAndSumSquares) {
  auto out = Rand(12, 17), bias = Rand(4, 18);
  auto copy = out;
  ops_->AddBias(out.data(), bias.data(), 3, 4);
  for (int i = 0; i < 12; ++i) ASSERT_FLOAT_EQ(out[i], copy[i] + bias[i % 4]);
  std::vector<float> db(4, 1.0f);
  ops_->BiasBackward(db.data(), copy.data(), 3, 4);
  for (int c = 0; c < 4; ++c) ASSERT_NEAR(db[c], 1.0 + copy[c] + copy[4 + c] + copy[8 + c], 1e-6);
  double want = 0;
  for (float v : copy) want += static_cast<double>(v) * v;
  EXPECT_NEAR(ops_->SumSquares(copy.data(), copy.size()), want, 1e-9);
}

TEST_F(OpsTest, AdamWMatchesTheFloat64Formula) {
  const int n = 50;
  auto p = Rand(n, 19), m = std::vector<float>(n, 0.0f), v = std::vector<float>(n, 0.0f);
  Vec P = D(p), M(n, 0.0), V2(n, 0.0);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  std::vector<uint16_t> low(n, 0xFFFF);
  for (int step = 1; step <= 5; ++step) {
    auto g = Rand(n, 100 + step);
    // The gradient enters times grad_scale (averaging, clipping); steps 2 and 4 also write bf16.
    const double scale = step % 2 == 0 ? 0.375 : 1.0;
    ops_->AdamWStep(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, step,
                    static_cast<float>(scale), step % 2 == 0 ? low.data() : nullptr);
    if (step % 2 == 0) {
      for (int i = 0; i < n; ++i) ASSERT_EQ(low[i], ckpt::FloatToBFloat16(p[i])) << i;
      std::fill(low.begin(), low.end(), 0xFFFF);
    }
    for (int i = 0; i < n; ++i) {
      const double gs = g[i] * scale;
      M[i] = b1 * M[i] + (1 - b1) * gs;
      V2[i] = b2 * V2[i] + (1 - b2) * gs * gs;
      const double mh = M[i] / (1 - std::pow(b1, step)), vh = V2[i] / (1 - std::pow(b2, step));
      P[i] = P[i] * (1 - lr * wd) - lr * mh / (std::sqrt(vh) + eps);
    }
  }
  ExpectNear(p, P, 1e-5, "param");
  ExpectNear(m, M, 1e-6, "exp_avg");
}

}  // namespace
}  // namespace leantron::trainer
