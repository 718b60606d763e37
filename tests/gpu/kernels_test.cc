// The bf16 model's kernels (float and bf16 instantiations) against CpuOps run in float on the same
// T-rounded inputs: conversions, the bf16 gradient reduction's rounding, GELU, SwiGLU, dropout,
// column sums, embeddings, the fused cross-entropy, AdamW, the gradient norm, and bitwise
// determinism of every reduction.
#include "trainer/cuda/kernels/kernels.h"

#include "tests/gpu/gpu_test_util.h"

namespace leantron::trainer::cuda {
namespace {

using namespace testutil;
TYPED_TEST_SUITE(KernelTest, KernelTypes);

TYPED_TEST(KernelTest, ConvertAndFill) {
  using T = TypeParam;
  for (size_t n : {size_t{3}, size_t{100005}}) {
    const auto x = Rand(n, 130);
    Dev<float> in(x);
    Dev<T> out(n);
    ConvertFromFloat<T>(out.get(), in.get(), n, MainStream());
    EXPECT_TRUE(BitwiseEqual(out.Download(), ToT<T>(x))) << n;
    Fill<T>(out.get(), n, 0.375f, MainStream());
    EXPECT_EQ(DownF(out), std::vector<float>(n, 0.375f)) << n;
  }
}

// The data-parallel reduction in bf16 (--grad-reduce-in-bf16): s = bf16(bf16(a) + b) into a and
// out, and bf16 back to float, bit for bit against the host's rounding; vector and misaligned
// (element by element) paths.
TEST_F(GpuTest, AddRoundedBf16AndConvertToFloat) {
  auto rounded_sum = [](float a, float b) { return RoundT<bf16>({RoundT<bf16>({a})[0] + b})[0]; };
  for (size_t n : {size_t{5}, size_t{100007}}) {
    for (size_t offset : {size_t{0}, size_t{1}}) {
      SCOPED_TRACE(testing::Message() << "n " << n << " offset " << offset);
      const auto a = Rand(n + 1, 150, 3.0f), b = RoundT<bf16>(Rand(n + 1, 151, 3.0f));
      Dev<float> da(a);
      Dev<bf16> db(ToT<bf16>(b)), out(ToT<bf16>(std::vector<float>(n + 1, 7.0f)));
      AddRoundedBf16(da.get() + offset, db.get() + offset, out.get() + offset, n, MainStream());
      std::vector<float> want = a, sent(n + 1, 7.0f);
      for (size_t i = offset; i < offset + n; ++i) sent[i] = want[i] = rounded_sum(a[i], b[i]);
      EXPECT_TRUE(BitwiseEqual(da.Download(), want)) << "sum kept";
      EXPECT_TRUE(BitwiseEqual(DownF(out), sent)) << "sum sent";
      AddRoundedBf16(da.get() + offset, db.get() + offset, nullptr, n, MainStream());
      for (size_t i = offset; i < offset + n; ++i) want[i] = rounded_sum(want[i], b[i]);
      EXPECT_TRUE(BitwiseEqual(da.Download(), want)) << "without out";
      Dev<float> f(std::vector<float>(n + 1, -1.0f));
      ConvertToFloat(f.get() + offset, out.get() + offset, n, MainStream());
      std::vector<float> conv = sent;
      if (offset == 1) conv[0] = -1.0f;
      if (offset == 0) conv[n] = -1.0f;
      EXPECT_TRUE(BitwiseEqual(f.Download(), conv)) << "to float";
    }
  }
}

TYPED_TEST(KernelTest, Gelu) {
  using T = TypeParam;
  for (size_t n : {size_t{13}, size_t{100005}}) {
    for (bool tanh_approx : {false, true}) {
      const auto in = RoundT<T>(Rand(n, 160, 3.0f)), dout = RoundT<T>(Rand(n, 161));
      std::vector<float> out(n), din(n);
      this->cpu_->GeluForward(out.data(), in.data(), n, tanh_approx);
      this->cpu_->GeluBackward(din.data(), dout.data(), in.data(), n, tanh_approx);
      auto d_in = DevT<T>(in);
      auto d_dout = DevT<T>(dout);
      Dev<T> d_out(n);
      GeluForward<T>(d_out.get(), d_in->get(), n, tanh_approx, MainStream());
      EXPECT_TRUE(Close(DownF(d_out), out, Tol<T>())) << "forward tanh " << tanh_approx;
      GeluBackward<T>(d_dout->get(), d_dout->get(), d_in->get(), n, tanh_approx, MainStream());
      EXPECT_TRUE(Close(DownF(*d_dout), din, Tol<T>())) << "backward (in place) " << tanh_approx;
    }
  }
}

TYPED_TEST(KernelTest, Swiglu) {
  using T = TypeParam;
  for (auto [rows, width] : {std::pair<int64_t, int64_t>{37, 129}, {64, 1280}}) {
    const auto in = RoundT<T>(Rand(rows * 2 * width, 165, 2.0f));
    const auto dout = RoundT<T>(Rand(rows * width, 166));
    std::vector<float> out(rows * width), din(rows * 2 * width);
    this->cpu_->SwigluForward(out.data(), in.data(), rows, width);
    this->cpu_->SwigluBackward(din.data(), dout.data(), in.data(), rows, width);
    auto d_in = DevT<T>(in);
    auto d_dout = DevT<T>(dout);
    Dev<T> d_out(out.size()), d_din(din.size());
    SwigluForward<T>(d_out.get(), d_in->get(), rows, width, MainStream());
    SwigluBackward<T>(d_din.get(), d_dout->get(), d_in->get(), rows, width, MainStream());
    EXPECT_TRUE(Close(DownF(d_out), out, Tol<T>())) << "forward " << width;
    EXPECT_TRUE(Close(DownF(d_din), din, Tol<T>())) << "backward " << width;
  }
}

TYPED_TEST(KernelTest, Dropout) {
  using T = TypeParam;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 129}, {64, 1280}}) {
    const auto x = RoundT<T>(Rand(rows * cols, 170));
    auto want = x;
    this->cpu_->Dropout(want.data(), rows, cols, TestDropout(0.3f));
    auto d = DevT<T>(x);
    Dropout<T>(d->get(), rows, cols, TestDropout(0.3f), MainStream());
    // One multiplication, then one rounding: bitwise what CpuOps gives, rounded to T.
    EXPECT_TRUE(BitwiseEqual(d->Download(), ToT<T>(want))) << rows << "x" << cols;
  }
}

