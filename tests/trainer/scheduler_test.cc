// The learning-rate schedules against Megatron's shapes.
#include "trainer/core/scheduler.h"

#include <cmath>

#include "gtest/gtest.h"

namespace leantron::trainer {
namespace {

TEST(SchedulerTest, MegatronShapes) {
  LrSchedule s;
  s.max_lr = 1.0;
  s.min_lr = 0.1;
  s.warmup_iters = 10;
  s.decay_iters = 110;
  s.style = DecayStyle::kLinear;
  EXPECT_DOUBLE_EQ(s.At(0), 0.0);
  EXPECT_DOUBLE_EQ(s.At(5), 0.5);
  EXPECT_DOUBLE_EQ(s.At(10), 1.0);
  EXPECT_DOUBLE_EQ(s.At(60), 0.55);
  EXPECT_DOUBLE_EQ(s.At(200), 0.1);
  s.style = DecayStyle::kCosine;
  EXPECT_NEAR(s.At(60), 0.55, 1e-12);
  EXPECT_NEAR(s.At(35), 0.1 + 0.9 * 0.5 * (std::cos(M_PI * 0.25) + 1), 1e-12);
  s.style = DecayStyle::kConstant;
  EXPECT_DOUBLE_EQ(s.At(100), 1.0);
  s.style = DecayStyle::kWsd;
  s.wsd_decay_iters = 20;
  s.wsd_style = WsdDecayStyle::kLinear;
  EXPECT_DOUBLE_EQ(s.At(90), 1.0);
  EXPECT_DOUBLE_EQ(s.At(100), 0.55);
  EXPECT_DOUBLE_EQ(s.At(110), 0.1);
}

}  // namespace
}  // namespace leantron::trainer
