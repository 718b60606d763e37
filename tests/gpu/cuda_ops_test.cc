// The cuda backend of Ops against the cpu reference: every method of CudaOps on fresh random
// inputs of awkward sizes, GPU outputs poisoned with NaN first so a skipped element fails.
#include "libckpt/layout.h"
#include "tests/gpu/gpu_test_util.h"
#include "trainer/core/layer_spec.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/params.h"
#include "trainer/cuda/kernels/kernels.h"

namespace leantron::trainer::cuda {
namespace {

using namespace testutil;

// ================================================================ CudaOps vs CpuOps

class CudaOpsTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    auto gpu = CreateOps("cuda");
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
  }
  void TearDown() override {
    if (gpu_ == nullptr) return;
    for (void* p : owned_) gpu_->FreeBytes(p);
  }
  // Device copy of host data through the backend's own transfers.
  template <typename U>
  U* Up(const std::vector<U>& h) {
    void* p = gpu_->AllocBytes(h.size() * sizeof(U));
    gpu_->CopyFromHost(p, h.data(), h.size() * sizeof(U));
    owned_.push_back(p);
    return static_cast<U*>(p);
  }
  float* Poisoned(size_t n) { return Up(std::vector<float>(n, kNaN)); }
  std::vector<float> Down(const float* p, size_t n) {
    std::vector<float> h(n);
    gpu_->CopyToHost(h.data(), p, n * sizeof(float));
    return h;
  }

  std::unique_ptr<Ops> gpu_;
  std::vector<void*> owned_;
};

TEST_F(CudaOpsTest, MemoryAndTransfers) {
  EXPECT_EQ(gpu_->name(), "cuda");
  const size_t n = 100003;
  float* a = gpu_->Alloc(n);
  EXPECT_TRUE(Close(Down(a, n), std::vector<float>(n, 0.0f), 0, 0)) << "Alloc is zero-filled";
  void* bytes = gpu_->AllocBytes(77);
  std::vector<uint8_t> hb(77, 1);
  gpu_->CopyToHost(hb.data(), bytes, 77);
  EXPECT_EQ(hb, std::vector<uint8_t>(77, 0)) << "AllocBytes is zero-filled";
  gpu_->FreeBytes(bytes);

  const auto x = Rand(n, 1);
  gpu_->CopyFromHost(a, x.data(), n * sizeof(float));
  EXPECT_TRUE(Close(Down(a, n), x, 0, 0));
  float* b = Poisoned(n);
  gpu_->Copy(b, a, n);
  EXPECT_TRUE(Close(Down(b, n), x, 0, 0));
  gpu_->Zero(b + 1, n - 2);
  auto hz = Down(b, n);
  EXPECT_EQ(hz[0], x[0]);
  EXPECT_EQ(hz[n - 1], x[n - 1]);
  for (size_t i = 1; i + 1 < n; ++i) ASSERT_EQ(hz[i], 0.0f) << i;
  gpu_->Free(a);
}

TEST_F(CudaOpsTest, AddInPlace) {
  for (size_t n : {size_t{1}, size_t{7}, size_t{100003}}) {
    for (int offset : {0, 1}) {  // 1: misaligned, element-wise path
      auto x = Rand(n + 1, 2), y = Rand(n + 1, 3);
      float* dx = Up(x);
      float* dy = Up(y);
      gpu_->AddInPlace(dx + offset, dy + offset, n);
      cpu_->AddInPlace(x.data() + offset, y.data() + offset, n);
      EXPECT_TRUE(Close(Down(dx, n + 1), x, 1e-6)) << "AddInPlace n=" << n << " offset " << offset;
    }
  }
}

TEST_F(CudaOpsTest, AddBiasAndBiasBackward) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 129}, {1000, 1280}, {1000, 1283}}) {
    auto out = Rand(rows * cols, 4), bias = Rand(cols, 5);
    float* d_out = Up(out);
    gpu_->AddBias(d_out, Up(bias), rows, cols);
    cpu_->AddBias(out.data(), bias.data(), rows, cols);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-6)) << rows << "x" << cols;

    auto dout = Rand(rows * cols, 6), dbias = Rand(cols, 7);
    float* d_dbias = Up(dbias);
    gpu_->BiasBackward(d_dbias, Up(dout), rows, cols);
    cpu_->BiasBackward(dbias.data(), dout.data(), rows, cols);
    EXPECT_TRUE(Close(Down(d_dbias, cols), dbias, 1e-5)) << rows << "x" << cols;
  }
}

