// Whole-model gradient check of a tiny GPT (every parameter tensor, sampled elements, central
// differences of the loss), plus the learning-rate schedule and the argument checks.
#include "trainer/reference/model.h"

#include <unistd.h>

#include <cmath>
#include <random>
#include <thread>

#include "CLI/CLI.hpp"
#include "gtest/gtest.h"
#include "libckpt/layout.h"
#include "trainer/core/args.h"
#include "trainer/dist/comm_gloo.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/params.h"
#include "trainer/core/scheduler.h"

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
  ReferenceModel model(ops.get(), *layout, tp.get(), &params, 0, 0, mo);
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
  ReferenceModel model(ops.get(), *layout, tp.get(), &params, 0, 0, mo);
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

// The data-parallel buckets: PlanDpBuckets over each pipeline stage's chunks tiles the stage's
// buffer, layers from the last down (each bucket's layers contiguous in the buffer), the
// embeddings and head at the end; Part cuts a bucket into disjoint runs covering it.
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

absl::Status Check(std::vector<std::string> argv, int world) {
  CLI::App app;
  TrainArgs args;
  AddTrainFlags(app, &args);
  std::vector<std::string> full = {"train", "--num-layers",          "4",  "--hidden-size",
                                   "64",    "--num-attention-heads", "4",  "--seq-length",
                                   "32",    "--train-iters",         "10", "--lr",
                                   "1e-3",  "--global-batch-size",   "8",  "--mock-data"};
  full.insert(full.end(), argv.begin(), argv.end());
  std::vector<const char*> c;
  for (const std::string& s : full) c.push_back(s.c_str());
  app.parse(static_cast<int>(c.size()), c.data());
  args.world_size = world;
  return ValidateTrainArgs(&args);
}

TEST(ArgsTest, InconsistentSettingsAreRefusedWithOneLine) {
  EXPECT_TRUE(Check({}, 1).ok());
  EXPECT_TRUE(
      Check({"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}, 8).ok());
  auto msg = [](const absl::Status& s) { return std::string(s.message()); };
  EXPECT_EQ(msg(Check({"--tensor-model-parallel-size", "3"}, 3)),
            "--num-attention-heads 4 is not divisible by TP 3");
  EXPECT_EQ(msg(Check({"--pipeline-model-parallel-size", "3"}, 3)),
            "--num-layers 4 is not divisible by PP 3");
  EXPECT_EQ(msg(Check({"--micro-batch-size", "3"}, 1)),
            "--global-batch-size 8 is not divisible by micro-batch 3 x DP 1");
  EXPECT_EQ(msg(Check({"--tensor-model-parallel-size", "2"}, 3)),
            "world size 3 is not divisible by TP 2 x PP 1");
  EXPECT_FALSE(Check({"--data-path", "x"}, 1).ok());  // both --mock-data and --data-path
  EXPECT_EQ(msg(Check({"--fp16"}, 1)), "--fp16 is not implemented (loss scaling); use --bf16");
  EXPECT_EQ(msg(Check({"--bf16", "--ops-backend", "cpu"}, 1)), "--bf16 needs --ops-backend cuda");
  EXPECT_TRUE(Check({"--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                     "--group-query-attention", "--num-query-groups", "2"},
                    1)
                  .ok());
  EXPECT_EQ(msg(Check({"--group-query-attention", "--num-query-groups", "2",
                       "--tensor-model-parallel-size", "4"},
                      4)),
            "--num-query-groups 2 is not divisible by TP 4");
  EXPECT_FALSE(Check({"--max-position-embeddings", "16"}, 1).ok());
  EXPECT_FALSE(Check({"--lr-decay-style", "WSD"}, 1).ok());
}

TEST(ArgsTest, UnevenPipelineSplitIsCheckedLikeMegatronCore) {
  auto msg = [](const absl::Status& s) { return std::string(s.message()); };
  // 4 layers: 3 + 1, 1 + 3, 1 + 2 + 1 (both, one middle stage), 2 + 1 + 1 (first, two others).
  EXPECT_TRUE(
      Check({"--pipeline-model-parallel-size", "2", "--decoder-last-pipeline-num-layers", "1"}, 2)
          .ok());
  EXPECT_TRUE(
      Check({"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"}, 2)
          .ok());
  EXPECT_TRUE(Check({"--pipeline-model-parallel-size", "3", "--decoder-first-pipeline-num-layers",
                     "1", "--decoder-last-pipeline-num-layers", "1"},
                    3)
                  .ok());
  EXPECT_TRUE(
      Check({"--pipeline-model-parallel-size", "3", "--decoder-first-pipeline-num-layers", "2"}, 3)
          .ok());
  EXPECT_EQ(
      msg(Check({"--pipeline-model-parallel-size", "3", "--decoder-last-pipeline-num-layers", "1"},
                3)),
      "--num-layers 4 minus --decoder-last-pipeline-num-layers 1 leaves 3 layers, which do not "
      "split evenly over the other 2 pipeline stages of PP 3 (at least 1 layer each)");
  EXPECT_EQ(
      msg(Check({"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "4"},
                2)),
      "--num-layers 4 minus --decoder-first-pipeline-num-layers 4 leaves 0 layers, which do "
      "not split evenly over the other 1 pipeline stage of PP 2 (at least 1 layer each)");
  EXPECT_EQ(msg(Check({"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers",
                       "1", "--decoder-last-pipeline-num-layers", "2"},
                      2)),
            "--decoder-first-pipeline-num-layers 1 and --decoder-last-pipeline-num-layers 2 must "
            "add up to --num-layers 4 with PP 2");
  EXPECT_EQ(msg(Check({"--decoder-last-pipeline-num-layers", "2"}, 1)),
            "--decoder-last-pipeline-num-layers 2 needs PP > 1");
  EXPECT_EQ(
      msg(Check({"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "0"},
                2)),
      "--decoder-first-pipeline-num-layers must be at least 1, not 0");
  EXPECT_EQ(
      msg(Check({"--pipeline-model-parallel-size", "2", "--decoder-last-pipeline-num-layers", "-1"},
                2)),
      "--decoder-last-pipeline-num-layers must be at least 1, not -1");
  EXPECT_EQ(
      msg(Check({"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                 "1", "--decoder-last-pipeline-num-layers", "1"},
                2)),
      "--decoder-last-pipeline-num-layers 1 does not work with "
      "--num-layers-per-virtual-pipeline-stage");
  // With the flags, --num-layers need not be divisible by PP.
  EXPECT_TRUE(Check({"--num-layers", "7", "--pipeline-model-parallel-size", "2",
                     "--decoder-last-pipeline-num-layers", "3"},
                    2)
                  .ok());
  // What reaches the layout and the checkpoint's args.
  CLI::App app;
  TrainArgs args;
  AddTrainFlags(app, &args);
  app.parse("--pipeline-model-parallel-size 3 --decoder-first-pipeline-num-layers 2", false);
  const ckpt::ParallelConfig p = ParallelConfigFromArgs(args);
  EXPECT_EQ(p.pp, 3);
  EXPECT_EQ(p.first_stage_layers, 2);
  EXPECT_EQ(p.last_stage_layers, 0);
  const std::string json = TrainArgsToJson(args);
  EXPECT_NE(json.find("\"decoder_first_pipeline_num_layers\": 2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"decoder_last_pipeline_num_layers\": null"), std::string::npos) << json;
}

}  // namespace
}  // namespace leantron::trainer
