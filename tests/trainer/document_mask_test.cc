// Packed sequences: Megatron's get_ltor_masks_and_position_ids as ShapeSamples works it out
// (positions restart after each EOD, the EOD ending its document; no loss where the input is EOD;
// each CP rank's chunks), and a document-masked packed sample through the float32 model equal,
// token for token, to its documents run one by one: the loss summed over tokens and every
// parameter's gradient, for GPT-2 (learned positions) and Llama-style (RoPE, grouped queries).
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "libckpt/layout.h"
#include "trainer/core/data.h"
#include "trainer/core/params.h"
#include "trainer/dist/comm.h"
#include "trainer/reference/model.h"

namespace leantron::trainer {
namespace {

constexpr int32_t kEod = 30;

TEST(ShapeSamplesTest, MegatronsMasksAndPositionIds) {
  // Two samples of 8: EODs at 2 and 5, then at 7 (the last token).
  MicroBatch mb;
  mb.tokens = {1, 2, kEod, 3, 4, kEod, 5, 6, /**/ 7, 8, 9, 1, 2, 3, 4, kEod};
  for (int i = 0; i < 16; ++i) mb.labels.push_back(100 + i);
  DataOptions o;
  o.seq_length = 8;
  o.eod = kEod;
  o.reset_position_ids = o.reset_attention_mask = o.eod_mask_loss = true;
  ShapeSamples(o, 2, &mb);
  EXPECT_EQ(mb.positions, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(mb.documents, (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0}));
  std::vector<int32_t> labels;
  for (int i = 0; i < 16; ++i) labels.push_back(i == 2 || i == 5 || i == 15 ? -1 : 100 + i);
  EXPECT_EQ(mb.labels, labels);

  // Without the flags nothing changes; with CP 2 rank 1 keeps chunks 1 and 2 of 4 (positions
  // 2, 3, 4, 5) of each sample, its positions with them, and every document id.
  MicroBatch plain = mb;
  plain.labels.assign(16, 7);
  DataOptions none;
  none.seq_length = 8;
  none.eod = kEod;
  ShapeSamples(none, 2, &plain);
  EXPECT_TRUE(plain.positions.empty() && plain.documents.empty());
  EXPECT_EQ(plain.labels, std::vector<int32_t>(16, 7));
  MicroBatch cp;
  cp.tokens = {1, 2, kEod, 3, 4, kEod, 5, 6, 7, 8, 9, 1, 2, 3, 4, kEod};
  cp.labels.assign(16, 0);
  o.cp_rank = 1;
  o.cp_size = 2;
  ShapeSamples(o, 2, &cp);
  EXPECT_EQ(cp.tokens, (std::vector<int32_t>{kEod, 3, 4, kEod, 9, 1, 2, 3}));
  EXPECT_EQ(cp.positions, (std::vector<int32_t>{2, 0, 1, 2, 2, 3, 4, 5}));
  EXPECT_EQ(cp.labels, (std::vector<int32_t>{-1, 0, 0, -1, 0, 0, 0, 0}));
  EXPECT_EQ(cp.documents.size(), 16u);
}

ckpt::ModelConfig Config(bool llama) {
  ckpt::ModelConfig c = llama ? ckpt::LlamaStyleConfig(2, 16, 24, 4, 2, 37, 12)
                              : ckpt::Gpt2StyleConfig(2, 16, 2, 37, 12);
  c.make_vocab_size_divisible_by = 8;
  return c;
}

class PackedTest : public ::testing::TestWithParam<bool> {};

TEST_P(PackedTest, PackedDocumentsEqualTheDocumentsRunOneByOne) {
  const ckpt::ModelConfig config = Config(GetParam());
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto ops = *CreateOps("cpu");
  auto self = MakeSelfCommunicator();
  ParamStore params(ops.get(), *layout, 0, 0, false);
  params.Initialize(9, 0.3);
  ModelOptions mo;
  mo.micro_batch = 1;
  mo.seq_length = 12;
  mo.hidden_dropout = mo.attention_dropout = 0.0f;
  ReferenceModel model(ops.get(), *layout, self.get(), self.get(), &params, 0, 0, mo);

  // Documents of 5, 4 and 3 tokens, each ending with EOD; random next-token labels.
  std::mt19937 rng(5);
  const std::vector<int> lengths = {5, 4, 3};
  MicroBatch packed;
  for (int len : lengths) {
    for (int t = 0; t < len; ++t) {
      packed.tokens.push_back(t + 1 == len ? kEod : static_cast<int32_t>(rng() % kEod));
      packed.labels.push_back(static_cast<int32_t>(rng() % 37));
    }
  }
  DataOptions o;
  o.seq_length = 12;
  o.eod = kEod;
  o.reset_position_ids = o.reset_attention_mask = true;
  ShapeSamples(o, 1, &packed);
  packed.training = false;

  ops->Zero(params.grad(), params.size());
  const double packed_loss = model.Forward(0, packed, nullptr);
  model.Backward(0, nullptr, 1.0f);
  const std::vector<float> packed_grad(params.grad(), params.grad() + params.size());

  // Each document alone at the start of a sample (positions 0.., plain causal attention), the
  // rest of the sample filler without loss; its gradient weighted by its share of the tokens.
  ops->Zero(params.grad(), params.size());
  double sum = 0.0;
  int start = 0;
  for (int len : lengths) {
    MicroBatch one;
    one.training = false;
    for (int t = 0; t < 12; ++t) {
      const bool in = t < len;
      one.tokens.push_back(in ? packed.tokens[start + t] : static_cast<int32_t>(rng() % kEod));
      one.labels.push_back(in ? packed.labels[start + t] : -1);
    }
    sum += model.Forward(0, one, nullptr) * len;
    model.Backward(0, nullptr, static_cast<float>(len) / 12.0f);
    start += len;
  }
  EXPECT_NEAR(packed_loss * 12, sum, 1e-5 * sum);
  for (const ParamView& v : params.views()) {
    for (size_t i = 0; i < v.numel; ++i) {
      const float want = params.grad()[v.offset + i];
      ASSERT_NEAR(packed_grad[v.offset + i], want, 2e-6 + 1e-4 * std::abs(want))
          << v.name << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PackedTest, ::testing::Values(false, true));

}  // namespace
}  // namespace leantron::trainer