TEST_F(CudaOpsTest, Linear) {
  struct Shape {
    int64_t m, k, n;
  };
  for (const Shape& s : {Shape{37, 129, 65}, Shape{200, 1283, 515}, Shape{64, 256, 1280}}) {
    for (bool with_bias : {true, false}) {
      const auto in = Rand(s.m * s.k, 8), w = Rand(s.n * s.k, 9, 0.05f), b = Rand(s.n, 10);
      std::vector<float> out(s.m * s.n);
      float* d_out = Poisoned(out.size());
      float* d_in = Up(in);
      float* d_w = Up(w);
      gpu_->LinearForward(d_out, d_in, d_w, with_bias ? Up(b) : nullptr, s.m, s.k, s.n);
      cpu_->LinearForward(out.data(), in.data(), w.data(), with_bias ? b.data() : nullptr, s.m, s.k,
                          s.n);
      EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "forward m=" << s.m;

      for (int mode = 0; mode < 3; ++mode) {  // din overwritten, accumulated, skipped
        const bool accumulate = mode == 1;
        const auto dout = Rand(s.m * s.n, 11);
        auto din = mode == 1 ? Rand(s.m * s.k, 12) : std::vector<float>(s.m * s.k, 0.0f);
        auto dw = Rand(s.n * s.k, 13), db = Rand(s.n, 14);
        float* d_din = mode == 2 ? nullptr : (mode == 1 ? Up(din) : Poisoned(din.size()));
        float* d_dw = Up(dw);
        float* d_db = with_bias ? Up(db) : nullptr;
        gpu_->LinearBackward(d_din, d_dw, d_db, Up(dout), d_in, d_w, s.m, s.k, s.n, accumulate);
        cpu_->LinearBackward(mode == 2 ? nullptr : din.data(), dw.data(),
                             with_bias ? db.data() : nullptr, dout.data(), in.data(), w.data(), s.m,
                             s.k, s.n, accumulate);
        if (mode != 2) {
          EXPECT_TRUE(Close(Down(d_din, din.size()), din, 1e-5)) << "din mode " << mode;
        }
        EXPECT_TRUE(Close(Down(d_dw, dw.size()), dw, 1e-5)) << "dweight mode " << mode;
        if (with_bias) {
          EXPECT_TRUE(Close(Down(d_db, db.size()), db, 1e-5)) << "dbias";
        }
      }
    }
  }
}

// Row shapes that reach every norm path: unaligned (loop), cached with 1/2/4/8 vectors per
// thread, and rows longer than the backward's register cache.
const std::vector<std::pair<int64_t, int64_t>> kNormShapes = {
    {37, 129}, {1000, 1280}, {1000, 1283}, {3000, 64}, {16, 5120}, {8, 10240}, {3, 40000}};

TEST_F(CudaOpsTest, LayerNorm) {
  for (auto [rows, cols] : kNormShapes) {
    SCOPED_TRACE(testing::Message() << rows << "x" << cols);
    const auto in = Rand(rows * cols, 20, 2.0f, 0.5f), w = Rand(cols, 21, 1.0f, 1.0f),
               b = Rand(cols, 22);
    std::vector<float> out(rows * cols), mean(rows), rstd(rows);
    float* d_out = Poisoned(out.size());
    float* d_mean = Poisoned(rows);
    float* d_rstd = Poisoned(rows);
    float* d_in = Up(in);
    float* d_w = Up(w);
    gpu_->LayerNormForward(d_out, d_mean, d_rstd, d_in, d_w, Up(b), rows, cols, 1e-5f);
    cpu_->LayerNormForward(out.data(), mean.data(), rstd.data(), in.data(), w.data(), b.data(),
                           rows, cols, 1e-5f);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "out";
    EXPECT_TRUE(Close(Down(d_mean, rows), mean, 1e-5)) << "mean";
    EXPECT_TRUE(Close(Down(d_rstd, rows), rstd, 1e-5)) << "rstd";

    const auto dout = Rand(rows * cols, 23);
    auto din = Rand(rows * cols, 24), dw = Rand(cols, 25), db = Rand(cols, 26);
    float* d_din = Up(din);
    float* d_dw = Up(dw);
    float* d_db = Up(db);
    gpu_->LayerNormBackward(d_din, d_dw, d_db, Up(dout), d_in, d_w, Up(mean), Up(rstd), rows, cols);
    cpu_->LayerNormBackward(din.data(), dw.data(), db.data(), dout.data(), in.data(), w.data(),
                            mean.data(), rstd.data(), rows, cols);
    EXPECT_TRUE(Close(Down(d_din, din.size()), din, 1e-5)) << "din";
    EXPECT_TRUE(Close(Down(d_dw, cols), dw, 1e-5)) << "dweight";
    EXPECT_TRUE(Close(Down(d_db, cols), db, 1e-5)) << "dbias";
  }
}

