// The block attention ops context parallelism and document masks are built on, against a float64
// attention over the whole sample written here: one block with shuffled positions and documents;
// ring attention's log-sum-exp merge of every CP rank's blocks (Megatron's load-balanced chunks)
// giving the whole output and log-sum-exp; and the blocks' gradients summed over the ring giving
// the central differences of the float64 attention, with dropout, query groups and documents.
#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/core/context_parallel.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {
namespace {

using Vec = std::vector<double>;

std::vector<float> Rand(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Shape {
  int B, T, H, G, D;
  int per() const { return H / G; }
  int row() const { return (H + 2 * G) * D; }
  int q(int h) const { return (h / per()) * (per() + 2) * D + (h % per()) * D; }
  int k(int g) const { return g * (per() + 2) * D + per() * D; }
};

// Causal attention of whole samples qkv [B, T, row] (positions 0..T-1) in float64: out
// [B, T, H·D] and lse [B, H, T]; keys of another document (docs [B, T], may be empty) unseen.
void Attention64(const Vec& qkv, const Shape& s, const std::vector<int32_t>& docs,
                 const AttentionDropout& drop, Vec* out, Vec* lse) {
  out->assign(static_cast<size_t>(s.B) * s.T * s.H * s.D, 0.0);
  lse->assign(static_cast<size_t>(s.B) * s.H * s.T, 0.0);
  const double keep = drop.p > 0 ? 1.0 / (1.0 - drop.p) : 1.0;
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h)
      for (int i = 0; i < s.T; ++i) {
        Vec sc(s.T, -INFINITY);
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          if (!docs.empty() && docs[b * s.T + j] != docs[b * s.T + i]) continue;
          double dot = 0;
          for (int c = 0; c < s.D; ++c)
            dot += qkv[(b * s.T + i) * s.row() + s.q(h) + c] *
                   qkv[(b * s.T + j) * s.row() + s.k(h / s.per()) + c];
          sc[j] = dot / std::sqrt(static_cast<double>(s.D));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j)
          if (sc[j] > -INFINITY) sum += std::exp(sc[j] - mx);
        (*lse)[(b * s.H + h) * s.T + i] = mx + std::log(sum);
        for (int j = 0; j <= i; ++j) {
          if (sc[j] == -INFINITY) continue;
          double p = std::exp(sc[j] - mx) / sum;
          if (drop.p > 0) {
            const int64_t idx = ((drop.head_offset + h) * s.T + i) * s.T + j;
            p *= DropoutUniform(drop.seed, drop.first_sample + b, idx) >= drop.p ? keep : 0.0;
          }
          for (int c = 0; c < s.D; ++c)
            (*out)[(b * s.T + i) * s.H * s.D + h * s.D + c] +=
                p * qkv[(b * s.T + j) * s.row() + s.k(h / s.per()) + s.D + c];
        }
      }
}

// Rows `pos` of every sample of a [B, T, width] tensor.
std::vector<float> Rows(const std::vector<float>& x, const Shape& s, int width,
                        const std::vector<int32_t>& pos) {
  std::vector<float> r;
  for (int b = 0; b < s.B; ++b)
    for (int p : pos) r.insert(r.end(), &x[(b * s.T + p) * width], &x[(b * s.T + p + 1) * width]);
  return r;
}
// The key and value heads of qkv rows `pos`: [B, pos, G·2·D].
std::vector<float> KeysValues(const std::vector<float>& qkv, const Shape& s,
                              const std::vector<int32_t>& pos) {
  std::vector<float> kv;
  for (int b = 0; b < s.B; ++b)
    for (int p : pos)
      for (int g = 0; g < s.G; ++g) {
        const float* k = &qkv[(b * s.T + p) * s.row() + s.k(g)];
        kv.insert(kv.end(), k, k + 2 * s.D);
      }
  return kv;
}

class BlockAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override { ops_ = *CreateOps("cpu"); }
  std::unique_ptr<Ops> ops_;
};

// Documents of two samples: breaks at different places (each token's document index).
std::vector<int32_t> TwoSampleDocuments(int T) {
  std::vector<int32_t> docs(2 * T);
  for (int t = 0; t < T; ++t) {
    docs[t] = t < 3 ? 0 : (t < T - 2 ? 1 : 2);
    docs[T + t] = t < T / 2 ? 0 : 1;
  }
  return docs;
}

