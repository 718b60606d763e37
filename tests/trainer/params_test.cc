// The parameter store and the data-parallel buckets over it: Megatron's initialisation whatever
// the layout, bucket plans that tile the buffer, and when the overlapped reduction starts.
#include "trainer/core/params.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "libckpt/layout.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {
namespace {

ckpt::ModelConfig TinyConfig(bool tanh_gelu) {
  ckpt::ModelConfig c = ckpt::Gpt2StyleConfig(2, 16, 2, 37, 8);
  c.make_vocab_size_divisible_by = 8;
  c.activation = tanh_gelu ? ckpt::Activation::kGeluTanh : ckpt::Activation::kGelu;
  return c;
}

TEST(ParamStoreTest, InitialisationIsLayoutIndependentAndMegatronLike) {
  ckpt::ModelConfig config = TinyConfig(false);
  auto one = ckpt::ModelLayout::Create(config, {1, 1, 1});
  auto two = ckpt::ModelLayout::Create(config, {2, 1, 1});
  auto ops = *CreateOps("cpu");
  ParamStore full(ops.get(), *one, 0, 0, false);
  ParamStore shard(ops.get(), *two, 1, 0, false);
  full.Initialize(5, 0.02);
  shard.Initialize(5, 0.02);
  // TP rank 1's fc1 rows are the second half of the full tensor's rows.
  const ParamView* f = full.Find("decoder.layers.0.mlp.linear_fc1.weight");
  const ParamView* s = shard.Find("decoder.layers.0.mlp.linear_fc1.weight");
  ASSERT_EQ(s->numel * 2, f->numel);
  for (size_t i = 0; i < s->numel; ++i)
    ASSERT_EQ(shard.data()[s->offset + i], full.data()[f->offset + s->numel + i]);
  // Output-side linears use std / sqrt(2 L); norms start at one; biases at zero; decay flags.
  auto stddev = [&](const ParamView* v) {
    double sq = 0;
    for (size_t i = 0; i < v->numel; ++i) sq += std::pow(full.data()[v->offset + i], 2);
    return std::sqrt(sq / v->numel);
  };
  EXPECT_NEAR(stddev(full.Find("decoder.layers.1.mlp.linear_fc2.weight")), 0.01, 0.002);
  EXPECT_NEAR(stddev(full.Find("decoder.layers.1.mlp.linear_fc1.weight")), 0.02, 0.003);
  EXPECT_EQ(full.Param("decoder.layers.0.input_layernorm.weight")[3], 1.0f);
  EXPECT_EQ(full.Param("decoder.layers.0.self_attention.linear_qkv.bias")[3], 0.0f);
  EXPECT_FALSE(full.Find("decoder.layers.0.input_layernorm.weight")->decay);
  EXPECT_FALSE(full.Find("decoder.layers.0.self_attention.linear_qkv.bias")->decay);
  EXPECT_TRUE(full.Find("embedding.word_embeddings.weight")->decay);
  // Replicated tensors count in the norm on TP rank 0 only.
  EXPECT_FALSE(shard.Find("decoder.layers.0.input_layernorm.weight")->count_in_norm);
  EXPECT_TRUE(shard.Find("decoder.layers.0.mlp.linear_fc1.weight")->count_in_norm);
}

// The data-parallel buckets: PlanDpBuckets over each pipeline stage's chunks tiles the stage's
// buffer, layers from the last down (each bucket's layers contiguous in the buffer), the
// embeddings and head at the end; Part cuts a bucket into disjoint runs covering it.
// Large tensors are drawn on several threads: element i is the same whatever the tensor's length
// and however it is cut into pieces (a tensor under a million elements is drawn on one thread),
// and the draws are N(0, std).
TEST(ParamStoreTest, NormalsDoNotDependOnLengthOrThreads) {
  std::vector<float> small(size_t{1} << 19), mid((size_t{1} << 22) - 7), big((size_t{1} << 22) + 3);
  FillNormal(42, "decoder.layers.0.mlp.linear_fc1.weight", 0.02, &small);
  FillNormal(42, "decoder.layers.0.mlp.linear_fc1.weight", 0.02, &mid);
  FillNormal(42, "decoder.layers.0.mlp.linear_fc1.weight", 0.02, &big);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), big.begin()));
  EXPECT_TRUE(std::equal(mid.begin(), mid.end(), big.begin()));
  double sum = 0, sq = 0;
  for (float x : big) {
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(big.size()), mean = sum / n;
  EXPECT_NEAR(mean, 0.0, 0.02 * 5 / std::sqrt(n));
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 0.02, 0.02 * 5 / std::sqrt(2 * n));
}

