// Sharded gradients (GradBuffers, --data-parallel-sharding-strategy optim_grads) and weights
// (WeightBuffers, optim_grads_params): where each bucket's gradient and weights live, and two
// in-process Gloo ranks summing every micro-batch's layer buckets through SlotGradReducer (and
// gathering the weights through SlotWeightGatherer) and stepping the distributed optimizer,
// against the same ranks with whole gradients (plain ZeRO-1): the same weights and moments bit for
// bit.
#include "trainer/core/grad_buffers.h"

#include <unistd.h>

#include <cstdio>
#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "libckpt/dtype.h"
#include "libckpt/layout.h"
#include "tests/trainer/gloo_ranks.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/params.h"
#include "trainer/core/slot_grad_reducer.h"
#include "trainer/core/slot_weight_gatherer.h"
#include "trainer/core/weight_buffers.h"

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

// The float32 model's weights under optim_grads_params (kShardedCompute): the model reads every
// layer tensor from its bucket's slot and the embeddings from their whole buffer; the optimizer
// steps this rank's parts where they are kept.
TEST(GradBuffersTest, ShardedComputeWeightsLiveInSlotsAndParts) {
  auto layout = ckpt::ModelLayout::Create(SixLayers(), {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  ParamStore whole(ops.get(), *layout, 0, 0, false);
  const std::vector<DpBucket> buckets = PlanDpBuckets(whole, 0, 6, true, true, 1);
  ParamStore params(ops.get(), *layout, 0, 0, false, MasterWeights::kShardedCompute);
  params.ShardWeights({buckets}, 1, 2);
  params.SetShard(DpOwnedParts(buckets, 1, 2));
  const WeightBuffers& w = *params.weights();
  EXPECT_EQ(w.element_bytes(), 4u);
  EXPECT_EQ(params.bf16_copy(), nullptr);
  EXPECT_EQ(params.Bf16At(0), nullptr);
  EXPECT_EQ(params.backend_elements(), w.layout().elements());
  EXPECT_LT(params.backend_elements(), params.size());
  const ParamView* fc1 = params.Find("decoder.layers.2.mlp.linear_fc1.weight");
  const ParamView* emb = params.Find("embedding.word_embeddings.weight");
  EXPECT_EQ(params.Param(fc1->name), w.At<float>(fc1->offset));
  EXPECT_GE(w.layout().Containing(fc1->offset).slot, 0);
  EXPECT_EQ(params.Param(emb->name), w.At<float>(emb->offset));
  EXPECT_EQ(w.layout().Containing(emb->offset).slot, -1);
  for (const auto& [first, last] : params.shard()) {
    EXPECT_EQ(params.Master(first), w.Owned<float>(first));
    EXPECT_EQ(params.MasterRunEnd(first), last);
  }
  EXPECT_DEATH(params.Master(buckets[0].offset), "not in this rank's shard");
}

// The bf16 model's copy under optim_grads_params (kSharded + ShardWeights): the whole copy is
// gone, the model reads the layers from slots, the step writes this rank's parts.
TEST(GradBuffersTest, ShardedBf16CopyLivesInSlotsAndParts) {
  auto layout = ckpt::ModelLayout::Create(SixLayers(), {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  ParamStore params(ops.get(), *layout, 0, 0, false, MasterWeights::kSharded);
  const std::vector<DpBucket> buckets = PlanDpBuckets(params, 0, 6, true, true, 1);
  const size_t whole_copy = params.bf16_backend_bytes();
  EXPECT_EQ(whole_copy, (params.size() + 1) / 2 * 4);
  params.ShardWeights({buckets}, 0, 2);
  params.SetShard(DpOwnedParts(buckets, 0, 2));
  params.Initialize(3, 0.02);
  const WeightBuffers& w = *params.weights();
  EXPECT_EQ(w.element_bytes(), 2u);
  EXPECT_EQ(params.bf16_copy(), nullptr);
  EXPECT_LT(params.bf16_backend_bytes(), whole_copy);
  const ParamView* qkv = params.Find("decoder.layers.4.self_attention.linear_qkv.weight");
  EXPECT_EQ(params.Bf16At(qkv->offset), w.At<uint16_t>(qkv->offset));
  const SlotLayout::Place& k = w.layout().Containing(qkv->offset);
  ASSERT_LT(k.part_begin, k.part_end);
  EXPECT_EQ(params.Bf16Owned(k.part_begin), w.Owned<uint16_t>(k.part_begin));
  // This rank's part, written rounded to bf16 by the initialisation beside its fp32 weights.
  for (size_t f = k.part_begin; f < k.part_end; ++f)
    EXPECT_EQ(*params.Bf16Owned(f), ckpt::FloatToBFloat16(*params.Master(f))) << f;
}

// Every tensor whose name `pick` accepts reads (Param) what `want` holds at its offset (the whole
// fp32 weights in the flat order).
template <typename Pick>
void ExpectReads(ParamStore& params, Pick&& pick, const std::vector<float>& want) {
  for (const ParamView& v : params.views()) {
    if (!pick(v.name)) continue;
    const float* got = params.Param(v.name);
    for (size_t j = 0; j < v.numel; ++j)
      ASSERT_EQ(got[j], want[v.offset + j]) << v.name << "[" << j << "]";
  }
}

std::string LayerPrefix(int l) { return "decoder.layers." + std::to_string(l) + "."; }

// A micro-batch's forward as a model announces it, checking what the embeddings, head and every
// layer read when they are used.
void Forward(ParamStore& params, ModelEvents* listener, const std::vector<float>& want) {
  listener->WeightsNeeded(-1);
  ExpectReads(
      params, [](const std::string& n) { return !n.starts_with("decoder.layers."); }, want);
  for (int l = 0; l < 6; ++l) {
    listener->WeightsNeeded(l);
    ExpectReads(
        params, [&](const std::string& n) { return n.starts_with(LayerPrefix(l)); }, want);
    listener->LayerForwardDone(l);
  }
}

// A micro-batch's gradient as the backward writes it: added into each tensor's place, layer by
// layer from the top, with the model's events around; the embeddings' and head's at the end. The
// values are multiples of 2^-12 small enough that every sum is exact, so the order of the sums
// (per micro-batch, or the step's) changes no bit.
// With a `gatherer`, each layer's weights are taken before its gradient is written, and checked
// against `want`.
void Backward(ParamStore& params, ModelEvents* listener, int rank, int micro,
              ModelEvents* gatherer = nullptr, const std::vector<float>* want = nullptr) {
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
    const std::string prefix = LayerPrefix(l);
    if (gatherer) {
      gatherer->LayerBackwardBegins(l);
      ExpectReads(
          params, [&](const std::string& n) { return n.starts_with(prefix); }, *want);
    }
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

// optim_grads_params on two ranks: the float32 model's weights kept as WeightBuffers, each layer
// bucket gathered into its slot before the forward and the backward read it (SlotWeightGatherer),
// bit for bit the weights plain ZeRO-1 holds whole; a pass gathers each bucket once but the two
// the pass before left in the slots; the same weights and moments after three steps.
TEST(GradBuffersTest, TwoRanksShardedWeightsReadWhatWholeOnesHold) {
  auto layout = ckpt::ModelLayout::Create(SixLayers(), {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  const std::string dir = ::testing::TempDir() + "/weight_buffers_" + std::to_string(::getpid());
  std::vector<float> weights[2][2], exp_avg[2][2], exp_avg_sq[2][2];
  int64_t gathers[2][4] = {};
  auto run = [&](int rank) {
    absl::StatusOr<ProcessGroups> groups = DataParallelRank(dir, rank);
    ASSERT_TRUE(groups.ok()) << groups.status();
    Communicator& dp = groups->data_parallel_with_cp();
    for (int sharded = 0; sharded < 2; ++sharded) {
      ParamStore params(ops.get(), *layout, 0, 0, false,
                        sharded ? MasterWeights::kShardedCompute : MasterWeights::kWhole);
      const std::vector<DpBucket> buckets = PlanDpBuckets(params, 0, 6, true, true, 1);
      if (sharded) {
        params.ShardWeights({buckets}, rank, 2);
        params.SetShard(DpOwnedParts(buckets, rank, 2));
      }
      params.ShardGrads({buckets}, rank, 2);
      SlotGradReducer reducer(ops.get(), &dp, &params.grads(), buckets);
      std::unique_ptr<SlotWeightGatherer> gatherer;
      if (sharded)
        gatherer = std::make_unique<SlotWeightGatherer>(ops.get(), &dp, &params, buckets);
      params.Initialize(9, 0.02);
      OptimizerOptions oo;
      oo.distributed = true;
      oo.buckets = buckets;
      Optimizer opt(ops.get(), &params, &*groups, oo);
      for (int step = 0; step < 3; ++step) {
        std::vector<float> want;
        opt.GatherMaster(&want);
        if (sharded) gatherer->StepBegins();
        opt.ZeroGrad();
        for (int micro = 0; micro < 2; ++micro) {
          if (sharded) {
            Forward(params, gatherer.get(), want);
            if (step == 0) gathers[rank][2 * micro] = gatherer->gathers();
          }
          Backward(params, &reducer, rank, micro + step, gatherer.get(), &want);
          if (sharded && step == 0) gathers[rank][2 * micro + 1] = gatherer->gathers();
        }
        opt.FinalizeGrads();
        ASSERT_FALSE(opt.Step(1e-2f).skipped);
      }
      opt.GatherMaster(&weights[rank][sharded]);
      opt.GatherState(&exp_avg[rank][sharded], &exp_avg_sq[rank][sharded]);
    }
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  for (int rank = 0; rank < 2; ++rank) {
    // Six one-layer buckets: the first forward gathers all six, the backward the four below the
    // two the forward left, the next forward the four above the two the backward left.
    EXPECT_EQ(gathers[rank][0], 6) << "rank " << rank;
    EXPECT_EQ(gathers[rank][1], 10) << "rank " << rank;
    EXPECT_EQ(gathers[rank][2], 14) << "rank " << rank;
    EXPECT_EQ(gathers[rank][3], 18) << "rank " << rank;
    EXPECT_EQ(weights[rank][1], weights[rank][0]) << "rank " << rank;
    EXPECT_EQ(exp_avg[rank][1], exp_avg[rank][0]) << "rank " << rank;
    EXPECT_EQ(exp_avg_sq[rank][1], exp_avg_sq[rank][0]) << "rank " << rank;
  }
  EXPECT_EQ(weights[0][1], weights[1][1]);
}

}  // namespace
}  // namespace leantron::trainer
