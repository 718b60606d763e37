// The float32 reference model: a whole-model gradient check of tiny GPT-2 and Llama-style models
// (every parameter tensor, sampled elements, central differences of the loss), and dropout masks
// that depend on the sample only.
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "libckpt/layout.h"
#include "trainer/core/params.h"
#include "trainer/dist/comm.h"
#include "trainer/reference/model.h"

namespace leantron::trainer {
namespace {

ckpt::ModelConfig TinyConfig(bool tanh_gelu) {
  ckpt::ModelConfig c = ckpt::Gpt2StyleConfig(2, 16, 2, 37, 8);
  c.make_vocab_size_divisible_by = 8;
  c.activation = tanh_gelu ? ckpt::Activation::kGeluTanh : ckpt::Activation::kGelu;
  return c;
}

MicroBatch TinyBatch(int64_t b, int64_t s, int64_t vocab) {
  MicroBatch mb;
  std::mt19937 rng(3);
  for (int64_t i = 0; i < b * s; ++i) {
    mb.tokens.push_back(static_cast<int32_t>(rng() % vocab));
    mb.labels.push_back(static_cast<int32_t>(rng() % vocab));
  }
  mb.labels[3] = -1;  // a masked position
  mb.training = false;
  return mb;
}

// 0: GPT-2 with erf GELU, 1: with tanh GELU, 2: Llama style (RMSNorm, SwiGLU, RoPE, grouped
// queries, untied output layer, no biases).
ckpt::ModelConfig ConfigFor(int kind) {
  if (kind < 2) return TinyConfig(kind == 1);
  ckpt::ModelConfig c = ckpt::LlamaStyleConfig(2, 16, 24, 4, 2, 37, 8);
  c.make_vocab_size_divisible_by = 8;
  return c;
}

class ModelGradTest : public ::testing::TestWithParam<int> {};

TEST_P(ModelGradTest, AnalyticGradientsMatchFiniteDifferences) {
  const ckpt::ModelConfig config = ConfigFor(GetParam());
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto ops = *CreateOps("cpu");
  auto tp = MakeSelfCommunicator();
  ParamStore params(ops.get(), *layout, 0, 0, false);
  params.Initialize(7, 0.3);  // a large std makes every path matter
  ModelOptions mo;
  mo.micro_batch = 2;
  mo.seq_length = 6;
  mo.hidden_dropout = mo.attention_dropout = 0.0f;
  ReferenceModel model(ops.get(), *layout, tp.get(), tp.get(), &params, 0, 0, mo);
  const MicroBatch mb = TinyBatch(2, 6, config.vocab_size);

  ops->Zero(params.grad(), params.size());
  model.Forward(0, mb, nullptr);
  model.Backward(0, nullptr, 1.0f);
  std::vector<float> analytic(params.grad(), params.grad() + params.size());

  std::mt19937 rng(11);
  int checked = 0;
  for (const ParamView& v : params.views()) {
    for (int k = 0; k < 6; ++k) {
      const size_t i = v.offset + rng() % v.numel;
      float* p = params.data() + i;
      const float keep = *p;
      const float eps = 1e-2f;
      *p = keep + eps;
      const double up = model.Forward(0, mb, nullptr);
      *p = keep - eps;
      const double down = model.Forward(0, mb, nullptr);
      *p = keep;
      const double numeric = (up - down) / (2.0 * eps);
      EXPECT_NEAR(analytic[i], numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << v.name << " element " << i - v.offset;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6 * static_cast<int>(params.views().size()));
}

INSTANTIATE_TEST_SUITE_P(Models, ModelGradTest, ::testing::Values(0, 1, 2));

TEST(ModelTest, DropoutChangesTheLossOnlyWhenTraining) {
  const ckpt::ModelConfig config = TinyConfig(false);
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  auto ops = *CreateOps("cpu");
  auto tp = MakeSelfCommunicator();
  ParamStore params(ops.get(), *layout, 0, 0, false);
  params.Initialize(7, 0.02);
  ModelOptions mo;
  mo.micro_batch = 2;
  mo.seq_length = 6;
  ReferenceModel model(ops.get(), *layout, tp.get(), tp.get(), &params, 0, 0, mo);
  MicroBatch mb = TinyBatch(2, 6, config.vocab_size);
  const float eval = model.Forward(0, mb, nullptr);
  mb.training = true;
  const float train1 = model.Forward(0, mb, nullptr);
  const float train2 = model.Forward(0, mb, nullptr);
  EXPECT_NE(eval, train1);
  EXPECT_EQ(train1, train2);  // masks are a function of the sample, not of call order
  mb.first_sample = 2;
  EXPECT_NE(model.Forward(0, mb, nullptr), train1);
}

}  // namespace
}  // namespace leantron::trainer