TEST_F(CudaOpsTest, RmsNorm) {
  for (auto [rows, cols] : kNormShapes) {
    SCOPED_TRACE(testing::Message() << rows << "x" << cols);
    const auto in = Rand(rows * cols, 30, 2.0f, 0.5f), w = Rand(cols, 31, 1.0f, 1.0f);
    std::vector<float> out(rows * cols), rstd(rows);
    float* d_out = Poisoned(out.size());
    float* d_rstd = Poisoned(rows);
    float* d_in = Up(in);
    float* d_w = Up(w);
    gpu_->RmsNormForward(d_out, d_rstd, d_in, d_w, rows, cols, 1e-6f);
    cpu_->RmsNormForward(out.data(), rstd.data(), in.data(), w.data(), rows, cols, 1e-6f);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "out";
    EXPECT_TRUE(Close(Down(d_rstd, rows), rstd, 1e-5)) << "rstd";

    const auto dout = Rand(rows * cols, 32);
    auto din = Rand(rows * cols, 33), dw = Rand(cols, 34);
    float* d_din = Up(din);
    float* d_dw = Up(dw);
    gpu_->RmsNormBackward(d_din, d_dw, Up(dout), d_in, d_w, Up(rstd), rows, cols);
    cpu_->RmsNormBackward(din.data(), dw.data(), dout.data(), in.data(), w.data(), rstd.data(),
                          rows, cols);
    EXPECT_TRUE(Close(Down(d_din, din.size()), din, 1e-5)) << "din";
    EXPECT_TRUE(Close(Down(d_dw, cols), dw, 1e-5)) << "dweight";
  }
}

TEST_F(CudaOpsTest, Swiglu) {
  for (auto [rows, width] : {std::pair<int64_t, int64_t>{37, 129}, {100, 1280}, {64, 1283}}) {
    const auto in = Rand(rows * 2 * width, 40, 2.0f), dout = Rand(rows * width, 41);
    std::vector<float> out(rows * width), din(rows * 2 * width);
    float* d_out = Poisoned(out.size());
    float* d_din = Poisoned(din.size());
    float* d_in = Up(in);
    gpu_->SwigluForward(d_out, d_in, rows, width);
    cpu_->SwigluForward(out.data(), in.data(), rows, width);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "forward width " << width;
    gpu_->SwigluBackward(d_din, Up(dout), d_in, rows, width);
    cpu_->SwigluBackward(din.data(), dout.data(), in.data(), rows, width);
    EXPECT_TRUE(Close(Down(d_din, din.size()), din, 1e-5)) << "backward width " << width;
  }
}

TEST_F(CudaOpsTest, Rope) {
  struct Case {
    int64_t batch, seq, heads, groups, dim;
  };
  ckpt::RopeScaling llama3;
  llama3.llama3 = true;
  llama3.original_max_position_embeddings = 64;
  for (const Case& c : {Case{2, 37, 4, 4, 16}, Case{2, 37, 4, 2, 16}, Case{1, 300, 8, 1, 64}}) {
    for (bool inverse : {false, true}) {
      const std::vector<double> f =
          RopeInverseFrequencies(10000.0, c.dim, c.dim == 64 ? llama3 : ckpt::RopeScaling{});
      auto qkv = Rand(c.batch * c.seq * (c.heads + 2 * c.groups) * c.dim, 50);
      float* d = Up(qkv);
      gpu_->Rope(d, c.batch, c.seq, c.heads, c.groups, c.dim, f, inverse, nullptr, 0);
      cpu_->Rope(qkv.data(), c.batch, c.seq, c.heads, c.groups, c.dim, f, inverse, nullptr, 0);
      EXPECT_TRUE(Close(Down(d, qkv.size()), qkv, 1e-5))
          << "groups " << c.groups << " inverse " << inverse;
      // Rows at given positions (a CP rank's chunks, documents restarting): below 3·seq.
      std::vector<int32_t> pos(c.batch * c.seq);
      for (size_t r = 0; r < pos.size(); ++r)
        pos[r] = static_cast<int32_t>((r * 7 + 3) % (3 * c.seq));
      float* dp = Up(qkv);
      gpu_->Rope(dp, c.batch, c.seq, c.heads, c.groups, c.dim, f, inverse, Up(pos), 3 * c.seq);
      cpu_->Rope(qkv.data(), c.batch, c.seq, c.heads, c.groups, c.dim, f, inverse, pos.data(),
                 3 * c.seq);
      EXPECT_TRUE(Close(Down(dp, qkv.size()), qkv, 1e-5))
          << "positions, groups " << c.groups << " inverse " << inverse;
    }
  }
}

