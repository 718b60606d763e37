// FP8 casts and products against host models written from the formats' definitions (OCP 8-bit
// floating point: E4M3 with bias 7, largest finite 448, no infinity, NaN S.1111.111; E5M2 with
// bias 15, largest finite 57344): casts bit for bit (rounding to nearest even, saturation,
// subnormals, NaN, signed zeros), the transposed copy, absolute maxima, the scale update, and
// cuBLASLt's FP8 products against the float64 product of the dequantised operands.
#include "trainer/cuda/kernels/fp8.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "tests/gpu/gpu_test_util.h"
#include "trainer/cuda/fp8_matmul.h"
#include "trainer/cuda/kernels/kernels.h"

namespace leantron::trainer::cuda {
namespace {

using namespace testutil;

struct Fp8Spec {
  int exp_bits, man_bits, bias;
  double max_finite;
};
Fp8Spec SpecOf(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Fp8Spec{4, 3, 7, 448.0} : Fp8Spec{5, 2, 15, 57344.0};
}

// The value an FP8 byte encodes.
double Decode(uint8_t q, Fp8Format f) {
  const Fp8Spec s = SpecOf(f);
  const int sign = q >> 7, e = (q >> s.man_bits) & ((1 << s.exp_bits) - 1),
            mant = q & ((1 << s.man_bits) - 1);
  const int emax = (1 << s.exp_bits) - 1;
  if (f == Fp8Format::kE4M3 && e == emax && mant == (1 << s.man_bits) - 1) return NAN;
  if (f == Fp8Format::kE5M2 && e == emax) return mant != 0 ? NAN : (sign ? -INFINITY : INFINITY);
  const double v = e == 0 ? std::ldexp(mant, 1 - s.bias - s.man_bits)
                          : std::ldexp((1 << s.man_bits) + mant, e - s.bias - s.man_bits);
  return sign ? -v : v;
}

// The value fp8(x) takes: round to nearest even on the format's grid, saturate to the largest
// finite value (infinities included), NaN stays NaN; then its float, sign of zero kept.
double RoundFp8(float x, Fp8Format f) {
  const Fp8Spec s = SpecOf(f);
  if (std::isnan(x)) return NAN;
  const double a = std::fabs(static_cast<double>(x));
  double r;
  if (a >= s.max_finite) {
    r = s.max_finite;
  } else {
    const int e = a == 0 ? 0 : std::ilogb(a);
    const int q_exp = std::max(e, 1 - s.bias) - s.man_bits;        // the grid's step is 2^q_exp
    r = std::ldexp(std::nearbyint(std::ldexp(a, -q_exp)), q_exp);  // nearbyint: ties to even
    r = std::min(r, s.max_finite);
  }
  return std::signbit(x) ? -r : r;
}

bool SameValue(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

// Inputs that probe every case: zeros, the smallest subnormals and halfway points between them,
// the subnormal/normal boundary, ties to even, the largest finite value and beyond, infinities,
// NaN; then random values over the whole range.
std::vector<float> Probes(Fp8Format f) {
  const Fp8Spec s = SpecOf(f);
  const double tiny = std::ldexp(1.0, 1 - s.bias - s.man_bits);  // smallest subnormal
  const double min_normal = std::ldexp(1.0, 1 - s.bias);
  std::vector<double> v = {0.0,
                           -0.0,
                           tiny,
                           tiny / 2,
                           tiny * 0.51,
                           tiny * 1.5,
                           tiny * 2.5,
                           min_normal,
                           min_normal * (1 - 1.0 / 32),
                           1.0,
                           1.0 + 1.0 / (2 << s.man_bits),
                           1.0 + 3.0 / (2 << s.man_bits),
                           s.max_finite,
                           s.max_finite * 1.03,
                           s.max_finite * 1.2,
                           1e30,
                           INFINITY,
                           NAN};
  std::vector<float> out;
  for (double x : v) {
    out.push_back(static_cast<float>(x));
    out.push_back(static_cast<float>(-x));
  }
  const auto r = Rand(4000, 170);
  for (size_t i = 0; i < r.size(); ++i)
    out.push_back(r[i] * static_cast<float>(std::ldexp(1.0, static_cast<int>(i % 40) - 24)));
  return out;
}

class Fp8Test : public GpuTest {};

TEST_F(Fp8Test, CastsRoundSaturateAndTransposeBitForBit) {
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (float scale : {1.0f, 0.375f}) {
      SCOPED_TRACE(testing::Message()
                   << (f == Fp8Format::kE4M3 ? "E4M3" : "E5M2") << " scale " << scale);
      std::vector<float> x = Probes(f);
      const int64_t cols = 37, rows = static_cast<int64_t>(x.size() + cols - 1) / cols;
      x.resize(rows * cols, 0.5f);
      Dev<float> dx(x), dscale(std::vector<float>{scale});
      Dev<uint8_t> q(x.size()), qt(x.size());
      Dev<float> amax(std::vector<float>{0.0f});
      CastToFp8<float>(q.get(), qt.get(), amax.get(), dx.get(), rows, cols, dscale.get(), f,
                       MainStream());
      const auto got = q.Download(), got_t = qt.Download();
      size_t bad = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        const double want = RoundFp8(x[i] * scale, f);
        if (!SameValue(Decode(got[i], f), want) && bad++ < 5)
          ADD_FAILURE() << "x " << x[i] << " x scale " << x[i] * scale << ": got "
                        << Decode(got[i], f) << " want " << want;
      }
      EXPECT_EQ(bad, 0u);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(got_t[c * rows + r], got[r * cols + c]) << r << "," << c;
      float want_amax = 0;
      for (float v : x)
        if (!std::isnan(v)) want_amax = std::max(want_amax, std::fabs(v));
      EXPECT_EQ(amax.Download()[0], want_amax);
    }
  }
}

// The 64 x 64 vectorised tiles (cols a multiple of 4, and rows too with the transpose), whole and
// cut at the edges, from float and bf16; and a shape that falls back to the scalar tiles.
TEST_F(Fp8Test, VectorisedTilesAndTheirEdgesBitForBit) {
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape sh : {Shape{128, 192}, Shape{68, 100}, Shape{4, 4}, Shape{66, 64}}) {
    for (const bool from_bf16 : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << sh.rows << " x " << sh.cols << (from_bf16 ? " bf16" : " float"));
      const Fp8Format f = from_bf16 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
      const std::vector<float> probes = Probes(f);
      std::vector<float> x(sh.rows * sh.cols);
      for (size_t i = 0; i < x.size(); ++i) x[i] = probes[(i * 7919) % probes.size()];
      if (from_bf16) x = RoundT<bf16>(x);
      const float scale = 0.75f;
      Dev<float> dscale(std::vector<float>{scale}), amax(std::vector<float>{0.0f});
      Dev<uint8_t> q(x.size()), qt(x.size());
      if (from_bf16) {
        Dev<bf16> dx(ToT<bf16>(x));
        CastToFp8<bf16>(q.get(), qt.get(), amax.get(), dx.get(), sh.rows, sh.cols, dscale.get(), f,
                        MainStream());
      } else {
        Dev<float> dx(x);
        CastToFp8<float>(q.get(), qt.get(), amax.get(), dx.get(), sh.rows, sh.cols, dscale.get(), f,
                         MainStream());
      }
      const auto got = q.Download(), got_t = qt.Download();
      float want_amax = 0;
      for (int64_t r = 0; r < sh.rows; ++r) {
        for (int64_t c = 0; c < sh.cols; ++c) {
          const float v = x[r * sh.cols + c];
          if (!std::isnan(v)) want_amax = std::max(want_amax, std::fabs(v));
          ASSERT_TRUE(SameValue(Decode(got[r * sh.cols + c], f), RoundFp8(v * scale, f)))
              << r << "," << c << ": " << v;
          ASSERT_EQ(got_t[c * sh.rows + r], got[r * sh.cols + c]) << r << "," << c;
        }
      }
      EXPECT_EQ(amax.Download()[0], want_amax);
    }
  }
}

