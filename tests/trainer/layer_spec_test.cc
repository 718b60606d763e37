// The layer spec's rotary frequencies against values worked out by hand: plain RoPE, and Llama
// 3.1's scaling in its three regimes (kept, divided by the factor, interpolated between).
#include "trainer/core/layer_spec.h"

#include <cmath>
#include <numbers>

#include "gtest/gtest.h"

namespace leantron::trainer {
namespace {

TEST(RopeInverseFrequenciesTest, UnscaledAreInversePowersOfTheBase) {
  // base 10000, head dim 8: 10000^(-i/4) = 1, 0.1, 0.01, 0.001.
  const std::vector<double> inv = RopeInverseFrequencies(10000.0, 8, ckpt::RopeScaling{});
  ASSERT_EQ(inv.size(), 4u);
  const double expected[] = {1.0, 0.1, 0.01, 0.001};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(inv[i], expected[i], 1e-16) << i;
  // Llama 3's base and head dim: 500000^(-2·63/128) for the last pair.
  const std::vector<double> llama = RopeInverseFrequencies(500000.0, 128, ckpt::RopeScaling{});
  ASSERT_EQ(llama.size(), 64u);
  EXPECT_DOUBLE_EQ(llama[0], 1.0);
  EXPECT_NEAR(llama[63], std::exp(-126.0 / 128.0 * std::log(500000.0)), 1e-20);
}

TEST(RopeInverseFrequenciesTest, Llama3ScalingKeepsDividesAndInterpolates) {
  // base 10000, head dim 8: wavelengths 2π/f = 6.28, 62.8, 628.3, 6283. With an original context
  // of 1000, low_freq_factor 1 and high_freq_factor 4 the thresholds are 1000/1 and 1000/4 = 250:
  // the first two are kept, the last (6283 > 1000) is divided by the factor 8, and 628.3 lies
  // between, where t = (1000/628.3 - 1)/(4 - 1) = 0.19718314363965117 and
  // f = 0.01·((1 - t)/8 + t) = 0.0029753525068469478.
  ckpt::RopeScaling s;
  s.llama3 = true;
  s.factor = 8;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_position_embeddings = 1000;
  const std::vector<double> inv = RopeInverseFrequencies(10000.0, 8, s);
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_NEAR(inv[0], 1.0, 1e-16);
  EXPECT_NEAR(inv[1], 0.1, 1e-16);
  EXPECT_NEAR(inv[2], 0.0029753525068469478, 1e-17);
  EXPECT_NEAR(inv[3], 0.001 / 8, 1e-18);
  // A larger factor moves only what is not kept.
  s.factor = 32;
  const std::vector<double> inv32 = RopeInverseFrequencies(10000.0, 8, s);
  EXPECT_EQ(inv32[0], inv[0]);
  EXPECT_EQ(inv32[1], inv[1]);
  EXPECT_NEAR(inv32[3], 0.001 / 32, 1e-18);
  EXPECT_LT(inv32[2], inv[2]);
}

TEST(RopeInverseFrequenciesTest, Llama31RegimesAndContinuity) {
  // Llama 3.1 (base 500000, head dim 128, factor 8, 1, 4, 8192): thresholds 2048 and 8192.
  // The wavelength of pair i is 2π·500000^(i/64): 1956 for i = 28, 2402 for i = 29, 6695 for
  // i = 34, 8219 for i = 35. So 29 are kept, 6 interpolated and 29 divided.
  ckpt::RopeScaling s;
  s.llama3 = true;
  const std::vector<double> plain = RopeInverseFrequencies(500000.0, 128, ckpt::RopeScaling{});
  const std::vector<double> scaled = RopeInverseFrequencies(500000.0, 128, s);
  ASSERT_EQ(scaled.size(), 64u);
  for (int i = 0; i <= 28; ++i) EXPECT_EQ(scaled[i], plain[i]) << i;
  for (int i = 35; i < 64; ++i) EXPECT_DOUBLE_EQ(scaled[i], plain[i] / 8) << i;
  for (int i = 29; i <= 34; ++i) {
    EXPECT_LT(scaled[i], plain[i]) << i;
    EXPECT_GT(scaled[i], plain[i] / 8) << i;
    // The interpolation weight falls with the wavelength from 1 at 2048 to 0 at 8192.
    const double t = (scaled[i] - plain[i] / 8) / (plain[i] - plain[i] / 8);
    const double wavelength = 2 * std::numbers::pi / plain[i];
    EXPECT_NEAR(t, (8192 / wavelength - 1) / 3, 1e-12) << i;
  }
  for (int i = 1; i < 64; ++i) EXPECT_LT(scaled[i], scaled[i - 1]) << i;  // still decreasing
}

TEST(ModelSpecTest, CarriesRopeBaseAndScalingToEveryLayer) {
  ckpt::ModelConfig c = ckpt::LlamaStyleConfig(2, 64, 128, 4, 2, 256, 64);
  c.rotary_base = 500000;
  c.rope_scaling.llama3 = true;
  c.rope_scaling.factor = 32;
  const ModelSpec spec = ModelSpecFromConfig(c, 256);
  ASSERT_EQ(spec.layers.size(), 2u);
  for (const LayerSpec& l : spec.layers) {
    EXPECT_TRUE(l.attention.rope);
    EXPECT_EQ(l.attention.rotary_base, 500000);
    EXPECT_EQ(l.attention.rope_scaling, c.rope_scaling);
  }
}

}  // namespace
}  // namespace leantron::trainer
