// The linear layers in FP8 (tp_linear.h with fp8_products.h) against float64 products of their
// bf16 inputs: the forward, the data gradient, the weight gradient and the bias gradient of a
// column-parallel and a row-parallel layer, for both formats and both recipes. Each element stays
// within the FP8 rounding bound of its sum (every operand rounded by at most half a step of its
// format: 2^-4 relative for E4M3, 2^-3 for E5M2, plus the accumulation and the output's rounding),
// and the error's RMS stays near what rounding to the format gives: a wrong scale, layout or
// operand is off by the size of the result itself. Delayed scaling is checked on its second step,
// with the scales its first step recorded (gradients scaled small, so that the first step's scale
// of 1 would have flushed them).
#include <algorithm>
#include <cmath>

#include "tests/gpu/gpu_test_util.h"
#include "trainer/cuda/device_memory.h"
#include "trainer/cuda/fp8_products.h"
#include "trainer/cuda/parallel/tp_linear.h"

namespace leantron::trainer::cuda {
namespace {

using namespace testutil;

constexpr int64_t kRows = 256, kIn = 128, kOut = 192;

struct Product {
  std::vector<double> value, magnitude;  // Σ a·b and Σ |a·b|
};

// C[i, j] = Σ_k A(i, k)·B(j, k) for A [m, kk] and B [n, kk] given by accessors.
template <typename FA, typename FB>
Product Multiply(int64_t m, int64_t n, int64_t kk, FA a, FB b) {
  Product p{std::vector<double>(m * n), std::vector<double>(m * n)};
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < kk; ++k) {
        const double v = static_cast<double>(a(i, k)) * b(j, k);
        s += v;
        mag += std::fabs(v);
      }
      p.value[i * n + j] = s;
      p.magnitude[i * n + j] = mag;
    }
  }
  return p;
}

// got (minus `before`, what it held before accumulating) against want (+ `addend`): every element
// within `rel` of Σ|a·b| plus the output's rounding, and the RMS error within `rms_rel` of the
// RMS result.
::testing::AssertionResult WithinFp8(const std::vector<float>& got, const Product& want, double rel,
                                     double rms_rel, double out_rel,
                                     const std::vector<float>* addend = nullptr) {
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double ref = want.value[i] + (addend ? (*addend)[i % addend->size()] : 0.0);
    const double d = std::fabs(got[i] - ref);
    const double bound = rel * want.magnitude[i] + out_rel * std::fabs(ref) + 1e-30;
    if (!(d <= bound))
      return ::testing::AssertionFailure()
             << "[" << i << "] got " << got[i] << " want " << ref << " bound " << bound;
    err2 += d * d;
    ref2 += ref * ref;
  }
  const double r = std::sqrt(err2 / ref2);
  if (!(r <= rms_rel))
    return ::testing::AssertionFailure() << "RMS error " << r << " of the RMS result";
  return ::testing::AssertionSuccess() << "RMS error " << r;
}

class Fp8LinearTest : public GpuTest {};

// Two FP8 linear layers' context: kRows rows, layers up to max(kIn, kOut) wide.
struct Rig {
  static Fp8Options Options(bool delayed, bool hybrid) {
    Fp8Options o;
    o.enabled = true;
    o.hybrid = hybrid;
    o.delayed = delayed;
    o.amax_history_len = 4;
    o.amax_most_recent = false;
    return o;
  }
  Rig(bool delayed, bool hybrid)
      : tp(nullptr, false, RowGeometry{kRows, kRows, 0, kIn}, false, &prof),
        scaling(Options(delayed, hybrid), 2, &memory),
        products(&scaling, kRows, std::max(kIn, kOut), std::max(kIn, kOut), &memory) {
    ctx.mm = &mm;
    ctx.tp = &tp;
    ctx.prof = &prof;
    ctx.bias_grad = memory.Alloc<float>(kOut);
    ctx.scratch = {memory.Alloc<char>(8 << 20), size_t{8} << 20};
    ctx.fp8 = &products;
  }
  DeviceMemory memory;
  OpProfile prof{/*detailed=*/false, /*by_precision=*/true};
  Matmul mm{/*tune=*/false};
  TensorParallel tp;
  Fp8Scaling scaling;
  Fp8Products products;
  LinearContext ctx;
};