TYPED_TEST(KernelTest, ColumnSumAccumulate) {
  using T = TypeParam;
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{37, 129}, {1000, 1280}, {1000, 1283}, {32768, 72}, {3, 5}}) {
    const auto dout = RoundT<T>(Rand(rows * cols, 180));
    auto dbias = Rand(cols, 181);
    Dev<float> d_dbias(dbias);
    auto d_dout = DevT<T>(dout);
    DevScratch scratch(ColumnSumScratchBytes(rows, cols));
    ColumnSumAccumulate<T>(d_dbias.get(), d_dout->get(), rows, cols, scratch.get(), MainStream());
    this->cpu_->BiasBackward(dbias.data(), dout.data(), rows, cols);
    EXPECT_TRUE(Close(d_dbias.Download(), dbias, 1e-5)) << rows << "x" << cols;
  }
}

TYPED_TEST(KernelTest, EmbeddingAndPosition) {
  using T = TypeParam;
  for (int64_t cols : {129, 1280}) {
    SCOPED_TRACE(testing::Message() << "cols " << cols);
    const int64_t rows = 2000, vocab = 300, vb = 100, ve = 250;
    auto ids = RandInts(rows, 190, 0, vocab);
    for (int64_t r = 0; r < rows; r += 7) ids[r] = 123;  // a heavily repeated id
    const auto table = Rand((ve - vb) * cols, 191);
    std::vector<float> out(rows * cols);
    this->cpu_->EmbeddingForward(out.data(), ids.data(), table.data(), rows, cols, vb, ve);
    Dev<int32_t> d_ids(ids);
    Dev<float> d_table(table);
    Dev<T> d_out(rows * cols);
    EmbeddingForward<T>(d_out.get(), d_ids.get(), d_table.get(), rows, cols, vb, ve, MainStream());
    EXPECT_TRUE(BitwiseEqual(d_out.Download(), ToT<T>(out))) << "embedding forward";

    const auto dout = RoundT<T>(Rand(rows * cols, 192));
    auto dtable = Rand(table.size(), 193);
    Dev<float> d_dtable(dtable);
    auto d_dout = DevT<T>(dout);
    DevScratch scratch(EmbeddingBackwardScratchBytes(rows, cols));
    EmbeddingBackward<T>(d_dtable.get(), d_dout->get(), d_ids.get(), rows, cols, vb, ve,
                         scratch.get(), MainStream());
    this->cpu_->EmbeddingBackward(dtable.data(), dout.data(), ids.data(), rows, cols, vb, ve);
    EXPECT_TRUE(Close(d_dtable.Download(), dtable, 1e-5)) << "embedding backward";

    const int64_t seq = 64;
    std::vector<int32_t> pos(rows);
    for (int64_t r = 0; r < rows; ++r) pos[r] = static_cast<int32_t>((r * 7) % seq);
    const auto ptable = Rand(seq * cols, 194);
    const auto pout0 = RoundT<T>(Rand(rows * cols, 195));
    auto pout = pout0;
    this->cpu_->PositionForward(pout.data(), pos.data(), ptable.data(), rows, cols);
    Dev<int32_t> d_pos(pos);
    Dev<float> d_ptable(ptable);
    auto d_pout = DevT<T>(pout0);
    PositionForward<T>(d_pout->get(), d_pos.get(), d_ptable.get(), rows, cols, MainStream());
    EXPECT_TRUE(Close(DownF(*d_pout), pout, Tol<T>())) << "position forward";

    auto dptable = Rand(ptable.size(), 196);
    Dev<float> d_dptable(dptable);
    PositionBackward<T>(d_dptable.get(), d_dout->get(), d_pos.get(), rows, cols, scratch.get(),
                        MainStream());
    this->cpu_->PositionBackward(dptable.data(), dout.data(), pos.data(), rows, cols);
    EXPECT_TRUE(Close(d_dptable.Download(), dptable, 1e-5)) << "position backward";
  }
}