TEST_F(BlockAttentionTest, OneBlockOfShuffledPositionsIsTheWholeAttention) {
  const Shape s{2, 8, 4, 2, 4};
  std::vector<int32_t> pos(s.T);
  for (int t = 0; t < s.T; ++t) pos[t] = t;
  std::shuffle(pos.begin(), pos.end(), std::mt19937(3));
  for (bool with_docs : {false, true}) {
    for (float p : {0.0f, 0.25f}) {
      const std::vector<int32_t> docs =
          with_docs ? TwoSampleDocuments(s.T) : std::vector<int32_t>{};
      const AttentionDropout drop{p, 77, 5, 2, 8};
      const std::vector<float> qkv = Rand(s.B * s.T * s.row(), 1);
      Vec want, want_lse;
      Attention64(Vec(qkv.begin(), qkv.end()), s, docs, drop, &want, &want_lse);
      // The block holds the rows in shuffled order, queries and keys alike.
      const std::vector<float> q = Rows(qkv, s, s.row(), pos), kv = KeysValues(qkv, s, pos);
      BlockAttentionArgs a{s.B, s.T, s.T,        s.H,        s.G,
                           s.D, s.T, pos.data(), pos.data(), with_docs ? docs.data() : nullptr};
      std::vector<float> out(s.B * s.T * s.H * s.D), lse(s.B * s.H * s.T);
      ops_->BlockAttentionForward(out.data(), lse.data(), q.data(), kv.data(), a, drop, false);
      for (int b = 0; b < s.B; ++b)
        for (int i = 0; i < s.T; ++i)
          for (int e = 0; e < s.H * s.D; ++e)
            ASSERT_NEAR(out[(b * s.T + i) * s.H * s.D + e],
                        want[(b * s.T + pos[i]) * s.H * s.D + e], 2e-6)
                << "docs " << with_docs << " p " << p;
      for (int b = 0; b < s.B; ++b)
        for (int h = 0; h < s.H; ++h)
          for (int i = 0; i < s.T; ++i)
            ASSERT_NEAR(lse[(b * s.H + h) * s.T + i], want_lse[(b * s.H + h) * s.T + pos[i]], 2e-6);
    }
  }
}

// Every CP rank's queries against every rank's K/V block, merged in ring order (own block first,
// then rank−1, rank−2, ...), then the blocks' gradients: out and lse are the whole attention's and
// the gradients summed over the ring are the float64 attention's central differences.
void RingCase(Ops& ops, const Shape& s, int cp, bool with_docs, float p) {
  const std::vector<int32_t> docs = with_docs ? TwoSampleDocuments(s.T) : std::vector<int32_t>{};
  const AttentionDropout drop{p, 41, 3, 1, 6};
  std::vector<std::vector<int32_t>> pos(cp);
  for (int r = 0; r < cp; ++r) {
    const SequenceChunks chunks{s.T, r, cp};
    for (int t = 0; t < chunks.local_length(); ++t)
      pos[r].push_back(static_cast<int32_t>(chunks.Position(t)));
  }
  const int tl = s.T / cp;
  const std::vector<float> qkv = Rand(s.B * s.T * s.row(), 7),
                           dout = Rand(s.B * s.T * s.H * s.D, 8);
  const Vec qkv64(qkv.begin(), qkv.end());
  Vec want, want_lse;
  Attention64(qkv64, s, docs, drop, &want, &want_lse);

  std::vector<std::vector<float>> kv(cp), out(cp), lse(cp), q(cp), dy(cp);
  for (int r = 0; r < cp; ++r) {
    kv[r] = KeysValues(qkv, s, pos[r]);
    q[r] = Rows(qkv, s, s.row(), pos[r]);
    dy[r] = Rows(dout, s, s.H * s.D, pos[r]);
  }
  auto args = [&](int r, int src) {
    return BlockAttentionArgs{s.B,
                              tl,
                              tl,
                              s.H,
                              s.G,
                              s.D,
                              s.T,
                              pos[r].data(),
                              pos[src].data(),
                              with_docs ? docs.data() : nullptr};
  };
  for (int r = 0; r < cp; ++r) {
    out[r].assign(s.B * tl * s.H * s.D, 0.0f);
    lse[r].assign(s.B * s.H * tl, 0.0f);
    for (int step = 0; step < cp; ++step) {
      const int src = (r - step + cp) % cp;
      ops.BlockAttentionForward(out[r].data(), lse[r].data(), q[r].data(), kv[src].data(),
                                args(r, src), drop, step > 0);
    }
    for (int b = 0; b < s.B; ++b)
      for (int i = 0; i < tl; ++i) {
        for (int e = 0; e < s.H * s.D; ++e)
          ASSERT_NEAR(out[r][(b * tl + i) * s.H * s.D + e],
                      want[(b * s.T + pos[r][i]) * s.H * s.D + e], 2e-6)
              << "cp " << cp << " rank " << r << " docs " << with_docs << " p " << p;
        for (int h = 0; h < s.H; ++h)
          ASSERT_NEAR(lse[r][(b * s.H + h) * tl + i], want_lse[(b * s.H + h) * s.T + pos[r][i]],
                      2e-6);
      }
  }

  // Backward: dq stays with its rank, dk/dv of block src accumulate over every rank's queries.
  std::vector<std::vector<float>> dq(cp), dkv(cp);
  for (int r = 0; r < cp; ++r) {
    dq[r].assign(q[r].size(), 0.0f);
    dkv[r].assign(kv[r].size(), 0.0f);
  }
  for (int r = 0; r < cp; ++r)
    for (int step = 0; step < cp; ++step) {
      const int src = (r - step + cp) % cp;
      ops.BlockAttentionBackward(dq[r].data(), dkv[src].data(), dy[r].data(), out[r].data(),
                                 lse[r].data(), q[r].data(), kv[src].data(), args(r, src), drop);
    }
  // Scatter into a whole-sample dqkv and compare with d/dqkv Σ out·dout in float64.
  std::vector<float> got(qkv.size(), 0.0f);
  for (int r = 0; r < cp; ++r)
    for (int b = 0; b < s.B; ++b)
      for (int i = 0; i < tl; ++i) {
        float* row = &got[(b * s.T + pos[r][i]) * s.row()];
        const float* dqr = &dq[r][(b * tl + i) * s.row()];
        for (int h = 0; h < s.H; ++h)
          for (int c = 0; c < s.D; ++c) row[s.q(h) + c] = dqr[s.q(h) + c];
        for (int g = 0; g < s.G; ++g)
          for (int c = 0; c < 2 * s.D; ++c)
            row[s.k(g) + c] = dkv[r][((b * tl + i) * s.G + g) * 2 * s.D + c];
      }
  auto objective = [&](const Vec& x) {
    Vec o, l;
    Attention64(x, s, docs, drop, &o, &l);
    double sum = 0;
    for (size_t i = 0; i < o.size(); ++i) sum += o[i] * dout[i];
    return sum;
  };
  Vec x = qkv64;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i], eps = 1e-6;
    x[i] = keep + eps;
    const double up = objective(x);
    x[i] = keep - eps;
    const double down = objective(x);
    x[i] = keep;
    const double want_grad = (up - down) / (2 * eps);
    ASSERT_NEAR(got[i], want_grad, 1e-4 * (1 + std::abs(want_grad)))
        << "dqkv[" << i << "] cp " << cp << " docs " << with_docs << " p " << p;
  }
}