// bf16 inputs (what the model casts): the same rounding from bf16's values; AbsMax alone.
TEST_F(Fp8Test, Bf16InputsAndAbsMax) {
  std::vector<float> x = RoundT<bf16>(Rand(64 * 48, 171, 40.0f));
  x[5] = -900.0f;  // above E4M3's range
  Dev<bf16> dx(ToT<bf16>(x));
  Dev<float> dscale(std::vector<float>{1.0f}), amax(std::vector<float>{0.0f});
  Dev<uint8_t> q(x.size());
  CastToFp8<bf16>(q.get(), nullptr, nullptr, dx.get(), 64, 48, dscale.get(), Fp8Format::kE4M3,
                  MainStream());
  const auto got = q.Download();
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_TRUE(SameValue(Decode(got[i], Fp8Format::kE4M3), RoundFp8(x[i], Fp8Format::kE4M3))) << i;
  AbsMax<bf16>(amax.get(), dx.get(), x.size(), MainStream());
  EXPECT_EQ(amax.Download()[0], 900.0f);
  // Back: the dequantised values as float.
  Dev<float> back(x.size()), inv(std::vector<float>{2.0f});
  CastFromFp8<float>(back.get(), q.get(), x.size(), inv.get(), Fp8Format::kE4M3, MainStream());
  const auto b = back.Download();
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(b[i], static_cast<float>(2.0 * RoundFp8(x[i], Fp8Format::kE4M3))) << i;
}