TYPED_TEST(KernelTest, CrossEntropyForwardBackward) {
  using T = TypeParam;
  for (int64_t vocab : {1280, 1283, 50304}) {
    for (float grad_scale : {0.0f, 0.25f}) {
      SCOPED_TRACE(testing::Message() << "vocab " << vocab << " grad_scale " << grad_scale);
      const int64_t rows = vocab > 10000 ? 9 : 37;
      const auto logits = RoundT<T>(Rand(rows * vocab, 200, 3.0f));
      auto targets = RandInts(rows, 201, 0, static_cast<int32_t>(vocab));
      targets[0] = -1;
      targets[rows - 1] = -1;
      targets[1] = 0;
      targets[2] = static_cast<int32_t>(vocab - 1);
      std::vector<float> losses(rows), stats(2 * rows), dlogits(logits.size());
      this->cpu_->CrossEntropyForward(losses.data(), stats.data(), logits.data(), targets.data(),
                                      rows, vocab, 0, nullptr, nullptr);
      const std::vector<float> dlosses(rows, grad_scale);
      this->cpu_->CrossEntropyBackward(dlogits.data(), dlosses.data(), stats.data(), logits.data(),
                                       targets.data(), rows, vocab, 0);
      auto d_logits = DevT<T>(logits);
      Dev<int32_t> d_targets(targets);
      Dev<float> d_losses(rows);
      CrossEntropyForwardBackward<T>(d_losses.get(), d_logits->get(), d_targets.get(), rows, vocab,
                                     grad_scale, MainStream());
      EXPECT_TRUE(Close(d_losses.Download(), losses, 1e-5)) << "losses";
      if (grad_scale == 0.0f) {
        EXPECT_TRUE(BitwiseEqual(d_logits->Download(), ToT<T>(logits))) << "logits untouched";
      } else {
        // dlogits are small; compare each against its own magnitude plus a small floor.
        EXPECT_TRUE(Close(DownF(*d_logits), dlogits, Tol<T>(), 1e-7)) << "dlogits";
      }
    }
  }
}

// ================================================================ float-only kernels, determinism