TEST_F(Fp8LinearTest, ColumnAndRowLayersFollowTheFloat64Products) {
  for (const bool delayed : {false, true}) {
    for (const bool hybrid : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << (delayed ? "delayed" : "tensorwise") << (hybrid ? " hybrid" : " e4m3"));
      Rig rig(delayed, hybrid);
      DeviceMemory& memory = rig.memory;
      Fp8Scaling& scaling = rig.scaling;
      const LinearContext& ctx = rig.ctx;

      // Inputs as bf16 holds them; gradients small (1e-4), as a loss scaled by tokens makes them.
      const auto x = RoundT<bf16>(Rand(kRows * kIn, 1, 1.0f));
      const auto w1 = RoundT<bf16>(Rand(kOut * kIn, 2, 0.05f));
      const auto b1 = RoundT<bf16>(Rand(kOut, 3, 0.1f));
      const auto g1 = RoundT<bf16>(Rand(kRows * kOut, 4, 1e-4f));
      const auto w2 = RoundT<bf16>(Rand(kIn * kOut, 5, 0.05f));
      const auto b2 = RoundT<bf16>(Rand(kIn, 6, 0.1f));
      const auto g2 = RoundT<bf16>(Rand(kRows * kIn, 7, 1e-4f));
      auto dx = DevT<bf16>(x), dw1 = DevT<bf16>(w1), db1 = DevT<bf16>(b1), dg1 = DevT<bf16>(g1);
      auto dw2 = DevT<bf16>(w2), db2 = DevT<bf16>(b2), dg2 = DevT<bf16>(g2);
      Dev<bf16> out1(kRows * kOut), din1(kRows * kIn), din2(kRows * kOut);
      Dev<float> gw1(kOut * kIn), gb1(kOut), gw2(kIn * kOut), gb2(kIn);
      bf16* partial = memory.Alloc<bf16>(kRows * kIn);
      const RowParallelBuffers row_out{partial, partial, nullptr};

      ColumnParallelLinear col(ctx, kIn, kOut, dw1->get(), db1->get(), gw1.get(), gb1.get(), true);
      RowParallelLinear row(ctx, row_out, kOut, kIn, dw2->get(), db2->get(), gw2.get(), gb2.get(),
                            true);
      RowParallelOutput y;
      for (int step = 0; step < (delayed ? 2 : 1); ++step) {
        scaling.NewWeights(nullptr);  // what the model does at each new version of the weights
        for (Dev<float>* g : {&gw1, &gb1, &gw2, &gb2})
          LT_CUDA_CHECK(cudaMemsetAsync(g->get(), 0, g->size() * sizeof(float), MainStream()));
        col.Forward("matmul fwd col", dx->get(), out1.get());
        y = row.Forward("matmul fwd row", out1.get());
        row.Backward("matmul bwd row", dg2->get(), out1.get(), din2.get());
        col.Backward("matmul bwd col", dg1->get(), dx->get(), din1.get());
      }
      ASSERT_EQ(y.local, partial);
      ASSERT_EQ(y.addend, nullptr);

      const double e4 = 1.0 / 16, g_rel = hybrid ? 1.0 / 8 : 1.0 / 16;
      const double fwd = (1 + e4) * (1 + e4) - 1 + 1.0 / 2048;  // fast accumulation
      const double bwd = (1 + e4) * (1 + g_rel) - 1 + 1.0 / 4096;
      const double rms_fwd = 0.06, rms_bwd = hybrid ? 0.09 : 0.06;
      const double bf16_out = 1.0 / 256;
      // Column forward: out1 = x · w1ᵀ + b1.
      const auto h1 = DownF(out1);
      const Product p1 = Multiply(
          kRows, kOut, kIn, [&](int64_t i, int64_t k) { return x[i * kIn + k]; },
          [&](int64_t j, int64_t k) { return w1[j * kIn + k]; });
      EXPECT_TRUE(WithinFp8(h1, p1, fwd, rms_fwd, bf16_out, &b1)) << "column forward";
      // Row forward: partial = out1 · w2ᵀ + b2 (out1 as the GPU left it).
      const Product p2 = Multiply(
          kRows, kIn, kOut, [&](int64_t i, int64_t k) { return h1[i * kOut + k]; },
          [&](int64_t j, int64_t k) { return w2[j * kOut + k]; });
      std::vector<bf16> part_raw(kRows * kIn);
      LT_CUDA_CHECK(cudaMemcpy(part_raw.data(), partial, part_raw.size() * sizeof(bf16),
                               cudaMemcpyDeviceToHost));
      EXPECT_TRUE(WithinFp8(FromT<bf16>(part_raw), p2, fwd, rms_fwd, bf16_out, &b2))
          << "row forward";
      // Row backward: din2 = g2 · w2, dW2 = g2ᵀ · out1, db2 = Σ g2.
      const Product pd2 = Multiply(
          kRows, kOut, kIn, [&](int64_t i, int64_t k) { return g2[i * kIn + k]; },
          [&](int64_t j, int64_t k) { return w2[k * kOut + j]; });
      EXPECT_TRUE(WithinFp8(DownF(din2), pd2, bwd, rms_bwd, bf16_out)) << "row data gradient";
      const Product pw2 = Multiply(
          kIn, kOut, kRows, [&](int64_t i, int64_t r) { return g2[r * kIn + i]; },
          [&](int64_t j, int64_t r) { return h1[r * kOut + j]; });
      EXPECT_TRUE(WithinFp8(gw2.Download(), pw2, bwd, rms_bwd, 1e-6)) << "row weight gradient";
      // Column backward: din1 = g1 · w1, dW1 = g1ᵀ · x, db1 = Σ g1.
      const Product pd1 = Multiply(
          kRows, kIn, kOut, [&](int64_t i, int64_t k) { return g1[i * kOut + k]; },
          [&](int64_t j, int64_t k) { return w1[k * kIn + j]; });
      EXPECT_TRUE(WithinFp8(DownF(din1), pd1, bwd, rms_bwd, bf16_out)) << "column data gradient";
      const Product pw1 = Multiply(
          kOut, kIn, kRows, [&](int64_t i, int64_t r) { return g1[r * kOut + i]; },
          [&](int64_t j, int64_t r) { return x[r * kIn + j]; });
      EXPECT_TRUE(WithinFp8(gw1.Download(), pw1, bwd, rms_bwd, 1e-6)) << "column weight gradient";
      // The bias gradients are bf16 column sums, not FP8 products.
      for (auto [g, db, cols] : {std::tuple{&g1, &gb1, kOut}, std::tuple{&g2, &gb2, kIn}}) {
        std::vector<float> want(cols, 0.0f);
        for (int64_t r = 0; r < kRows; ++r)
          for (int64_t c = 0; c < cols; ++c) want[c] += (*g)[r * cols + c];
        EXPECT_TRUE(Close(db->Download(), want, 1e-3)) << "bias gradient";
      }
    }
  }
}