TEST_F(CudaOpsTest, Gelu) {
  for (size_t n : {size_t{5}, size_t{100003}}) {
    for (bool tanh_approx : {false, true}) {
      const auto in = Rand(n, 60, 3.0f), dout = Rand(n, 61);
      std::vector<float> out(n), din(n);
      float* d_out = Poisoned(n);
      float* d_in = Up(in);
      gpu_->GeluForward(d_out, d_in, n, tanh_approx);
      cpu_->GeluForward(out.data(), in.data(), n, tanh_approx);
      EXPECT_TRUE(Close(Down(d_out, n), out, 1e-5)) << "forward tanh " << tanh_approx;
      float* d_din = Up(dout);  // din aliases dout
      gpu_->GeluBackward(d_din, d_din, d_in, n, tanh_approx);
      cpu_->GeluBackward(din.data(), dout.data(), in.data(), n, tanh_approx);
      EXPECT_TRUE(Close(Down(d_din, n), din, 1e-5)) << "backward tanh " << tanh_approx;
    }
  }
}

TEST_F(CudaOpsTest, Attention) {
  struct Case {
    int64_t batch, seq, heads, groups, dim;
    float p;
  };
  for (const Case& c : {Case{2, 37, 4, 4, 16, 0.0f}, Case{2, 37, 4, 2, 16, 0.1f},
                        Case{1, 70, 6, 1, 24, 0.2f}, Case{3, 1, 2, 2, 8, 0.0f}}) {
    SCOPED_TRACE(testing::Message() << "groups " << c.groups << " p " << c.p);
    AttentionDropout drop;
    drop.p = c.p;
    drop.seed = 0x1234567;
    drop.first_sample = 5;
    drop.head_offset = 2;
    drop.total_heads = c.heads + 2;
    const int64_t row = (c.heads + 2 * c.groups) * c.dim;
    const auto qkv = Rand(c.batch * c.seq * row, 70);
    std::vector<float> out(c.batch * c.seq * c.heads * c.dim),
        probs(c.batch * c.heads * c.seq * c.seq);
    float* d_out = Poisoned(out.size());
    float* d_probs = Poisoned(probs.size());
    float* d_qkv = Up(qkv);
    gpu_->AttentionForward(d_out, d_probs, d_qkv, c.batch, c.seq, c.heads, c.groups, c.dim, drop);
    cpu_->AttentionForward(out.data(), probs.data(), qkv.data(), c.batch, c.seq, c.heads, c.groups,
                           c.dim, drop);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "out";
    EXPECT_TRUE(Close(Down(d_probs, probs.size()), probs, 1e-5)) << "probs";

    const auto dout = Rand(out.size(), 71);
    std::vector<float> dqkv(qkv.size());
    float* d_dqkv = Poisoned(dqkv.size());
    gpu_->AttentionBackward(d_dqkv, Up(dout), d_qkv, Up(probs), c.batch, c.seq, c.heads, c.groups,
                            c.dim, drop);
    cpu_->AttentionBackward(dqkv.data(), dout.data(), qkv.data(), probs.data(), c.batch, c.seq,
                            c.heads, c.groups, c.dim, drop);
    EXPECT_TRUE(Close(Down(d_dqkv, dqkv.size()), dqkv, 1e-5)) << "dqkv";
  }
}