// RearrangeQkv against a float64 host model: every element of the attention layout (queries of all
// heads, then key and value per group) from Megatron-Core's grouped layout (per group: its query
// heads, key, value), queries and keys rotated by θ = position·f_i (rotate-half pairs), and back
// with −θ. Head dims whose half is a multiple of 8 and 4 (vector paths), of neither, and a
// misaligned buffer (element by element), for grouped and multi-head attention.
TYPED_TEST(KernelTest, RearrangeQkvWithRope) {
  using T = TypeParam;
  struct Case {
    int64_t heads, groups, head_dim, offset;
  };
  for (const Case& c : {Case{4, 2, 16, 0}, Case{4, 2, 8, 0}, Case{6, 3, 12, 0}, Case{4, 4, 32, 0},
                        Case{4, 1, 16, 1}}) {
    for (bool rope : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << "heads " << c.heads << " groups " << c.groups << " head_dim " << c.head_dim
                   << " offset " << c.offset << " rope " << rope);
      const int64_t seq = 5, rows = 2 * seq, half = c.head_dim / 2, per = c.heads / c.groups;
      const int64_t width = (c.heads + 2 * c.groups) * c.head_dim, n = rows * width;
      const auto in = RoundT<T>(Rand(n, 160));
      std::vector<float> cos(seq * half), sin(seq * half);
      for (int64_t t = 0; t < seq; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          const double theta = t * std::pow(10000.0, -2.0 * i / c.head_dim);
          cos[t * half + i] = static_cast<float>(std::cos(theta));
          sin[t * half + i] = static_cast<float>(std::sin(theta));
        }
      }
      // want[row][attention offset] from the grouped input, in double.
      std::vector<float> want(n);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r % seq;
        for (int64_t slot = 0; slot < c.heads + 2 * c.groups; ++slot) {
          int64_t from, to;
          bool rotate = rope;
          if (slot < c.heads) {
            from = ((slot / per) * (per + 2) + slot % per) * c.head_dim;
            to = slot * c.head_dim;
          } else if (slot < c.heads + c.groups) {
            const int64_t g = slot - c.heads;
            from = (g * (per + 2) + per) * c.head_dim;
            to = (c.heads + 2 * g) * c.head_dim;
          } else {
            const int64_t g = slot - c.heads - c.groups;
            from = (g * (per + 2) + per + 1) * c.head_dim;
            to = (c.heads + 2 * g + 1) * c.head_dim;
            rotate = false;
          }
          for (int64_t i = 0; i < half; ++i) {
            const double a = in[r * width + from + i], b = in[r * width + from + i + half];
            const double cs = rotate ? cos[t * half + i] : 1.0, sn = rotate ? sin[t * half + i] : 0;
            want[r * width + to + i] = static_cast<float>(a * cs - b * sn);
            want[r * width + to + i + half] = static_cast<float>(b * cs + a * sn);
          }
        }
      }
      std::vector<float> padded(n + c.offset, 0.0f);
      std::copy(in.begin(), in.end(), padded.begin() + c.offset);
      auto din = DevT<T>(padded);
      Dev<T> dout(n + c.offset), dback(n + c.offset);
      Dev<float> dcos(cos), dsin(sin);
      RearrangeQkv<T>(dout.get() + c.offset, din->get() + c.offset, rows, seq, c.heads, c.groups,
                      c.head_dim, rope ? dcos.get() : nullptr, rope ? dsin.get() : nullptr,
                      /*to_attention=*/true, MainStream());
      RearrangeQkv<T>(dback.get() + c.offset, dout.get() + c.offset, rows, seq, c.heads, c.groups,
                      c.head_dim, rope ? dcos.get() : nullptr, rope ? dsin.get() : nullptr,
                      /*to_attention=*/false, MainStream());
      const auto got = DownF(dout), back = DownF(dback);
      const std::vector<float> got_n(got.begin() + c.offset, got.end());
      const std::vector<float> back_n(back.begin() + c.offset, back.end());
      if (rope) {
        EXPECT_TRUE(Close(got_n, want, Tol<T>()));
        // The inverse rotation of a T-rounded rotation: the input within T's rounding.
        EXPECT_TRUE(Close(back_n, in, Tol<T>()));
      } else {  // a permutation: bit for bit
        EXPECT_TRUE(BitwiseEqual(got_n, want));
        EXPECT_TRUE(BitwiseEqual(back_n, in));
      }
    }
  }
}