// fc1's output through the activation (act(h) [rows, ffn] from h [rows, fc1]) and the gradient
// of fc1's output from the activation's (d [rows, ffn]), in float64.
std::vector<double> Activate(Fp8Activation act, const std::vector<float>& h, int64_t ffn) {
  const bool swiglu = act == Fp8Activation::kSwiglu, tanh_approx = act == Fp8Activation::kGeluTanh;
  const int64_t fc1 = swiglu ? 2 * ffn : ffn;
  std::vector<double> a(kRows * ffn);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < ffn; ++j) {
      const double x = h[r * fc1 + j];
      if (swiglu) {
        a[r * ffn + j] = x / (1 + std::exp(-x)) * h[r * fc1 + ffn + j];
      } else if (tanh_approx) {
        a[r * ffn + j] =
            0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
      } else {
        a[r * ffn + j] = 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
      }
    }
  }
  return a;
}
std::vector<double> ActivationGrad(Fp8Activation act, const std::vector<float>& h,
                                   const std::vector<float>& d, int64_t ffn) {
  const bool swiglu = act == Fp8Activation::kSwiglu;
  const int64_t fc1 = swiglu ? 2 * ffn : ffn;
  std::vector<double> g(kRows * fc1);
  // The derivative by a central difference of the float64 activation would be approximate; the
  // closed forms instead.
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < ffn; ++j) {
      const double x = h[r * fc1 + j], dy = d[r * ffn + j];
      if (swiglu) {
        const double up = h[r * fc1 + ffn + j], s = 1 / (1 + std::exp(-x));
        g[r * fc1 + j] = dy * up * s * (1 + x * (1 - s));
        g[r * fc1 + ffn + j] = dy * x * s;
      } else if (act == Fp8Activation::kGeluTanh) {
        const double k = std::sqrt(2 / M_PI), t = std::tanh(k * (x + 0.044715 * x * x * x));
        g[r * fc1 + j] =
            dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x));
      } else {
        g[r * fc1 + j] = dy * (0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
                               x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI));
      }
    }
  }
  return g;
}