// Context parallelism's and document masks' attention: a CP rank's queries against two K/V
// blocks merged by log-sum-exp, then both blocks' gradients; the float32 kernels against CpuOps.
TEST_F(CudaOpsTest, BlockAttention) {
  struct Case {
    int64_t batch, seq, heads, groups, dim;
    float p;
    bool documents;
  };
  for (const Case& c : {Case{2, 16, 4, 2, 16, 0.0f, false}, Case{2, 24, 4, 4, 8, 0.1f, true},
                        Case{1, 64, 6, 1, 24, 0.2f, true}}) {
    SCOPED_TRACE(testing::Message()
                 << "groups " << c.groups << " p " << c.p << " docs " << c.documents);
    AttentionDropout drop{c.p, 0x1234567, 5, 2, c.heads + 2};
    const int cp = 2;
    std::vector<std::vector<int32_t>> pos(cp);
    for (int r = 0; r < cp; ++r)
      for (int64_t t = 0; t < c.seq / cp; ++t)
        pos[r].push_back(static_cast<int32_t>(ChunkTokenPosition(t, c.seq, r, cp)));
    std::vector<int32_t> docs(c.batch * c.seq);
    for (size_t i = 0; i < docs.size(); ++i) docs[i] = static_cast<int32_t>((i % c.seq) / 5);
    const int64_t tl = c.seq / cp, row = (c.heads + 2 * c.groups) * c.dim;
    const int64_t kv_row = 2 * c.groups * c.dim, out_row = c.heads * c.dim;
    const auto qkv = Rand(c.batch * tl * row, 72), dout = Rand(c.batch * tl * out_row, 73);
    const std::vector<std::vector<float>> kv = {Rand(c.batch * tl * kv_row, 74),
                                                Rand(c.batch * tl * kv_row, 75)};
    int32_t* d_docs = Up(docs);
    auto args = [&](const int32_t* qp, const int32_t* kp, const int32_t* dd) {
      return BlockAttentionArgs{c.batch, tl,    tl, c.heads, c.groups,
                                c.dim,   c.seq, qp, kp,      c.documents ? dd : nullptr};
    };
    std::vector<float> out(c.batch * tl * out_row), lse(c.batch * c.heads * tl);
    float* d_out = Poisoned(out.size());
    float* d_lse = Poisoned(lse.size());
    float* d_qkv = Up(qkv);
    for (int step = 0; step < cp; ++step) {
      const int src = (1 - step + cp) % cp;  // rank 1's order: its own block, then rank 0's
      gpu_->BlockAttentionForward(d_out, d_lse, d_qkv, Up(kv[src]),
                                  args(Up(pos[1]), Up(pos[src]), d_docs), drop, step > 0);
      cpu_->BlockAttentionForward(out.data(), lse.data(), qkv.data(), kv[src].data(),
                                  args(pos[1].data(), pos[src].data(), docs.data()), drop,
                                  step > 0);
    }
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 1e-5)) << "out";
    EXPECT_TRUE(Close(Down(d_lse, lse.size()), lse, 1e-5)) << "lse";
    for (int src = 0; src < cp; ++src) {
      std::vector<float> dqkv(qkv.size(), 0.5f), dkv(kv[src].size(), -0.25f);
      float* d_dqkv = Up(dqkv);
      float* d_dkv = Up(dkv);
      gpu_->BlockAttentionBackward(d_dqkv, d_dkv, Up(dout), Up(out), Up(lse), d_qkv, Up(kv[src]),
                                   args(Up(pos[1]), Up(pos[src]), d_docs), drop);
      cpu_->BlockAttentionBackward(dqkv.data(), dkv.data(), dout.data(), out.data(), lse.data(),
                                   qkv.data(), kv[src].data(),
                                   args(pos[1].data(), pos[src].data(), docs.data()), drop);
      EXPECT_TRUE(Close(Down(d_dqkv, dqkv.size()), dqkv, 1e-5)) << "dqkv += block " << src;
      EXPECT_TRUE(Close(Down(d_dkv, dkv.size()), dkv, 1e-5)) << "dkv += block " << src;
    }
  }
  std::vector<float> src = Rand(6 * 10, 76), dst(5 * 9, 1.0f), want = dst;
  float* d_dst = Up(dst);
  gpu_->Copy2D(d_dst + 2, 9, Up(src) + 1, 10, 5, 4);
  cpu_->Copy2D(want.data() + 2, 9, src.data() + 1, 10, 5, 4);
  EXPECT_TRUE(Close(Down(d_dst, dst.size()), want, 0, 0)) << "Copy2D";
}

TEST_F(CudaOpsTest, DropoutMaskIsCpuOps) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 129}, {64, 1280}}) {
    for (float p : {0.0f, 0.1f, 0.5f}) {
      auto x = Rand(rows * cols, 80);
      float* d = Up(x);
      gpu_->Dropout(d, rows, cols, TestDropout(p));
      cpu_->Dropout(x.data(), rows, cols, TestDropout(p));
      // One multiplication per element: bitwise equal.
      EXPECT_TRUE(Close(Down(d, x.size()), x, 0, 0)) << rows << "x" << cols << " p " << p;
      // Rows of CP rank 1 of 2 (positions in the whole sample).
      HiddenDropout cp = TestDropout(p);
      cp.cp_rank = 1;
      cp.cp_size = 2;
      gpu_->Dropout(d, rows, cols, cp);
      cpu_->Dropout(x.data(), rows, cols, cp);
      EXPECT_TRUE(Close(Down(d, x.size()), x, 0, 0)) << "CP " << rows << "x" << cols;
    }
  }
}