// AdamW writing the weight's FP8 copies in its pass: the fp32 weights, moments and bf16 copy bit
// for bit the cpu backend's AdamW (core/adamw.h), each byte the rounding of the bf16 copy's value
// times the scale, the transpose, and the amax of the bf16 copy's values; on the vector tiles,
// their edges, and the two-pass fallback (columns not a multiple of 4; misaligned tensors).
TEST_F(Fp8Test, AdamWStepWritesTheWeightsFp8Copies) {
  struct Case {
    int64_t rows, cols, skew;  // skew: elements the fp32 tensors start past 16-byte alignment
  };
  for (const Case cs : {Case{128, 192, 0}, Case{68, 100, 0}, Case{36, 30, 0}, Case{64, 64, 1}}) {
    SCOPED_TRACE(testing::Message() << cs.rows << " x " << cs.cols << " skew " << cs.skew);
    const int64_t n = cs.rows * cs.cols;
    auto p = Rand(n, 220, 2.0f), g = Rand(n, 221, 0.1f), m = Rand(n, 222, 0.01f),
         v = Rand(n, 223, 1e-3f);
    for (float& x : v) x = std::abs(x);
    p[7] = 600.0f;  // past E4M3's largest finite value at scale 1
    auto skewed = [&](const std::vector<float>& x) {
      std::vector<float> out(cs.skew, 0.0f);
      out.insert(out.end(), x.begin(), x.end());
      return out;
    };
    Dev<float> dp(skewed(p)), dg(skewed(g)), dm(skewed(m)), dv(skewed(v));
    Dev<bf16> low(n);
    Dev<uint8_t> q(n), qt(n);
    const float scale = 0.75f;
    Dev<float> dscale(std::vector<float>{scale}), amax(std::vector<float>{0.0f});
    const AdamWConstants c = MakeAdamWConstants(1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5, 0.5f);
    AdamWToFp8(dp.get() + cs.skew, dg.get() + cs.skew, dm.get() + cs.skew, dv.get() + cs.skew, c,
               low.get(), cs.rows, cs.cols, q.get(), qt.get(), amax.get(), dscale.get(),
               Fp8Format::kE4M3, MainStream());
    std::vector<uint16_t> want_low(n);
    cpu_->AdamWStep(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5,
                    0.5f, want_low.data());
    EXPECT_EQ(dp.Download(), skewed(p));
    EXPECT_EQ(dm.Download(), skewed(m));
    EXPECT_EQ(dv.Download(), skewed(v));
    const auto got_low = low.Download();
    const auto got = q.Download(), got_t = qt.Download();
    float want_amax = 0.0f;
    for (int64_t r = 0; r < cs.rows; ++r) {
      for (int64_t col = 0; col < cs.cols; ++col) {
        const int64_t i = r * cs.cols + col;
        uint16_t bits;
        std::memcpy(&bits, &got_low[i], sizeof(bits));
        ASSERT_EQ(bits, want_low[i]) << r << "," << col;
        const float w = static_cast<float>(got_low[i]);
        want_amax = std::max(want_amax, std::fabs(w));
        ASSERT_TRUE(
            SameValue(Decode(got[i], Fp8Format::kE4M3), RoundFp8(w * scale, Fp8Format::kE4M3)))
            << r << "," << col << ": " << w;
        ASSERT_EQ(got_t[col * cs.rows + r], got[i]) << r << "," << col;
      }
    }
    EXPECT_EQ(amax.Download()[0], want_amax);
  }
}