// The MLP's FP8 path (MlpBlock's): fc2's casts compute the activation of fc1's output, in the
// forward and (transposed) in the backward or kept from the forward, and fc1's output gradient is
// computed by its own cast from the activation's gradient, its bias gradient summed on the way;
// for tanh and erf GELU and SwiGLU, both recipes, against float64 products of the float64
// activation of fc1's output as the GPU left it. Under tensorwise scaling another micro-batch's
// forward runs between the forward and the backward checked. fc2's bias gradient: the column sums
// of its output gradient.
TEST_F(Fp8LinearTest, MlpActivationComputedByTheCasts) {
  for (const Fp8Activation act :
       {Fp8Activation::kGeluTanh, Fp8Activation::kGeluErf, Fp8Activation::kSwiglu}) {
    for (const bool delayed : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << "activation " << int(act) << (delayed ? " delayed" : " tensorwise"));
      Rig rig(delayed, /*hybrid=*/true);
      const int64_t fc1 = kOut, ffn = act == Fp8Activation::kSwiglu ? kOut / 2 : kOut;
      const auto x = RoundT<bf16>(Rand(kRows * kIn, 21, 1.0f));
      const auto w1 = RoundT<bf16>(Rand(fc1 * kIn, 22, 0.1f));
      const auto b1 = RoundT<bf16>(Rand(fc1, 23, 0.1f));
      const auto w2 = RoundT<bf16>(Rand(kIn * ffn, 24, 0.05f));
      const auto b2 = RoundT<bf16>(Rand(kIn, 25, 0.1f));
      const auto g2 = RoundT<bf16>(Rand(kRows * kIn, 26, 1e-4f));
      auto dx = DevT<bf16>(x), dw1 = DevT<bf16>(w1), db1 = DevT<bf16>(b1);
      auto dw2 = DevT<bf16>(w2), db2 = DevT<bf16>(b2), dg2 = DevT<bf16>(g2);
      Dev<bf16> pre(kRows * fc1), dact(kRows * ffn), din1(kRows * kIn);
      Dev<float> gw1(fc1 * kIn), gb1(fc1), gw2(kIn * ffn), gb2(kIn);
      bf16* partial = rig.memory.Alloc<bf16>(kRows * kIn);
      const RowParallelBuffers row_out{partial, partial, nullptr};
      ColumnParallelLinear col(rig.ctx, kIn, fc1, dw1->get(), db1->get(), gw1.get(), gb1.get(),
                               true);
      RowParallelLinear row(rig.ctx, row_out, ffn, kIn, dw2->get(), db2->get(), gw2.get(),
                            gb2.get(), true);
      // The inputs' transposes kept by the forward casts (MlpBlock's Acts::in_t and act_t) on
      // the first step, cast again in the backward on the second (delayed scaling).
      Dev<uint8_t> in_t(Fp8Products::KeptBytes(kRows, kIn)),
          act_t(Fp8Products::KeptBytes(kRows, ffn));
      // Tensorwise: a second micro-batch's forward (inputs 4x larger, so other scales) runs
      // between the first's forward and backward, as pipeline schedules do; the first's kept
      // transposes keep their own scales.
      std::vector<float> x4(x);
      for (float& v : x4) v *= 4.0f;  // exact in bf16
      auto dx2 = DevT<bf16>(x4);
      Dev<bf16> pre2(kRows * fc1);
      Dev<uint8_t> in_t2(Fp8Products::KeptBytes(kRows, kIn)),
          act_t2(Fp8Products::KeptBytes(kRows, ffn));
      std::vector<bf16> part_raw(kRows * kIn);  // fc2's output, before a second forward
      for (int step = 0; step < (delayed ? 2 : 1); ++step) {
        uint8_t* keep_in = step == 0 ? in_t.get() : nullptr;
        uint8_t* keep_act = step == 0 ? act_t.get() : nullptr;
        rig.scaling.NewWeights(nullptr);
        for (Dev<float>* g : {&gw1, &gb1, &gw2, &gb2})
          LT_CUDA_CHECK(cudaMemsetAsync(g->get(), 0, g->size() * sizeof(float), MainStream()));
        col.Forward("fc1", dx->get(), pre.get(), keep_in);
        row.Forward("fc2", Fp8Source{pre.get(), act}, keep_act);
        LT_CUDA_CHECK(cudaMemcpy(part_raw.data(), partial, part_raw.size() * sizeof(bf16),
                                 cudaMemcpyDeviceToHost));
        if (!delayed) {
          col.Forward("fc1", dx2->get(), pre2.get(), in_t2.get());
          row.Forward("fc2", Fp8Source{pre2.get(), act}, act_t2.get());
        }
        row.Backward("fc2 bwd", dg2->get(), Fp8Source{pre.get(), act}, dact.get(), keep_act);
        col.Backward("fc1 bwd", Fp8Source{pre.get(), act, dact.get()}, dx->get(), din1.get(),
                     keep_in);
      }
      const double e4 = 1.0 / 16, e5 = 1.0 / 8;
      const double fwd = (1 + e4) * (1 + e4) - 1 + 1.0 / 2048,
                   bwd = (1 + e4) * (1 + e5) - 1 + 1.0 / 4096;
      const double bf16_out = 1.0 / 256;
      const auto h = DownF(pre);
      const std::vector<double> a = Activate(act, h, ffn);
      const Product p2 = Multiply(
          kRows, kIn, ffn, [&](int64_t i, int64_t k) { return a[i * ffn + k]; },
          [&](int64_t j, int64_t k) { return w2[j * ffn + k]; });
      EXPECT_TRUE(WithinFp8(FromT<bf16>(part_raw), p2, fwd, 0.06, bf16_out, &b2)) << "fc2 forward";
      const Product pw2 = Multiply(
          kIn, ffn, kRows, [&](int64_t i, int64_t r) { return g2[r * kIn + i]; },
          [&](int64_t j, int64_t r) { return a[r * ffn + j]; });
      EXPECT_TRUE(WithinFp8(gw2.Download(), pw2, bwd, 0.09, 1e-6)) << "fc2 weight gradient";
      const Product pd2 = Multiply(
          kRows, ffn, kIn, [&](int64_t i, int64_t k) { return g2[i * kIn + k]; },
          [&](int64_t j, int64_t k) { return w2[k * ffn + j]; });
      const auto d = DownF(dact);
      EXPECT_TRUE(WithinFp8(d, pd2, bwd, 0.09, bf16_out)) << "the activation's gradient";
      const std::vector<double> dfc = ActivationGrad(act, h, d, ffn);
      const Product pd1 = Multiply(
          kRows, kIn, fc1, [&](int64_t i, int64_t k) { return dfc[i * fc1 + k]; },
          [&](int64_t j, int64_t k) { return w1[k * kIn + j]; });
      EXPECT_TRUE(WithinFp8(DownF(din1), pd1, bwd, 0.09, bf16_out)) << "fc1 data gradient";
      const Product pw1 = Multiply(
          fc1, kIn, kRows, [&](int64_t i, int64_t r) { return dfc[r * fc1 + i]; },
          [&](int64_t j, int64_t r) { return x[r * kIn + j]; });
      EXPECT_TRUE(WithinFp8(gw1.Download(), pw1, bwd, 0.09, 1e-6)) << "fc1 weight gradient";
      // fc1's bias gradient: fp32 sums of the gradient's values (not FP8).
      const auto got_b1 = gb1.Download();
      for (int64_t j = 0; j < fc1; ++j) {
        double sum = 0, mag = 0;
        for (int64_t r = 0; r < kRows; ++r) {
          sum += dfc[r * fc1 + j];
          mag += std::fabs(dfc[r * fc1 + j]);
        }
        ASSERT_NEAR(got_b1[j], sum, 1e-5 * mag + 1e-12) << "fc1 bias gradient " << j;
      }
      std::vector<float> want_b2(kIn, 0.0f);
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < kIn; ++c) want_b2[c] += g2[r * kIn + c];
      EXPECT_TRUE(Close(gb2.Download(), want_b2, 1e-3)) << "fc2 bias gradient";
    }
  }
}

