// Sharded gradients (GradBuffers, --data-parallel-sharding-strategy optim_grads): where each
// bucket's gradient lives, and two in-process Gloo ranks summing every micro-batch's layer buckets
// through SlotGradReducer and stepping the distributed optimizer, against the same ranks with
// whole gradients (plain ZeRO-1): the same weights and moments bit for bit.
#include "trainer/core/grad_buffers.h"

#include <unistd.h>

#include <cstdio>
#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "libckpt/layout.h"
#include "tests/trainer/gloo_ranks.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/params.h"
#include "trainer/core/slot_grad_reducer.h"

namespace leantron::trainer {
namespace {

ckpt::ModelConfig SixLayers() {
  ckpt::ModelConfig c = ckpt::Gpt2StyleConfig(6, 16, 2, 37, 8);
  c.make_vocab_size_divisible_by = 8;
  return c;
}

// Each layer its own bucket: six layer buckets, and those of the embeddings and the final norm
// (one stage, tied: the word embedding is the output layer too); rank 1 of 2 owns the second half
// of each.
TEST(GradBuffersTest, LayerBucketsTakeTurnsInTwoSlots) {
  auto layout = ckpt::ModelLayout::Create(SixLayers(), {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  ParamStore params(ops.get(), *layout, 0, 0, false);
  const std::vector<DpBucket> buckets = PlanDpBuckets(params, 0, 6, true, true, 1);
  ASSERT_GT(buckets.size(), 6u);
  for (size_t i = 0; i < 6; ++i) ASSERT_EQ(buckets[i].first_layer, 5 - static_cast<int>(i));
  const size_t whole = params.size();
  EXPECT_EQ(params.grad(), params.grads().At(0));
  params.ShardGrads({buckets}, 1, 2);
  const GradBuffers& g = params.grads();
  ASSERT_TRUE(g.sharded());
  EXPECT_EQ(params.grad(), nullptr);
  size_t largest = 0, sums = 0, own = 0;
  std::set<const float*> slots;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const DpBucket& b = buckets[i];
    const GradBuffers::Bucket* k = g.Find(b.offset);
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(g.Find(b.offset + 1), nullptr);
    EXPECT_EQ(k->at, g.At(b.offset));
    EXPECT_EQ(g.At(b.offset + b.numel - 1), k->at + b.numel - 1);
    const auto [first, last] = b.Part(1, 2);
    EXPECT_EQ(k->part_begin, first);
    EXPECT_EQ(k->part_end, last);
    EXPECT_EQ(g.ReducedRunEnd(first), last);
    if (b.first_layer < 0) {  // a buffer of its own, reduced in place
      EXPECT_EQ(k->slot, -1);
      EXPECT_EQ(g.Reduced(first), k->at + (first - b.offset));
      own += b.numel;
      continue;
    }
    // Layer buckets in the backward's order: slots 0, 1, 0, 1, 0, 1.
    EXPECT_EQ(k->slot, static_cast<int>(i % 2)) << "bucket " << i;
    slots.insert(k->at);
    EXPECT_EQ(g.Reduced(first), k->sum);
    EXPECT_EQ(g.Reduced(last - 1), k->sum + (last - 1 - first));
    largest = std::max(largest, b.numel);
    sums += last - first;
  }
  EXPECT_EQ(slots.size(), 2u);
  EXPECT_EQ(g.backend_elements(), 2 * largest + own + sums);
  EXPECT_LT(g.backend_elements(), whole);
  // Every rank binds its gradients through the store: each tensor in its bucket's place.
  const ParamView* fc1 = params.Find("decoder.layers.2.mlp.linear_fc1.weight");
  EXPECT_EQ(params.Grad(fc1->name), g.At(fc1->offset));
  EXPECT_DEATH(g.Reduced(buckets[0].offset), "outside this rank's part");
}

// Slots are as many as a chunk's layer buckets take turns in (at most two), each the size of the
// largest bucket that uses it: a chunk of one layer has one slot; six layers merged into buckets
// of five and one have a slot of each size, not two of five.
TEST(GradBuffersTest, SlotsFitTheBucketsThatUseThem) {
  auto layout = ckpt::ModelLayout::Create(SixLayers(), {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  auto held = [&](const std::vector<std::vector<DpBucket>>& chunks) {
    ParamStore params(ops.get(), *layout, 0, 0, false);
    params.ShardGrads(chunks, 0, 1);
    return params.grads().backend_elements();
  };
  ParamStore params(ops.get(), *layout, 0, 0, false);
  const size_t layer = params.Find("decoder.layers.1.input_layernorm.weight")->offset -
                       params.Find("decoder.layers.0.input_layernorm.weight")->offset;
  const size_t n = params.size();  // one rank: the sums are every layer, the rest whole
  // Two virtual chunks, [0, 1) and [1, 6), one layer per bucket: one slot, then two.
  EXPECT_EQ(held({PlanDpBuckets(params, 0, 1, true, false, 1),
                  PlanDpBuckets(params, 1, 6, false, true, 1)}),
            n + 3 * layer);
  // One chunk, buckets of layers [1, 6) and [0, 1).
  const std::vector<DpBucket> merged = PlanDpBuckets(params, 0, 6, true, true, n);
  ASSERT_EQ(merged[0].numel, 5 * layer);
  ASSERT_EQ(merged[1].numel, layer);
  EXPECT_EQ(held({merged}), n + 6 * layer);
}

// A micro-batch's gradient as the backward writes it: added into each tensor's place, layer by
// layer from the top, with the model's events around; the embeddings' and head's at the end. The
// values are multiples of 2^-12 small enough that every sum is exact, so the order of the sums
// (per micro-batch, or the step's) changes no bit.
void Backward(ParamStore& params, ModelEvents* listener, int rank, int micro) {
  auto value = [&](size_t i) {
    return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + micro * 5) % 61) - 30) *
           (1.0f / 4096);
  };
  auto write = [&](const ParamView& v) {
    float* g = params.Grad(v.name);
    for (size_t j = 0; j < v.numel; ++j) g[j] += value(v.offset + j);
  };
  if (listener) listener->BackwardBegins();
  for (int l = 5; l >= 0; --l) {
    const std::string prefix = "decoder.layers." + std::to_string(l) + ".";
    for (const ParamView& v : params.views())
      if (v.name.starts_with(prefix)) write(v);
    if (listener) listener->LayerBackwardDone(l);
  }
  for (const ParamView& v : params.views())
    if (!v.name.starts_with("decoder.layers.")) write(v);
  if (listener) listener->BackwardDone();
}

TEST(GradBuffersTest, TwoRanksShardedGradientsStepAsWholeOnes) {
  auto layout = ckpt::ModelLayout::Create(SixLayers(), {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  const std::string dir = ::testing::TempDir() + "/grad_buffers_" + std::to_string(::getpid());
  // One layer per bucket, and two (6 layers: [5, 4], [3, 2], [1], [0]).
  for (size_t bucket_elements : {size_t{1}, size_t{5000}}) {
    std::vector<float> initial[2], weights[2][2], exp_avg[2][2], exp_avg_sq[2][2];
    size_t held[2][2] = {};
    auto run = [&](int rank) {
      absl::StatusOr<ProcessGroups> groups =
          DataParallelRank(dir + "_" + std::to_string(bucket_elements), rank);
      ASSERT_TRUE(groups.ok()) << groups.status();
      for (int sharded = 0; sharded < 2; ++sharded) {
        ParamStore params(ops.get(), *layout, 0, 0, false);
        const std::vector<DpBucket> buckets =
            PlanDpBuckets(params, 0, 6, true, true, bucket_elements);
        if (bucket_elements > 1) {
          ASSERT_EQ(buckets[0].first_layer, 4);
          ASSERT_EQ(buckets[0].last_layer, 5);
        }
        std::unique_ptr<SlotGradReducer> reducer;
        if (sharded) {
          params.ShardGrads({buckets}, rank, 2);
          reducer = std::make_unique<SlotGradReducer>(ops.get(), &groups->data_parallel_with_cp(),
                                                      &params.grads(), buckets);
        }
        held[rank][sharded] = params.grads().backend_elements();
        params.Initialize(9, 0.02);
        if (!sharded) initial[rank].assign(params.data(), params.data() + params.size());
        OptimizerOptions oo;
        oo.distributed = true;
        oo.buckets = buckets;
        Optimizer opt(ops.get(), &params, &*groups, oo);
        for (int step = 0; step < 3; ++step) {
          opt.ZeroGrad();
          for (int micro = 0; micro < 3; ++micro)
            Backward(params, reducer.get(), rank, micro + step);
          opt.FinalizeGrads();
          ASSERT_FALSE(opt.Step(1e-2f).skipped);
        }
        weights[rank][sharded].assign(params.data(), params.data() + params.size());
        opt.GatherState(&exp_avg[rank][sharded], &exp_avg_sq[rank][sharded]);
      }
    };
    std::thread a(run, 0), b(run, 1);
    a.join();
    b.join();
    for (int rank = 0; rank < 2; ++rank) {
      if (bucket_elements == 1) EXPECT_LT(held[rank][1], held[rank][0]);
      EXPECT_EQ(weights[rank][1], weights[rank][0]) << "rank " << rank << " " << bucket_elements;
      EXPECT_EQ(exp_avg[rank][1], exp_avg[rank][0]) << "rank " << rank;
      EXPECT_EQ(exp_avg_sq[rank][1], exp_avg_sq[rank][0]) << "rank " << rank;
    }
    EXPECT_EQ(weights[0][1], weights[1][1]);
    EXPECT_NE(weights[0][1], initial[0]);
  }
}

}  // namespace
}  // namespace leantron::trainer