TEST_F(GpuTest, AdamWKernel) {
  const size_t n = 4099;
  auto p = Rand(n, 210), g = Rand(n, 211, 0.1f), m = Rand(n, 212, 0.01f), v = Rand(n, 213, 1e-3f);
  for (float& x : v) x = std::abs(x);
  Dev<float> dp(p), dg(g), dm(m), dv(v);
  Dev<bf16> low(n + 1);  // poisoned: NaN
  // Into a bf16 copy at an odd offset (no vector stores), gradient scaled by 0.3.
  AdamW(dp.get(), dg.get(), dm.get(), dv.get(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 7, 0.3f,
        low.get() + 1, MainStream());
  cpu_->AdamWStep(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 7,
                  0.3f, nullptr);
  const std::vector<float> got = dp.Download();  // bit for bit (core/adamw.h)
  EXPECT_EQ(got, p);
  EXPECT_EQ(dm.Download(), m);
  EXPECT_EQ(dv.Download(), v);
  const std::vector<bf16> rounded = low.Download();
  EXPECT_TRUE(std::isnan(static_cast<float>(rounded[0])));  // untouched before the range
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(static_cast<float>(rounded[i + 1]), static_cast<float>(__float2bfloat16(got[i])))
        << i;
}

TEST_F(GpuTest, SumSquaresKernelMatchesFloat64) {
  for (size_t n : {size_t{5}, size_t{3000017}}) {
    const auto x = Rand(n, 220, 3.0f);
    long double want = 0;
    for (float v : x) want += static_cast<long double>(v) * v;
    Dev<float> d(x);
    DevScratch scratch(SumSquaresScratchBytes(n));
    const double got = SumSquares(d.get(), n, scratch.get(), MainStream());
    EXPECT_NEAR(got, static_cast<double>(want), 1e-12 * static_cast<double>(want)) << n;
  }
}

TEST_F(GpuTest, ReductionsAreDeterministic) {
  // Each runs twice from the same state; the results must match bit for bit.
  {
    const int64_t rows = 4096, cols = 1280, vocab = 64;
    auto ids = RandInts(rows, 230, 0, vocab);
    const auto dout = ToT<bf16>(Rand(rows * cols, 231));
    Dev<int32_t> d_ids(ids);
    Dev<bf16> d_dout(dout);
    DevScratch scratch(EmbeddingBackwardScratchBytes(rows, cols));
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      Dev<float> dtable(std::vector<float>(vocab * cols, 0.5f));
      EmbeddingBackward<bf16>(dtable.get(), d_dout.get(), d_ids.get(), rows, cols, 0, vocab,
                              scratch.get(), MainStream());
      if (run == 0) {
        first = dtable.Download();
      } else {
        EXPECT_TRUE(BitwiseEqual(dtable.Download(), first)) << "EmbeddingBackward";
      }
    }
  }
  {
    const int64_t rows = 8192, cols = 1283;
    Dev<float> d_dout(Rand(rows * cols, 232));
    DevScratch scratch(ColumnSumScratchBytes(rows, cols));
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      Dev<float> dbias(std::vector<float>(cols, 0.0f));
      ColumnSumAccumulate<float>(dbias.get(), d_dout.get(), rows, cols, scratch.get(),
                                 MainStream());
      if (run == 0) {
        first = dbias.Download();
      } else {
        EXPECT_TRUE(BitwiseEqual(dbias.Download(), first)) << "ColumnSumAccumulate";
      }
    }
  }
  for (int64_t cols : {1280, 1283}) {  // cached and loop paths
    const int64_t rows = 3000;
    const auto x = Rand(rows * cols, 233);
    std::vector<float> mean(rows), rstd(rows), out(rows * cols);
    const auto w = Rand(cols, 234);
    cpu_->LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), rows,
                           cols, 1e-5f);
    Dev<bf16> d_x(ToT<bf16>(x)), d_dout(ToT<bf16>(Rand(rows * cols, 235)));
    Dev<float> d_w(w), d_mean(mean), d_rstd(rstd);
    DevScratch scratch(LayerNormBackwardScratchBytes(rows, cols));
    std::vector<float> first_dw, first_db;
    std::vector<bf16> first_dx;
    for (int run = 0; run < 2; ++run) {
      Dev<bf16> dx(rows * cols);
      Dev<float> dw(std::vector<float>(cols, 0.0f)), db(std::vector<float>(cols, 0.0f));
      LayerNormBackward<bf16>(dx.get(), nullptr, dw.get(), db.get(), d_dout.get(), nullptr,
                              d_x.get(), d_w.get(), d_mean.get(), d_rstd.get(), rows, cols,
                              HiddenDropout{}, scratch.get(), MainStream());
      if (run == 0) {
        first_dw = dw.Download();
        first_db = db.Download();
        first_dx = dx.Download();
      } else {
        EXPECT_TRUE(BitwiseEqual(dw.Download(), first_dw)) << "LayerNormBackward dw " << cols;
        EXPECT_TRUE(BitwiseEqual(db.Download(), first_db)) << "LayerNormBackward db " << cols;
        EXPECT_TRUE(BitwiseEqual(dx.Download(), first_dx)) << "LayerNormBackward dx " << cols;
      }
    }
  }
  {
    const size_t n = 5000011;
    Dev<float> d(Rand(n, 236));
    DevScratch scratch(SumSquaresScratchBytes(n));
    const double a = SumSquares(d.get(), n, scratch.get(), MainStream());
    const double b = SumSquares(d.get(), n, scratch.get(), MainStream());
    EXPECT_EQ(std::memcmp(&a, &b, sizeof(double)), 0) << a << " vs " << b;
  }
}

}  // namespace
}  // namespace leantron::trainer::cuda