// Delayed scaling's scales after a step: E4M3's largest finite over the amax each cast recorded
// (the input's and the weight's in E4M3, the gradient's in E5M2 under hybrid), the margin applied;
// tensorwise scaling's from the tensor cast last.
TEST_F(Fp8LinearTest, ScalesComeFromTheRecordedAmax) {
  for (const bool delayed : {false, true}) {
    DeviceMemory memory;
    Fp8Options o;
    o.enabled = true;
    o.hybrid = true;
    o.delayed = delayed;
    o.margin = 1.0f;
    Fp8Scaling scaling(o, 1, &memory);
    const auto x = RoundT<bf16>(Rand(64 * 32, 11, 3.0f));
    const auto g = RoundT<bf16>(Rand(64 * 32, 12, 1e-3f));
    auto dx = DevT<bf16>(x), dg = DevT<bf16>(g);
    Dev<uint8_t> q(64 * 32);
    scaling.Cast<bf16>(0, Fp8Scaling::kInput, dx->get(), 64, 32, q.get(), nullptr, true);
    scaling.Cast<bf16>(0, Fp8Scaling::kGrad, dg->get(), 64, 32, q.get(), nullptr, true);
    if (delayed) scaling.NewWeights(nullptr);
    float amax_x = 0, amax_g = 0;
    for (float v : x) amax_x = std::max(amax_x, std::fabs(v));
    for (float v : g) amax_g = std::max(amax_g, std::fabs(v));
    float inv[2];
    LT_CUDA_CHECK(cudaMemcpy(&inv[0], scaling.scale_inv(0, Fp8Scaling::kInput), sizeof(float),
                             cudaMemcpyDeviceToHost));
    LT_CUDA_CHECK(cudaMemcpy(&inv[1], scaling.scale_inv(0, Fp8Scaling::kGrad), sizeof(float),
                             cudaMemcpyDeviceToHost));
    EXPECT_EQ(inv[0], 1.0f / (448.0f / amax_x / 2.0f)) << (delayed ? "delayed" : "tensorwise");
    EXPECT_EQ(inv[1], 1.0f / (57344.0f / amax_g / 2.0f)) << (delayed ? "delayed" : "tensorwise");
  }
}

}  // namespace
}  // namespace leantron::trainer::cuda