TEST_F(CudaOpsTest, EmbeddingAndPosition) {
  for (int64_t cols : {129, 1280}) {
    const int64_t rows = 1000, vocab = 50, vb = 10, ve = 40;  // a shard; ids repeat
    const auto ids = RandInts(rows, 90, 0, vocab);
    const auto table = Rand((ve - vb) * cols, 91);
    std::vector<float> out(rows * cols);
    float* d_out = Poisoned(out.size());
    int32_t* d_ids = Up(ids);
    gpu_->EmbeddingForward(d_out, d_ids, Up(table), rows, cols, vb, ve);
    cpu_->EmbeddingForward(out.data(), ids.data(), table.data(), rows, cols, vb, ve);
    EXPECT_TRUE(Close(Down(d_out, out.size()), out, 0, 0)) << "embedding forward cols " << cols;

    const auto dout = Rand(rows * cols, 92);
    auto dtable = Rand(table.size(), 93);
    float* d_dtable = Up(dtable);
    float* d_dout = Up(dout);
    gpu_->EmbeddingBackward(d_dtable, d_dout, d_ids, rows, cols, vb, ve);
    cpu_->EmbeddingBackward(dtable.data(), dout.data(), ids.data(), rows, cols, vb, ve);
    EXPECT_TRUE(Close(Down(d_dtable, dtable.size()), dtable, 1e-5)) << "embedding backward";

    const int64_t seq = 37;
    std::vector<int32_t> pos(rows);
    for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<int32_t>(r % seq);
    const auto ptable = Rand(seq * cols, 94);
    auto pout = Rand(rows * cols, 95);
    float* d_pout = Up(pout);
    int32_t* d_pos = Up(pos);
    gpu_->PositionForward(d_pout, d_pos, Up(ptable), rows, cols);
    cpu_->PositionForward(pout.data(), pos.data(), ptable.data(), rows, cols);
    EXPECT_TRUE(Close(Down(d_pout, pout.size()), pout, 1e-6)) << "position forward";
    auto dptable = Rand(ptable.size(), 96);
    float* d_dptable = Up(dptable);
    gpu_->PositionBackward(d_dptable, d_dout, d_pos, rows, cols);
    cpu_->PositionBackward(dptable.data(), dout.data(), pos.data(), rows, cols);
    EXPECT_TRUE(Close(Down(d_dptable, dptable.size()), dptable, 1e-5)) << "position backward";
  }
}

// A reduce hook that changes the data the same way on either backend (max + 0.25, sums · 1.5),
// so the hooks' placement shows in the results; counts its calls and checks the pointer kind.
ReduceHook TestHook(bool device, float add, float mul, int* calls, int64_t* n_seen) {
  return [=](float* data, int64_t n) {
    ++*calls;
    *n_seen = n;
    std::vector<float> h(n);
    if (device) {
      cudaPointerAttributes attr{};
      EXPECT_EQ(cudaPointerGetAttributes(&attr, data), cudaSuccess);
      EXPECT_EQ(attr.type, cudaMemoryTypeDevice) << "hooks get device pointers";
      LT_CUDA_CHECK(
          cudaMemcpyAsync(h.data(), data, n * sizeof(float), cudaMemcpyDeviceToHost, MainStream()));
      LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    } else {
      std::copy(data, data + n, h.begin());
    }
    for (float& x : h) x = x * mul + add;
    if (device) {
      LT_CUDA_CHECK(
          cudaMemcpyAsync(data, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, MainStream()));
      LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    } else {
      std::copy(h.begin(), h.end(), data);
    }
  };
}