TEST(DpBucketTest, PlansTileTheBufferAndPartsTileTheBuckets) {
  ckpt::ModelConfig config = TinyConfig(false);
  config.num_layers = 12;
  auto layout = ckpt::ModelLayout::Create(config, {1, 2, 2});  // PP 2, 2 chunks of 3 layers each
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto ops = *CreateOps("cpu");
  for (int pp = 0; pp < 2; ++pp) {
    ParamStore params(ops.get(), *layout, 0, pp, false);
    size_t layer_numel = 0;  // one decoder layer's elements
    for (const ParamView& v : params.views())
      if (v.name.rfind("decoder.layers.", 0) == 0) layer_numel += v.numel;
    layer_numel /= 6;  // 6 layers per stage
    std::vector<int> covered(params.size(), 0);
    for (int v = 0; v < 2; ++v) {
      const auto [first, last] = layout->StageLayers(pp, v);
      // Buckets of at least two layers' worth: layers merge in pairs.
      const std::vector<DpBucket> plan =
          PlanDpBuckets(params, first, last, pp == 0 && v == 0, pp == 1 && v == 1, 2 * layer_numel);
      int expect_layer = last - first - 1;
      bool saw_end = false;
      for (const DpBucket& b : plan) {
        for (size_t i = b.offset; i < b.offset + b.numel; ++i) ++covered[i];
        if (b.first_layer < 0) {
          saw_end = true;
          continue;
        }
        EXPECT_FALSE(saw_end) << "layer buckets come first";
        EXPECT_EQ(b.last_layer, expect_layer);
        EXPECT_LE(b.first_layer, b.last_layer);
        EXPECT_LE(b.last_layer - b.first_layer, 1) << "at most two layers per bucket";
        EXPECT_EQ(b.numel, (b.last_layer - b.first_layer + 1) * layer_numel);
        expect_layer = b.first_layer - 1;
        for (int q : {1, 2, 3}) {
          size_t total = 0, at = b.offset;
          for (int r = 0; r < q; ++r) {
            const auto [pb, pe] = b.Part(r, q);
            if (pb == pe) continue;
            EXPECT_EQ(pb, at) << "parts in order, no gap";
            EXPECT_LE(pe - pb, (b.numel + q - 1) / q);
            total += pe - pb;
            at = pe;
          }
          EXPECT_EQ(total, b.numel);
        }
      }
      EXPECT_EQ(expect_layer, -1) << "every layer of the chunk in a bucket";
      // The tied word embedding (first stage) and its output-layer copy (last stage) are buckets
      // of their own, so that both copies are cut into the same parts.
      for (const char* tied : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
        const ParamView* t = params.Find(tied);
        if (t == nullptr || !saw_end) continue;
        int alone = 0;
        for (const DpBucket& b : plan) alone += b.offset == t->offset && b.numel == t->numel;
        EXPECT_EQ(alone, 1) << tied << " on stage " << pp;
      }
      EXPECT_EQ(saw_end, (pp == 0 && v == 0) || (pp == 1 && v == 1));
    }
    for (size_t i = 0; i < covered.size(); ++i) ASSERT_EQ(covered[i], 1) << "element " << i;
  }
}

// Merging three layers a bucket over 8 layers from the top: 7-5, 4-2, then 1 alone and 0 alone
// (the lowest layer's bucket is exposed at the end of the backward, so it holds nothing more).
TEST(DpBucketTest, LowestLayerHasABucketOfItsOwn) {
  ckpt::ModelConfig config = TinyConfig(false);
  config.num_layers = 8;
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto ops = *CreateOps("cpu");
  ParamStore params(ops.get(), *layout, 0, 0, false);
  size_t layer_numel = 0;
  for (const ParamView& v : params.views())
    if (v.name.rfind("decoder.layers.", 0) == 0) layer_numel += v.numel;
  layer_numel /= 8;
  const std::vector<DpBucket> plan = PlanDpBuckets(params, 0, 8, true, true, 3 * layer_numel);
  std::vector<std::pair<int, int>> layers;
  for (const DpBucket& b : plan)
    if (b.first_layer >= 0) layers.push_back({b.last_layer, b.first_layer});
  const std::vector<std::pair<int, int>> expected = {{7, 5}, {4, 2}, {1, 1}, {0, 0}};
  EXPECT_EQ(layers, expected);
}

// The reduction's start: the lowest layer after which at least kDpReduceMargin (2) times the
// reduction's time is left in the backward; none when even the top layer leaves less, or when
// nothing was measured.
TEST(DpBucketTest, ReductionStartsAsLateAsTheMarginAllows) {
  ASSERT_EQ(kDpReduceMargin, 2.0);
  const std::vector<double> left = {1.0, 6.0, 11.0, 16.0, 21.0};  // 5 ms of backward a layer
  EXPECT_EQ(DpReduceStartLayer(left, 0.5), 0);                    // 1 >= 2 x 0.5
  EXPECT_EQ(DpReduceStartLayer(left, 3.0), 1);                    // 1 < 6 <= 6
  EXPECT_EQ(DpReduceStartLayer(left, 3.5), 2);                    // 6 < 7 <= 11
  EXPECT_EQ(DpReduceStartLayer(left, 10.5), 4);                   // 16 < 21 <= 21
  EXPECT_EQ(DpReduceStartLayer(left, 11.0), -1);  // 21 < 22: start each bucket when ready
  EXPECT_EQ(DpReduceStartLayer(left, 0.0), -1);   // nothing measured
  EXPECT_EQ(DpReduceStartLayer({}, 1.0), -1);
}

}  // namespace
}  // namespace leantron::trainer