// The MLP's activations and their gradients (float64, from the activation's definition).
double GeluRef(double x, bool tanh_approx) {
  if (tanh_approx)
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double GeluGradRef(double x, bool tanh_approx) {
  if (tanh_approx) {
    const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
    const double t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
  }
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}
double SigmoidRef(double x) { return 1 / (1 + std::exp(-x)); }

// CastSourceToFp8: for each source (a tensor; GELU (tanh, erf) and SwiGLU of fc1's output; their
// gradients), on a shape cut at the tiles' edges, every byte is the float64 value's rounding (or
// the neighbour's when the value lies within the approximations' error of a rounding boundary),
// the transpose holds the same bytes, the amax is the values' (also in the amax-only pass), and
// the column sums added to the bias gradient are the values'.
TEST_F(Fp8Test, ActivationSourcesCastAndSumColumns) {
  const int64_t rows = 136, w = 100;  // 136 = 2 tiles + 8 rows
  const auto x = RoundT<bf16>(Rand(rows * 2 * w, 180, 2.0f));
  const auto dy = RoundT<bf16>(Rand(rows * w, 181, 0.5f));
  auto dx = DevT<bf16>(x), ddy = DevT<bf16>(dy);
  struct Case {
    Fp8Activation act;
    bool grad;
  };
  for (const Case c : {Case{Fp8Activation::kNone, false}, Case{Fp8Activation::kGeluTanh, false},
                       Case{Fp8Activation::kGeluErf, false}, Case{Fp8Activation::kSwiglu, false},
                       Case{Fp8Activation::kGeluTanh, true}, Case{Fp8Activation::kGeluErf, true},
                       Case{Fp8Activation::kSwiglu, true}}) {
    const bool swiglu = c.act == Fp8Activation::kSwiglu;
    SCOPED_TRACE(testing::Message() << "activation " << int(c.act) << (c.grad ? " gradient" : ""));
    // The source's values: cols wide; x read as [rows, cols] (GELU, plain) or [rows, 2w] (SwiGLU).
    const int64_t cols = swiglu && c.grad ? 2 * w : swiglu ? w : 2 * w;
    // Each value and the size of its terms, which bounds the error of the special-function
    // unit's exp and reciprocal that the kernel uses.
    std::vector<double> want(rows * cols), terms(rows * cols, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        double v, t = 0;
        const bool tanh_approx = c.act == Fp8Activation::kGeluTanh;
        if (c.act == Fp8Activation::kNone) {
          v = x[r * cols + j];
        } else if (!swiglu) {
          const double xv = x[r * cols + j];
          // GELU's gradient reads dy as [rows, cols] (dy_wide below).
          const double d = dy[(r * cols + j) % dy.size()];
          v = c.grad ? d * GeluGradRef(xv, tanh_approx) : GeluRef(xv, tanh_approx);
          t = c.grad ? std::fabs(d) * (1 + std::fabs(xv) + 0.2 * std::pow(std::fabs(xv), 3))
                     : std::fabs(xv);
        } else {
          const int64_t k = c.grad && j >= w ? j - w : j;
          const double gate = x[r * 2 * w + k], up = x[r * 2 * w + w + k], s = SigmoidRef(gate);
          if (!c.grad) {
            v = gate * s * up;
            t = std::fabs(gate * up);
          } else {
            const double d = dy[r * w + k];
            v = j < w ? d * up * s * (1 + gate * (1 - s)) : d * gate * s;
            t = std::fabs(d) * (j < w ? std::fabs(up) * (1 + std::fabs(gate)) : std::fabs(gate));
          }
        }
        want[r * cols + j] = v;
        terms[r * cols + j] = t;
      }
    }
    // GELU's gradient pairs dy [rows, 2w] with x: give it a dy of that shape.
    std::vector<float> dy_wide(rows * cols);
    for (size_t i = 0; i < dy_wide.size(); ++i) dy_wide[i] = dy[i % dy.size()];
    auto ddy_wide = DevT<bf16>(dy_wide);
    Fp8Source src{dx->get(), c.act, nullptr};
    if (c.grad) src.dact = swiglu ? ddy->get() : ddy_wide->get();
    const float scale = 40.0f;
    const Fp8Format f = c.grad ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
    Dev<float> dscale(std::vector<float>{scale}), amax(std::vector<float>{0.0f}),
        amax_only(std::vector<float>{0.0f}), dbias(std::vector<float>(cols, 0.25f)),
        workspace(Fp8BiasWorkspace(rows, cols));
    Dev<uint8_t> q(rows * cols), qt(rows * cols);
    CastSourceToFp8(q.get(), qt.get(), amax.get(), src, rows, cols, dscale.get(), f, dbias.get(),
                    workspace.get(), MainStream());
    CastSourceToFp8(nullptr, nullptr, amax_only.get(), src, rows, cols, dscale.get(), f, nullptr,
                    nullptr, MainStream());
    const auto got = q.Download(), got_t = qt.Download();
    double want_amax = 0;
    std::vector<double> sums(cols, 0.25), mags(cols, 0.0);
    size_t bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        const double v = want[r * cols + j], vs = v * scale;
        want_amax = std::max(want_amax, std::fabs(v));
        sums[j] += v;
        mags[j] += std::fabs(v);
        const double g = Decode(got[r * cols + j], f);
        // Rounding is monotonic: the byte lies between the roundings of the value's error
        // interval (zeros of either sign equal: an activation's sign of zero carries nothing).
        const double slack = 1e-4 * scale * terms[r * cols + j];
        const bool ok = g >= RoundFp8(static_cast<float>(vs - slack), f) &&
                        g <= RoundFp8(static_cast<float>(vs + slack), f);
        if (!ok && bad++ < 5)
          ADD_FAILURE() << r << "," << j << ": x "
                        << (swiglu ? x[r * 2 * w + j % w] : x[r * cols + j]) << ", value x scale "
                        << vs << " cast to " << g;
        ASSERT_EQ(got_t[j * rows + r], got[r * cols + j]) << r << "," << j;
      }
    }
    EXPECT_EQ(bad, 0u);
    EXPECT_NEAR(amax.Download()[0], want_amax, 1e-4 * want_amax);
    EXPECT_EQ(amax_only.Download()[0], amax.Download()[0]);
    const auto got_bias = dbias.Download();
    for (int64_t j = 0; j < cols; ++j)
      ASSERT_NEAR(got_bias[j], sums[j], 1e-4 * mags[j] + 1e-6) << "column " << j;
  }
}