TEST_F(BlockAttentionTest, RingMergeOfLoadBalancedChunksIsTheWholeAttention) {
  for (int cp : {2, 4})
    for (bool docs : {false, true})
      for (float p : {0.0f, 0.3f}) RingCase(*ops_, Shape{2, 16, 4, 2, 4}, cp, docs, p);
  RingCase(*ops_, Shape{1, 8, 2, 2, 8}, 2, false, 0.0f);  // multi-head, wider heads
}

TEST_F(BlockAttentionTest, BlockThatShowsNoKeyLeavesTheMergedResultAlone) {
  // Queries at positions 0..3 against keys at 4..7: nothing visible.
  const Shape s{1, 8, 2, 1, 4};
  std::vector<int32_t> qpos = {0, 1, 2, 3}, kpos = {4, 5, 6, 7};
  const std::vector<float> q = Rand(4 * s.row(), 5), kv = Rand(4 * 2 * s.D, 6);
  BlockAttentionArgs a{1, 4, 4, s.H, s.G, s.D, s.T, qpos.data(), kpos.data(), nullptr};
  std::vector<float> out(4 * s.H * s.D, 7.0f), lse(s.H * 4, 1.5f);
  ops_->BlockAttentionForward(out.data(), lse.data(), q.data(), kv.data(), a, {}, true);
  for (float v : out) EXPECT_EQ(v, 7.0f);
  for (float v : lse) EXPECT_EQ(v, 1.5f);
  ops_->BlockAttentionForward(out.data(), lse.data(), q.data(), kv.data(), a, {}, false);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  for (float v : lse) EXPECT_EQ(v, -INFINITY);
}

TEST_F(BlockAttentionTest, Copy2DCopiesAStridedBlock) {
  std::vector<float> src(30), dst(40, -1.0f);
  for (int i = 0; i < 30; ++i) src[i] = static_cast<float>(i);
  ops_->Copy2D(dst.data() + 1, 8, src.data() + 2, 6, 4, 3);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 8; ++c) {
      const bool in = r < 4 && c >= 1 && c < 4;
      EXPECT_EQ(dst[r * 8 + c], in ? src[r * 6 + 2 + c - 1] : -1.0f) << r << "," << c;
    }
}

}  // namespace
}  // namespace leantron::trainer