TEST_F(CudaOpsTest, CrossEntropy) {
  struct Case {
    int64_t rows, vocab_local, vocab_begin, vocab_total;
    bool hooks;
  };
  for (const Case& c : {Case{37, 1283, 0, 1283, false}, Case{37, 1280, 0, 1280, true},
                        Case{64, 1000, 600, 2600, true}}) {
    SCOPED_TRACE(testing::Message() << "vocab " << c.vocab_local << " begin " << c.vocab_begin);
    const auto logits = Rand(c.rows * c.vocab_local, 100, 3.0f);
    auto targets = RandInts(c.rows, 101, 0, static_cast<int32_t>(c.vocab_total));
    targets[0] = -1;
    targets[c.rows / 2] = -1;
    targets[1] = static_cast<int32_t>(c.vocab_begin);  // the shard's first and last columns
    targets[2] = static_cast<int32_t>(c.vocab_begin + c.vocab_local - 1);
    std::vector<float> losses(c.rows), stats(2 * c.rows);
    float* d_losses = Poisoned(c.rows);
    float* d_stats = Poisoned(2 * c.rows);
    float* d_logits = Up(logits);
    int32_t* d_targets = Up(targets);
    int calls[4] = {0, 0, 0, 0};
    int64_t seen[4] = {0, 0, 0, 0};
    ReduceHook none;
    gpu_->CrossEntropyForward(d_losses, d_stats, d_logits, d_targets, c.rows, c.vocab_local,
                              c.vocab_begin,
                              c.hooks ? TestHook(true, 0.25f, 1.0f, &calls[0], &seen[0]) : none,
                              c.hooks ? TestHook(true, 0.0f, 1.5f, &calls[1], &seen[1]) : none);
    cpu_->CrossEntropyForward(losses.data(), stats.data(), logits.data(), targets.data(), c.rows,
                              c.vocab_local, c.vocab_begin,
                              c.hooks ? TestHook(false, 0.25f, 1.0f, &calls[2], &seen[2]) : none,
                              c.hooks ? TestHook(false, 0.0f, 1.5f, &calls[3], &seen[3]) : none);
    if (c.hooks) {
      EXPECT_EQ(calls[0], 1);
      EXPECT_EQ(calls[1], 1);
      EXPECT_EQ(seen[0], c.rows);
      EXPECT_EQ(seen[1], 2 * c.rows);
    }
    EXPECT_TRUE(Close(Down(d_losses, c.rows), losses, 1e-5)) << "losses";
    EXPECT_TRUE(Close(Down(d_stats, 2 * c.rows), stats, 1e-5)) << "stats";

    const auto dlosses = Rand(c.rows, 102);
    std::vector<float> dlogits(logits.size());
    float* d_dlogits = Poisoned(dlogits.size());
    gpu_->CrossEntropyBackward(d_dlogits, Up(dlosses), Up(stats), d_logits, d_targets, c.rows,
                               c.vocab_local, c.vocab_begin);
    cpu_->CrossEntropyBackward(dlogits.data(), dlosses.data(), stats.data(), logits.data(),
                               targets.data(), c.rows, c.vocab_local, c.vocab_begin);
    EXPECT_TRUE(Close(Down(d_dlogits, dlogits.size()), dlogits, 1e-5)) << "dlogits";
  }
}

TEST_F(CudaOpsTest, SumSquares) {
  for (size_t n : {size_t{1}, size_t{1000003}}) {
    const auto x = Rand(n, 110, 2.0f);
    double want = 0.0;
    for (float v : x) want += static_cast<double>(v) * v;
    float* d = Up(x);
    EXPECT_NEAR(gpu_->SumSquares(d, n), want, 1e-12 * want) << n;
    EXPECT_NEAR(gpu_->SumSquares(d, n), cpu_->SumSquares(x.data(), n), 1e-12 * want) << n;
  }
  auto x = Rand(1000, 111);
  x[517] = kNaN;
  EXPECT_TRUE(std::isnan(gpu_->SumSquares(Up(x), x.size())));
  x[517] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(gpu_->SumSquares(Up(x), x.size())));
}

TEST_F(CudaOpsTest, AdamWStep) {
  for (int offset : {0, 1}) {
    const size_t n = 100003;
    auto p = Rand(n + 1, 120), g = Rand(n + 1, 121, 0.1f), m = Rand(n + 1, 122, 0.01f),
         v = Rand(n + 1, 123, 0.001f);
    for (float& x : v) x = std::abs(x);
    float* dp = Up(p);
    float* dm = Up(m);
    float* dv = Up(v);
    float* dg = Up(g);
    for (int64_t step = 1; step <= 3; ++step) {
      const float scale = step == 2 ? 0.6f : 1.0f;  // gradient scaling folded into the step
      gpu_->AdamWStep(dp + offset, dg + offset, dm + offset, dv + offset, n, 3e-3f, 0.9f, 0.95f,
                      1e-8f, 0.1f, step, scale, nullptr);
      cpu_->AdamWStep(p.data() + offset, g.data() + offset, m.data() + offset, v.data() + offset, n,
                      3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, scale, nullptr);
    }
    // core/adamw.h: the same rounded operations on both sides, so the same bits.
    EXPECT_EQ(Down(dp, n + 1), p) << "param offset " << offset;
    EXPECT_EQ(Down(dm, n + 1), m) << "exp_avg offset " << offset;
    EXPECT_EQ(Down(dv, n + 1), v) << "exp_avg_sq offset " << offset;
  }
}

