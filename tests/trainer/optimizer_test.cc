// AdamW over the flat buffers: skipped steps on non-finite gradients, Megatron's norm and weight
// decay, and the distributed optimizer's parts against one optimizer (two in-process Gloo ranks).
#include "trainer/core/optimizer.h"

#include <unistd.h>

#include <cmath>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "libckpt/layout.h"
#include "trainer/core/params.h"
#include "trainer/dist/comm_gloo.h"

namespace leantron::trainer {
namespace {

ckpt::ModelConfig TinyConfig(bool tanh_gelu) {
  ckpt::ModelConfig c = ckpt::Gpt2StyleConfig(2, 16, 2, 37, 8);
  c.make_vocab_size_divisible_by = 8;
  c.activation = tanh_gelu ? ckpt::Activation::kGeluTanh : ckpt::Activation::kGelu;
  return c;
}

TEST(OptimizerTest, NonFiniteGradientsSkipTheStepAndNormsAndDecayAreMegatrons) {
  const ckpt::ModelConfig config = TinyConfig(false);
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  auto ops = *CreateOps("cpu");
  ProcessGroups groups = SingleProcessGroups();
  ParamStore params(ops.get(), *layout, 0, 0, false);
  params.Initialize(3, 0.02);
  OptimizerOptions oo;
  oo.weight_decay = 0.1f;
  oo.clip_grad = 1.0f;
  Optimizer opt(ops.get(), &params, &groups, oo);
  const std::vector<float> before(params.data(), params.data() + params.size());

  opt.ZeroGrad();
  params.grad()[5] = NAN;
  StepResult r = opt.Step(1e-2f);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(opt.step(), 0);
  for (size_t i = 0; i < params.size(); ++i) ASSERT_EQ(params.data()[i], before[i]);

  // Finite: the reported norm is the unclipped global norm; zero gradients leave only the
  // decoupled weight decay, which spares biases and norms.
  opt.ZeroGrad();
  const ParamView* emb = params.Find("embedding.word_embeddings.weight");
  params.grad()[emb->offset] = 3.0f;
  params.grad()[emb->offset + 1] = 4.0f;
  r = opt.Step(1e-2f);
  EXPECT_FALSE(r.skipped);
  EXPECT_NEAR(r.grad_norm, 5.0, 1e-9);
  EXPECT_EQ(opt.step(), 1);
  const ParamView* ln = params.Find("decoder.layers.0.input_layernorm.weight");
  const ParamView* fc1 = params.Find("decoder.layers.0.mlp.linear_fc1.weight");
  EXPECT_EQ(params.data()[ln->offset], 1.0f);
  EXPECT_FLOAT_EQ(params.data()[fc1->offset], before[fc1->offset] * (1.0f - 1e-2f * 0.1f));
  // Clipped gradients (norm 5 → 1) move the first element by lr · sign (Adam's first step).
  EXPECT_NEAR(params.data()[emb->offset], before[emb->offset] * (1.0f - 1e-3f) - 1e-2f, 1e-6);
}

// The distributed optimizer over two in-process Gloo ranks against one optimizer stepping the
// averaged gradient: each rank steps only its part of every bucket, yet after the step both hold
// the reference's weights bit for bit, GatherState (a few elements at a time) assembles the
// reference's moments, and ScatterState hands every rank its parts back.
TEST(OptimizerTest, DistributedPartsMatchOneOptimizer) {
  const ckpt::ModelConfig config = TinyConfig(false);
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  auto gradient = [](int rank, size_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank)) * 0.01f;
  };
  OptimizerOptions oo;
  oo.weight_decay = 0.1f;
  oo.clip_grad = 0.0f;    // the reported norms differ in rounding; the updates must not
  oo.gather_window = 97;  // many windows, cutting parts in the middle

  ParamStore ref_params(ops.get(), *layout, 0, 0, false);
  ref_params.Initialize(5, 0.02);
  const size_t n = ref_params.size();
  // Buckets of about a layer: several per rank, parts of unequal length.
  OptimizerOptions ref_oo = oo;
  ref_oo.buckets = PlanDpBuckets(ref_params, 0, config.num_layers, true, true, 1000);
  ASSERT_GT(ref_oo.buckets.size(), 3u);
  ProcessGroups single = SingleProcessGroups();
  Optimizer ref(ops.get(), &ref_params, &single, ref_oo);
  std::vector<float> ref_m, ref_v;
  double ref_norm[2] = {0, 0};
  for (int step = 0; step < 2; ++step) {
    ref.ZeroGrad();
    for (size_t i = 0; i < n; ++i)
      ref_params.grad()[i] = (gradient(0, i + step) + gradient(1, i + step)) * 0.5f;
    ref.FinalizeGrads();
    const StepResult r = ref.Step(1e-2f);
    ASSERT_FALSE(r.skipped);
    ref_norm[step] = r.grad_norm;
  }
  ref.GatherState(&ref_m, &ref_v);

  const std::string dir = ::testing::TempDir() + "/dist_opt_" + std::to_string(::getpid());
  std::vector<float> got_p[2], got_m[2], got_v[2], again_m[2], again_v[2];
  size_t state[2] = {0, 0};
  double norm[2][2] = {};
  auto run = [&](int rank) {
    LaunchInfo launch;
    launch.rank = rank;
    launch.world_size = 2;
    launch.rendezvous_dir = dir;
    absl::StatusOr<ProcessGroups> groups = CreateProcessGroups(launch, {.dp = 2});
    ASSERT_TRUE(groups.ok()) << groups.status();
    ParamStore params(ops.get(), *layout, 0, 0, false);
    params.Initialize(5, 0.02);
    OptimizerOptions dist = oo;
    dist.distributed = true;
    dist.buckets = ref_oo.buckets;
    Optimizer opt(ops.get(), &params, &*groups, dist);
    state[rank] = opt.state_elements();
    for (int step = 0; step < 2; ++step) {
      opt.ZeroGrad();
      for (size_t i = 0; i < n; ++i) params.grad()[i] = gradient(rank, i + step);
      opt.FinalizeGrads();
      const StepResult r = opt.Step(1e-2f);
      ASSERT_FALSE(r.skipped);
      norm[rank][step] = r.grad_norm;  // of the averaged gradient, over both ranks' parts
    }
    got_p[rank].assign(params.data(), params.data() + n);
    opt.GatherState(&got_m[rank], &got_v[rank]);
    Optimizer fresh(ops.get(), &params, &*groups, dist);
    fresh.ScatterState(got_m[rank], got_v[rank]);
    fresh.GatherState(&again_m[rank], &again_v[rank]);
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  EXPECT_EQ(state[0] + state[1], n);
  EXPECT_LE(std::max(state[0], state[1]) - std::min(state[0], state[1]), ref_oo.buckets.size());
  for (int rank = 0; rank < 2; ++rank) {
    for (int step = 0; step < 2; ++step)
      EXPECT_NEAR(norm[rank][step], ref_norm[step], 1e-9 * ref_norm[step]) << rank << " " << step;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got_p[rank][i], ref_params.data()[i]) << "rank " << rank << " weight " << i;
      ASSERT_EQ(got_m[rank][i], ref_m[i]) << "rank " << rank << " exp_avg " << i;
      ASSERT_EQ(got_v[rank][i], ref_v[i]) << "rank " << rank << " exp_avg_sq " << i;
    }
    EXPECT_EQ(again_m[rank], got_m[rank]);
    EXPECT_EQ(again_v[rank], got_v[rank]);
  }
}

}  // namespace
}  // namespace leantron::trainer