// A norm writing its output cast to FP8 (Fp8Out) writes the bytes CastToFp8 gives for the bf16
// output the same norm writes otherwise (checked against CpuOps by kernels_norm_test), and the
// amax of that output; LayerNorm and RMSNorm, with the residual add and dropout, on the
// vectorised and the looping paths. Then TransposeFp8 of those bytes.
TEST_F(Fp8Test, NormsWriteTheCastOfTheirOutput) {
  for (const bool rms : {false, true}) {
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{1000, 1280}, {36, 132}, {16, 6144}}) {
      SCOPED_TRACE(testing::Message() << (rms ? "rms " : "ln ") << rows << "x" << cols);
      const auto res = RoundT<bf16>(Rand(rows * cols, 190, 2.0f, 0.3f));
      const auto br = RoundT<bf16>(Rand(rows * cols, 191));
      const auto w = Rand(cols, 192, 0.5f, 1.0f), b = Rand(cols, 193);
      auto dres = DevT<bf16>(res), dbr = DevT<bf16>(br);
      Dev<float> dw(w), db(b), mean(rows), rstd(rows), scale(std::vector<float>{3.0f});
      Dev<float> amax(std::vector<float>{0.0f}), amax_ref(std::vector<float>{0.0f});
      Dev<bf16> x_out(rows * cols), out(rows * cols);
      Dev<uint8_t> q(rows * cols), q_ref(rows * cols), qt(rows * cols);
      const HiddenDropout drop = TestDropout(0.1f);
      const Fp8Out fp8{q.get(), scale.get(), amax.get(), Fp8Format::kE4M3};
      for (const bool cast : {false, true}) {
        bf16* o = cast ? nullptr : out.get();
        const Fp8Out f = cast ? fp8 : Fp8Out{};
        if (rms) {
          AddRmsNormForward<bf16>(x_out.get(), o, rstd.get(), dres->get(), dbr->get(), dw.get(),
                                  rows, cols, 1e-5f, drop, MainStream(), nullptr, f);
        } else {
          AddLayerNormForward<bf16>(x_out.get(), o, mean.get(), rstd.get(), dres->get(), dbr->get(),
                                    dw.get(), db.get(), rows, cols, 1e-5f, drop, MainStream(),
                                    nullptr, f);
        }
      }
      CastToFp8<bf16>(q_ref.get(), nullptr, amax_ref.get(), out.get(), rows, cols, scale.get(),
                      Fp8Format::kE4M3, MainStream());
      const auto got = q.Download(), want = q_ref.Download();
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
      EXPECT_EQ(bad, 0u);
      EXPECT_EQ(amax.Download()[0], amax_ref.Download()[0]);
      TransposeFp8(qt.get(), q.get(), rows, cols, MainStream());
      const auto t = qt.Download();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(t[c * rows + r], got[r * cols + c]) << r << "," << c;
    }
  }
}