// --optimizer-cpu-offload on the GPU backend: gradients down and bf16 weights and the norms' and
// embeddings' fp32 copies up on the side streams, in pieces of 97 elements (cutting tensors and
// decay groups; both slots in use) stepped by three host threads. Against the GPU's AdamW on the
// same gradients: the same weights, bf16 copy and fp32 copies, bit for bit, after every step; also
// with the step beside the main stream's next work (overlap_host_step).
TEST_F(CudaOpsTest, OffloadedOptimizerMatchesTheGpuOneBitForBit) {
  ckpt::ModelConfig config = ckpt::Gpt2StyleConfig(2, 16, 2, 37, 8);
  config.make_vocab_size_divisible_by = 8;
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  ProcessGroups groups = SingleProcessGroups();
  ParamStore dev(gpu_.get(), *layout, 0, 0, false);
  ParamStore host(gpu_.get(), *layout, 0, 0, false, MasterWeights::kHost);
  ParamStore over(gpu_.get(), *layout, 0, 0, false, MasterWeights::kHost);
  dev.Initialize(4, 0.02);
  host.Initialize(4, 0.02);
  over.Initialize(4, 0.02);
  const size_t n = dev.size();
  auto* dev_low = static_cast<uint16_t*>(gpu_->AllocBytes(n * 2));
  auto* host_low = static_cast<uint16_t*>(gpu_->AllocBytes(n * 2));
  auto* over_low = static_cast<uint16_t*>(gpu_->AllocBytes(n * 2));
  owned_.push_back(dev_low);
  owned_.push_back(host_low);
  owned_.push_back(over_low);
  dev.set_bf16_copy(dev_low);
  host.set_bf16_copy(host_low);
  over.set_bf16_copy(over_low);
  OptimizerOptions oo;
  oo.weight_decay = 0.1f;
  oo.clip_grad = 0.5f;
  Optimizer a(gpu_.get(), &dev, &groups, oo);
  oo.cpu_offload = true;
  oo.host_threads = 3;
  oo.offload_piece = 97;
  Optimizer b(gpu_.get(), &host, &groups, oo);
  oo.overlap_host_step = true;  // beside what the main stream does next
  Optimizer c(gpu_.get(), &over, &groups, oo);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = Rand(n, 300 + step, 0.05f);
    gpu_->CopyFromHost(dev.grad(), g.data(), n * sizeof(float));
    gpu_->CopyFromHost(host.grad(), g.data(), n * sizeof(float));
    gpu_->CopyFromHost(over.grad(), g.data(), n * sizeof(float));
    const StepResult ra = a.Step(2e-3f), rb = b.Step(2e-3f), rc = c.Step(2e-3f);
    EXPECT_EQ(ra.grad_norm, rb.grad_norm);
    EXPECT_EQ(ra.grad_norm, rc.grad_norm);
    // Main-stream reads after a wait for a prefix see its new bf16 weights; the zeroing asked for
    // meanwhile runs once the step is finished.
    c.ZeroGrad();
    const size_t half = n / 2;
    c.WaitHostWeights(half);
    std::vector<uint16_t> lo(half), lc(half);
    gpu_->CopyToHost(lo.data(), dev_low, half * 2);
    gpu_->CopyToHost(lc.data(), over_low, half * 2);
    EXPECT_EQ(lc, lo) << "step " << step;
    c.FinishHostStep();
    EXPECT_EQ(Down(over.grad(), n), std::vector<float>(n, 0.0f)) << "step " << step;
    EXPECT_EQ(over.HostData(), dev.HostData()) << "step " << step;
    // Reads on the main stream see the uploads (ComputeAfterCopies).
    EXPECT_EQ(host.HostData(), dev.HostData()) << "step " << step;
    std::vector<uint16_t> la(n), lb(n);
    gpu_->CopyToHost(la.data(), dev_low, n * 2);
    gpu_->CopyToHost(lb.data(), host_low, n * 2);
    EXPECT_EQ(la, lb) << "step " << step;
    gpu_->CopyToHost(lb.data(), over_low, n * 2);
    EXPECT_EQ(la, lb) << "step " << step;
    for (const ParamView& v : host.views()) {
      if (v.mirror == ParamView::kNoMirror) continue;
      EXPECT_EQ(Down(host.Param(v.name), v.numel), Down(dev.Param(v.name), v.numel)) << v.name;
    }
  }
  std::vector<float> ma, va, mb, vb;
  a.GatherState(&ma, &va);
  b.GatherState(&mb, &vb);
  EXPECT_EQ(ma, mb);
  EXPECT_EQ(va, vb);
}

}  // namespace
}  // namespace leantron::trainer::cuda