// TransformerEngine's update: scale = max / amax / 2^margin; amax 0, inf or NaN keep the scale.
TEST_F(Fp8Test, ScaleUpdate) {
  for (float amax_v : {3.5f, 0.0f, INFINITY, NAN}) {
    Dev<float> scale(std::vector<float>{7.0f}), inv(std::vector<float>{1.0f / 7}),
        amax(std::vector<float>{amax_v});
    ComputeFp8Scale(scale.get(), inv.get(), amax.get(), Fp8Format::kE5M2, 1.0f, MainStream());
    const float want = amax_v == 3.5f ? 57344.0f / 3.5f / 2.0f : 7.0f;
    EXPECT_EQ(scale.Download()[0], want) << amax_v;
    EXPECT_EQ(inv.Download()[0], amax_v == 3.5f ? 1.0f / want : 1.0f / 7) << amax_v;
  }
}

// Delayed scaling against a host model of TransformerEngine's update (amax from the whole history
// or the newest entry, the roll, history[0] cleared, the scale from it unless 0 or not finite),
// over steps whose casts record amax values, including 0 and NaN steps; three tensors updated
// by one call, each from its own row.
TEST_F(Fp8Test, DelayedScalingHistoryFollowsTheHostModel) {
  constexpr int kTensors = 3;
  for (const int len : {1, 4, 16}) {
    for (const bool most_recent : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << "history " << len << (most_recent ? " most_recent" : " max"));
      const Fp8Format f = Fp8Format::kE4M3;
      const float margin = 1.0f;
      std::vector<float> h(kTensors * len, 0.0f), scale(kTensors, 1.0f), scale_inv(kTensors, 1.0f);
      Dev<float> dh(h), ds(scale), dsi(scale_inv);
      const auto amaxes = Rand(40 * kTensors, 175, 50.0f);
      for (int step = 0; step < 40; ++step) {
        for (int t = 0; t < kTensors; ++t) {
          // This step's casts record their amax into row[0] (as CastToFp8's amax does).
          float* row = h.data() + t * len;
          float a = std::fabs(amaxes[step * kTensors + t]);
          if (step % 13 == 5 + t) a = 0.0f;
          if (step % 17 == 9 - t) a = NAN;
          row[0] = std::isnan(a) ? row[0] : std::max(row[0], a);
        }
        LT_CUDA_CHECK(
            cudaMemcpy(dh.get(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
        UpdateFp8DelayedScales(dh.get(), kTensors, len, most_recent, ds.get(), dsi.get(), 1, f,
                               margin, MainStream());
        for (int t = 0; t < kTensors; ++t) {
          float* row = h.data() + t * len;
          float used = row[0];
          if (!most_recent)
            for (int i = 0; i < len; ++i) used = std::max(used, row[i]);
          const float newest = row[0];
          for (int i = 0; i + 1 < len; ++i) row[i] = row[i + 1];
          row[len - 1] = newest;
          row[0] = 0.0f;
          if (used > 0.0f && std::isfinite(used)) {
            scale[t] = 448.0f / used / 2.0f;
            scale_inv[t] = 1.0f / scale[t];
          }
        }
        ASSERT_EQ(dh.Download(), h) << "step " << step;
        ASSERT_EQ(ds.Download(), scale) << "step " << step;
        ASSERT_EQ(dsi.Download(), scale_inv) << "step " << step;
      }
    }
  }
}

// D = sa·sb·A·Bᵀ for each operand pairing the recipes use (E4M3 x E4M3; E4M3 x E5M2 either way),
// bf16 out and fp32 accumulation, against the float64 product of the decoded operands. Every
// product of two FP8 values is exact; Hopper's FP8 tensor cores add them in an accumulator of
// about 14 bits (cuBLASLt moves the partial sums to fp32 between instructions unless fast_accum),
// so the bound is 2^-12 (2^-11 with fast_accum) of Σ|a·b|, plus the output's own rounding
// (bf16: 2^-8 relative).
TEST_F(Fp8Test, ProductsMatchTheDequantisedProduct) {
  struct Case {
    Fp8Format a, b;
    cudaDataType_t d;
    bool accumulate, fast;
  };
  const int64_t m = 96, n = 80, k = 128;
  for (const Case& c : {Case{Fp8Format::kE4M3, Fp8Format::kE4M3, CUDA_R_16BF, false, true},
                        Case{Fp8Format::kE5M2, Fp8Format::kE4M3, CUDA_R_16BF, false, false},
                        Case{Fp8Format::kE4M3, Fp8Format::kE5M2, CUDA_R_32F, true, false}}) {
    SCOPED_TRACE(testing::Message() << "a " << int(c.a) << " b " << int(c.b) << " fp32 "
                                    << (c.d == CUDA_R_32F) << " fast " << c.fast);
    const auto xa = Rand(m * k, 172, 3.0f), xb = Rand(n * k, 173, 3.0f);
    Dev<float> da(xa), db(xb), one(std::vector<float>{1.0f});
    Dev<uint8_t> qa(m * k), qb(n * k);
    CastToFp8<float>(qa.get(), nullptr, nullptr, da.get(), m, k, one.get(), c.a, MainStream());
    CastToFp8<float>(qb.get(), nullptr, nullptr, db.get(), n, k, one.get(), c.b, MainStream());
    const float sa = 0.5f, sb = 4.0f;
    Dev<float> dsa(std::vector<float>{sa}), dsb(std::vector<float>{sb});
    const auto ha = qa.Download(), hb = qb.Download();
    std::vector<float> init = Rand(m * n, 174);
    std::vector<double> want(m * n), bound(m * n);
    const double accum = std::ldexp(1.0, c.fast ? -11 : -12);
    const double out_rel = c.d == CUDA_R_32F ? std::ldexp(1.0, -22) : std::ldexp(1.0, -8);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) {
        double sum = 0, abs_sum = 0;
        for (int64_t t = 0; t < k; ++t) {
          const double p = Decode(ha[i * k + t], c.a) * Decode(hb[j * k + t], c.b);
          sum += p;
          abs_sum += std::fabs(p);
        }
        const double w = sa * sb * sum + (c.accumulate ? init[j * m + i] : 0);
        want[j * m + i] = w;
        bound[j * m + i] = accum * sa * sb * abs_sum + out_rel * std::fabs(w) + 1e-30;
      }
    }
    auto check = [&](const std::vector<float>& got) {
      double worst = 0;
      size_t bad = 0;
      for (size_t e = 0; e < got.size(); ++e) {
        const double r = std::fabs(got[e] - want[e]) / bound[e];
        worst = std::max(worst, r);
        bad += !(r <= 1.0);
      }
      EXPECT_EQ(bad, 0u) << "worst |got - want| / bound " << worst;
      std::printf("FP8 product: worst |got - want| / bound %.3f\n", worst);
    };
    Fp8Matmul mm;
    if (c.d == CUDA_R_32F) {
      Dev<float> d(init);
      mm.Gemm(m, n, k, {qa.get(), c.a, dsa.get()}, {qb.get(), c.b, dsb.get()}, d.get(), c.d, m,
              c.accumulate, c.fast);
      check(d.Download());
    } else {
      Dev<bf16> d(m * n);
      mm.Gemm(m, n, k, {qa.get(), c.a, dsa.get()}, {qb.get(), c.b, dsb.get()}, d.get(), c.d, m,
              c.accumulate, c.fast);
      check(DownF(d));
    }
  }
}

}  // namespace
}  // namespace leantron::trainer::cuda
