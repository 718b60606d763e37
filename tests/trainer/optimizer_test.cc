// AdamW over the flat buffers: skipped steps on non-finite gradients, Megatron's norm and weight
// decay, the distributed optimizer's parts against one optimizer (two in-process Gloo ranks), with
// the fp32 weights whole and sharded, the step offloaded to the host against the backend's (also
// beside the next forward), and the weights a model's StepCopies update (the FP8 copies' path)
// against the plain step.
#include "trainer/core/optimizer.h"

#include <unistd.h>

#include <cmath>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "libckpt/dtype.h"
#include "libckpt/layout.h"
#include "tests/trainer/gloo_ranks.h"
#include "trainer/core/adamw.h"
#include "trainer/core/host_step_waits.h"
#include "trainer/core/params.h"

namespace leantron::trainer {
namespace {

ckpt::ModelConfig TinyConfig(bool tanh_gelu) {
  ckpt::ModelConfig c = ckpt::Gpt2StyleConfig(2, 16, 2, 37, 8);
  c.make_vocab_size_divisible_by = 8;
  c.activation = tanh_gelu ? ckpt::Activation::kGeluTanh : ckpt::Activation::kGelu;
  return c;
}

// Every tensor the bf16 model reads in fp32 (norms, embeddings) reads, through the store, exactly
// the weights `want` holds at its offset (the whole fp32 weights in the flat order).
void ExpectFp32ReadsEqual(ParamStore& params, const float* want) {
  for (const ParamView& v : params.views()) {
    if (!Bf16ModelReadsFp32(v.name)) continue;
    const float* got = params.Param(v.name);
    for (size_t j = 0; j < v.numel; ++j)
      ASSERT_EQ(got[j], want[v.offset + j]) << v.name << " " << j;
  }
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

// A model's copies of its linear layers' weights (as the bf16 model's FP8 copies): Update steps
// the weight with adamw.h's update (this file is built without contracted multiply-adds, as the
// cpu backend is), rounds it into the bf16 copy and keeps its own copy of the new values.
class RecordingCopies : public StepCopies {
 public:
  explicit RecordingCopies(ParamStore* params) : params_(params) {
    for (const ParamView& v : params->views()) {
      const std::string& name = v.name;
      if (name.find("linear_") != std::string::npos && name.ends_with(".weight")) {
        weights_.push_back({v.offset, v.numel});
      }
    }
    copies_.resize(weights_.size());
  }
  std::vector<std::pair<size_t, size_t>> CopiedWeights() const override { return weights_; }
  void WeightsWillStep() override {
    ++announced;
    // Before the first change: every copy still holds the weights it was last written with.
    for (size_t i = 0; i < weights_.size(); ++i) {
      if (!copies_[i].empty()) {
        EXPECT_EQ(copies_[i][0], *params_->Master(weights_[i].first));
      }
    }
  }
  void Update(size_t i, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
              const AdamWConstants& c, uint16_t* bf16_out) override {
    const auto [offset, numel] = weights_[i];
    EXPECT_EQ(param, params_->Master(offset));
    EXPECT_EQ(grad, params_->grad() + offset);
    EXPECT_EQ(bf16_out, params_->bf16_copy() + offset);
    copies_[i].resize(numel);
    for (size_t j = 0; j < numel; ++j) {
      AdamWElement(c, grad[j], &param[j], &exp_avg[j], &exp_avg_sq[j]);
      bf16_out[j] = ckpt::FloatToBFloat16(param[j]);
      copies_[i][j] = param[j];
    }
    ++updates;
  }
  const std::vector<float>& copy(size_t i) const { return copies_[i]; }
  int announced = 0, updates = 0;

 private:
  ParamStore* params_;
  std::vector<std::pair<size_t, size_t>> weights_;
  std::vector<std::vector<float>> copies_;
};

// The weights a StepCopies updates give the plain step's weights, moments and bf16 copy bit for
// bit; it hears of every step that changes the weights (not of skipped ones) before any change.
TEST(OptimizerTest, StepCopiesUpdateTheirWeightsAsThePlainStep) {
  const ckpt::ModelConfig config = TinyConfig(false);
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  ProcessGroups groups = SingleProcessGroups();
  OptimizerOptions oo;
  oo.weight_decay = 0.1f;
  ParamStore ref_params(ops.get(), *layout, 0, 0, false), params(ops.get(), *layout, 0, 0, false);
  ref_params.Initialize(7, 0.02);
  params.Initialize(7, 0.02);
  std::vector<uint16_t> ref_low(params.size()), low(params.size());
  ref_params.set_bf16_copy(ref_low.data());
  params.set_bf16_copy(low.data());
  Optimizer ref(ops.get(), &ref_params, &groups, oo), opt(ops.get(), &params, &groups, oo);
  RecordingCopies copies(&params);
  opt.AddStepCopies(&copies);
  const size_t weights = copies.CopiedWeights().size();
  ASSERT_EQ(weights, 4u * static_cast<size_t>(config.num_layers));
  for (int step = 0; step < 3; ++step) {
    for (ParamStore* p : {&ref_params, &params}) {
      for (size_t i = 0; i < p->size(); ++i)
        p->grad()[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i) + step)) * 0.02f;
    }
    if (step == 1) params.grad()[3] = ref_params.grad()[3] = NAN;  // skipped
    const StepResult a = ref.Step(1e-2f), b = opt.Step(1e-2f);
    ASSERT_EQ(a.skipped, b.skipped);
    ASSERT_EQ(b.skipped, step == 1);
    if (!b.skipped) {
      EXPECT_EQ(a.grad_norm, b.grad_norm);
    }
  }
  EXPECT_EQ(copies.announced, 2);
  EXPECT_EQ(copies.updates, 2 * static_cast<int>(weights));
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_EQ(params.data()[i], ref_params.data()[i]) << i;
    ASSERT_EQ(low[i], ref_low[i]) << i;
  }
  for (size_t w = 0; w < weights; ++w) {
    const auto [offset, numel] = copies.CopiedWeights()[w];
    ASSERT_EQ(copies.copy(w),
              std::vector<float>(params.data() + offset, params.data() + offset + numel));
  }
  std::vector<float> m, v, ref_m, ref_v;
  opt.GatherState(&m, &v);
  ref.GatherState(&ref_m, &ref_v);
  EXPECT_EQ(m, ref_m);
  EXPECT_EQ(v, ref_v);
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
    absl::StatusOr<ProcessGroups> groups = DataParallelRank(dir, rank);
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

// The distributed optimizer with the fp32 weights sharded too (ParamStore kSharded, as the bf16
// model's store is under --use-distributed-optimizer; kHostSharded, on the host and stepped there,
// with --optimizer-cpu-offload): each rank keeps only its parts of the fp32
// weights, yet after every step both hold the reference's bf16 copy whole and its fp32 norms and
// embeddings (the mirror) bit for bit; GatherMaster assembles the reference's fp32 weights, and
// loading a tensor rewrites this rank's part, the mirror and the bf16 copy.
TEST(OptimizerTest, ShardedMasterWeightsMatchOneOptimizer) {
  // On the backend (kSharded), and on the host with the step there (kHostSharded:
  // --optimizer-cpu-offload with the distributed optimizer).
  for (MasterWeights place : {MasterWeights::kSharded, MasterWeights::kHostSharded}) {
    const bool on_host = place == MasterWeights::kHostSharded;
    SCOPED_TRACE(on_host ? "kHostSharded" : "kSharded");
    const ckpt::ModelConfig config = TinyConfig(false);
    auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
    ASSERT_TRUE(layout.ok());
    auto ops = *CreateOps("cpu");
    auto gradient = [](int rank, size_t i) {
      return static_cast<float>(std::cos(0.53 * static_cast<double>(i) - rank)) * 0.02f;
    };
    OptimizerOptions oo;
    oo.weight_decay = 0.1f;
    oo.clip_grad = 0.0f;
    oo.gather_window = 101;

    ParamStore ref_params(ops.get(), *layout, 0, 0, false);
    ref_params.Initialize(3, 0.02);
    const size_t n = ref_params.size();
    std::vector<uint16_t> ref_low(n);
    ref_params.set_bf16_copy(ref_low.data());
    oo.buckets = PlanDpBuckets(ref_params, 0, config.num_layers, true, true, 1000);
    ASSERT_GT(oo.buckets.size(), 3u);
    ProcessGroups single = SingleProcessGroups();
    Optimizer ref(ops.get(), &ref_params, &single, oo);
    constexpr int kSteps = 3;
    for (int step = 0; step < kSteps; ++step) {
      ref.ZeroGrad();
      for (size_t i = 0; i < n; ++i)
        ref_params.grad()[i] = (gradient(0, i + step) + gradient(1, i + step)) * 0.5f;
      ref.FinalizeGrads();
      ASSERT_FALSE(ref.Step(2e-2f).skipped);
    }
    std::vector<float> ref_m, ref_v;
    ref.GatherState(&ref_m, &ref_v);
    const float* want = ref_params.data();

    const std::string dir = ::testing::TempDir() + "/sharded_master_" + std::to_string(::getpid()) +
                            (on_host ? "_host" : "");
    std::vector<float> gathered, got_m[2], got_v[2], again_m[2], again_v[2];
    std::vector<uint16_t> low[2];
    size_t backend[2] = {0, 0}, shard[2] = {0, 0}, host[2] = {0, 0};
    auto run = [&](int rank) {
      absl::StatusOr<ProcessGroups> groups = DataParallelRank(dir, rank);
      ASSERT_TRUE(groups.ok()) << groups.status();
      ParamStore params(ops.get(), *layout, 0, 0, false, place);
      params.SetShard(DpOwnedParts(oo.buckets, rank, 2));
      params.Initialize(3, 0.02);
      EXPECT_EQ(params.data(), nullptr);
      ASSERT_NE(params.bf16_copy(), nullptr);  // the store's own
      OptimizerOptions dist = oo;
      dist.distributed = true;
      dist.cpu_offload = on_host;
      dist.host_threads = 2;
      dist.offload_piece = 97;  // pieces that cut the parts and tensors in the middle
      Optimizer opt(ops.get(), &params, &*groups, dist);
      EXPECT_EQ(opt.state_on_host(), on_host);
      for (int step = 0; step < kSteps; ++step) {
        opt.ZeroGrad();
        for (size_t i = 0; i < n; ++i) params.grad()[i] = gradient(rank, i + step);
        opt.FinalizeGrads();
        ASSERT_FALSE(opt.Step(2e-2f).skipped);
      }
      float *hm = nullptr, *hv = nullptr;
      EXPECT_FALSE(opt.HostState(&hm, &hv));  // no rank holds the moments whole
      for (const auto& [b, e] : params.shard()) {
        for (size_t i = b; i < e; ++i) {
          shard[rank] += params.MirrorAt(i) == nullptr;  // the norms and embeddings: in the mirror
          ASSERT_EQ(*params.Master(i), want[i]) << rank << " " << i;
        }
      }
      {
        SCOPED_TRACE("rank " + std::to_string(rank));
        ExpectFp32ReadsEqual(params, want);  // every such tensor is in the mirror
      }
      low[rank].assign(params.bf16_copy(), params.bf16_copy() + n);
      backend[rank] = params.backend_elements();
      host[rank] = params.host_elements();
      opt.GatherMaster(rank == 0 ? &gathered : nullptr);
      opt.GatherState(&got_m[rank], &got_v[rank]);
      // A rank that writes no checkpoint takes part without receiving them.
      std::vector<float> only_m, only_v;
      opt.GatherState(rank == 0 ? &only_m : nullptr, rank == 0 ? &only_v : nullptr);
      if (rank == 0) {
        EXPECT_EQ(only_m, got_m[0]);
        EXPECT_EQ(only_v, got_v[0]);
      }
      {
        Optimizer fresh(ops.get(), &params, &*groups, dist);
        fresh.ScatterState(got_m[rank], got_v[rank]);
        fresh.GatherState(&again_m[rank], &again_v[rank]);
      }
      // Loading a tensor: this rank's part of it, its mirror and its bf16 copy.
      const ParamView* emb = params.Find("embedding.word_embeddings.weight");
      std::vector<float> values(emb->numel);
      for (size_t j = 0; j < values.size(); ++j) values[j] = 0.25f + static_cast<float>(j) / 1024;
      params.SetFromHost(*emb, values.data());
      for (size_t j = 0; j < emb->numel; ++j) {
        ASSERT_EQ(params.Param(emb->name)[j], values[j]);
        ASSERT_EQ(params.bf16_copy()[emb->offset + j], ckpt::FloatToBFloat16(values[j]));
      }
      for (const auto& [b, e] : params.shard())
        for (size_t i = std::max(b, emb->offset); i < std::min(e, emb->offset + emb->numel); ++i)
          ASSERT_EQ(*params.Master(i), values[i - emb->offset]);
    };
    std::thread a(run, 0), b(run, 1);
    a.join();
    b.join();
    size_t mirrored = 0;
    for (const ParamView& v : ref_params.views())
      mirrored += Bf16ModelReadsFp32(v.name) ? v.numel : 0;
    EXPECT_EQ(shard[0] + shard[1], n - mirrored);
    for (int rank = 0; rank < 2; ++rank) {
      if (on_host) {  // all of this rank's part on the host; only the mirror here
        size_t owned = 0;
        for (const auto& [b, e] : DpOwnedParts(oo.buckets, rank, 2)) owned += e - b;
        EXPECT_EQ(backend[rank], mirrored);
        EXPECT_EQ(host[rank], owned);
      } else {
        EXPECT_EQ(backend[rank], shard[rank] + mirrored);
        EXPECT_EQ(host[rank], 0u);
      }
      EXPECT_LT(backend[rank], n);
      EXPECT_EQ(low[rank], ref_low) << "rank " << rank;
      EXPECT_EQ(got_m[rank], ref_m);
      EXPECT_EQ(got_v[rank], ref_v);
      EXPECT_EQ(again_m[rank], ref_m);
      EXPECT_EQ(again_v[rank], ref_v);
    }
    ASSERT_EQ(gathered.size(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(gathered[i], want[i]) << "weight " << i;
  }
}

// A sharded store holds only its shard: reading another rank's weight, or writing before the
// shard is known, is a programming error, stopped at once.
TEST(OptimizerTest, ShardedMasterHoldsOnlyItsShard) {
  auto layout = ckpt::ModelLayout::Create(TinyConfig(false), {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  ParamStore early(ops.get(), *layout, 0, 0, false, MasterWeights::kSharded);
  EXPECT_DEATH(early.Initialize(1, 0.02), "before SetShard");
  ParamStore params(ops.get(), *layout, 0, 0, false, MasterWeights::kSharded);
  const ParamView* emb = params.Find("embedding.word_embeddings.weight");
  const size_t fc1 = params.Find("decoder.layers.0.mlp.linear_fc1.weight")->offset;
  params.SetShard({{emb->offset + 10, emb->offset + 20}, {fc1, fc1 + 10}, {fc1 + 40, fc1 + 50}});
  params.Initialize(1, 0.02);
  // The embedding's part is stepped where the model reads it; the rest is packed apart.
  EXPECT_EQ(params.Master(emb->offset + 10), params.Param(emb->name) + 10);
  EXPECT_EQ(params.MasterRunEnd(emb->offset + 12), emb->offset + 20);
  EXPECT_EQ(params.Master(fc1 + 40), params.Master(fc1 + 9) + 1);
  EXPECT_EQ(params.MasterRunEnd(fc1 + 3), fc1 + 10);
  size_t mirrored = 0;
  for (const ParamView& v : params.views()) mirrored += Bf16ModelReadsFp32(v.name) ? v.numel : 0;
  EXPECT_EQ(params.backend_elements(), 20 + mirrored);
  EXPECT_DEATH(params.Master(fc1 + 10), "not in this rank's shard");
  EXPECT_DEATH(params.Param("decoder.layers.0.mlp.linear_fc1.weight"), "no fp32 copy");
  EXPECT_NE(params.Param("decoder.layers.0.input_layernorm.weight"), nullptr);
}

// The same gradients g(i) in both stores, then each optimizer's FinalizeGrads and step.
template <typename G>
std::pair<StepResult, StepResult> StepBoth(Optimizer& a, ParamStore& pa, Optimizer& b,
                                           ParamStore& pb, float lr, G g) {
  for (size_t i = 0; i < pa.size(); ++i) {
    const float x = g(static_cast<double>(i));
    pa.grad()[i] = x;
    pb.grad()[i] = x;
  }
  a.FinalizeGrads();
  b.FinalizeGrads();
  const StepResult ra = a.Step(lr);
  return {ra, b.Step(lr)};
}

// `opt`'s moments are `ref`'s, and they go out through GatherState, into a fresh optimizer over
// `params` (ScatterState) and back unchanged.
void ExpectMomentsRoundTrip(Optimizer& opt, Optimizer& ref, Ops* ops, ParamStore* params,
                            ProcessGroups* groups, const OptimizerOptions& options) {
  std::vector<float> ref_m, ref_v, got_m, got_v, again_m, again_v;
  ref.GatherState(&ref_m, &ref_v);
  opt.GatherState(&got_m, &got_v);
  EXPECT_EQ(got_m, ref_m);
  EXPECT_EQ(got_v, ref_v);
  Optimizer fresh(ops, params, groups, options);
  fresh.ScatterState(got_m, got_v);
  fresh.GatherState(&again_m, &again_v);
  EXPECT_EQ(again_m, ref_m);
  EXPECT_EQ(again_v, ref_v);
}

// --optimizer-cpu-offload: the weights in (pinned) host memory, the moments and the step on the
// host threads, gradients brought down in pieces that cut tensors and ranges in the middle. Against
// the backend's optimizer on the same gradients: the same weights, bf16 copy and moments bit for
// bit; the fp32 mirror the model reads holds exactly the norms and embeddings, equal to the
// weights; the moments go out and back through GatherState / ScatterState.
TEST(OptimizerTest, OffloadedStepMatchesTheBackendsBitForBit) {
  const ckpt::ModelConfig config = TinyConfig(false);
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  ProcessGroups groups = SingleProcessGroups();
  ParamStore ref_params(ops.get(), *layout, 0, 0, false);
  ParamStore host_params(ops.get(), *layout, 0, 0, false, MasterWeights::kHost);
  ASSERT_FALSE(ref_params.host_master());
  ASSERT_TRUE(host_params.host_master());
  ref_params.Initialize(9, 0.02);
  host_params.Initialize(9, 0.02);
  const size_t n = ref_params.size();
  ASSERT_EQ(host_params.size(), n);
  std::vector<uint16_t> ref_low(n), host_low(n);
  ref_params.set_bf16_copy(ref_low.data());
  host_params.set_bf16_copy(host_low.data());

  OptimizerOptions oo;
  oo.weight_decay = 0.1f;
  oo.clip_grad = 0.5f;
  oo.buckets = PlanDpBuckets(ref_params, 0, config.num_layers, true, true, 1000);
  Optimizer ref(ops.get(), &ref_params, &groups, oo);
  OptimizerOptions off = oo;
  off.cpu_offload = true;
  off.host_threads = 3;
  off.offload_piece = 97;
  Optimizer host(ops.get(), &host_params, &groups, off);
  EXPECT_FALSE(ref.state_on_host());
  EXPECT_TRUE(host.state_on_host());
  EXPECT_EQ(host.host_threads(), 3);
  for (int step = 0; step < 4; ++step) {
    ref.ZeroGrad();
    host.ZeroGrad();
    const auto [a, b] = StepBoth(ref, ref_params, host, host_params, 3e-3f, [&](double i) {
      return static_cast<float>(std::sin(0.91 * i + step)) * 0.03f;
    });
    ASSERT_FALSE(b.skipped);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
  }
  EXPECT_EQ(host.step(), 4);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(host_params.data()[i], ref_params.data()[i]) << "weight " << i;
    ASSERT_EQ(host_low[i], ref_low[i]) << "bf16 weight " << i;
  }
  size_t mirrored = 0;
  for (const ParamView& v : host_params.views()) {
    const bool fp32 = Bf16ModelReadsFp32(v.name);
    EXPECT_EQ(v.mirror != ParamView::kNoMirror, fp32) << v.name;
    if (!fp32) continue;
    mirrored += v.numel;
    // A copy, not the weights.
    ASSERT_NE(host_params.Param(v.name), host_params.data() + v.offset) << v.name;
  }
  ExpectFp32ReadsEqual(host_params, ref_params.data());
  EXPECT_EQ(host_params.backend_elements(), mirrored);
  EXPECT_GT(mirrored, 0u);
  EXPECT_LT(mirrored, n);

  ExpectMomentsRoundTrip(host, ref, ops.get(), &host_params, &groups, off);
  // Loading rewrites the host weights and the mirror.
  const ParamView* ln = host_params.Find("decoder.final_layernorm.weight");
  std::vector<float> ones(ln->numel, 1.5f);
  host_params.SetFromHost(*ln, ones.data());
  EXPECT_EQ(host_params.data()[ln->offset], 1.5f);
  EXPECT_EQ(host_params.Param(ln->name)[ln->numel - 1], 1.5f);
  EXPECT_EQ(host_params.HostData()[ln->offset], 1.5f);
}

// The offloaded step beside the next forward (overlap_host_step): Step returns once the host step
// has started; when a layer's wait (HostStepWaits) returns, the prefix of the buffers it reads
// holds the new bf16 weights and fp32 mirror; ZeroGrad's zeroing waits until the whole step is
// finished (the loss computation's HeadWeightsNeeded); and every number is the synchronous step's,
// bit for bit.
TEST(OptimizerTest, OverlappedHostStepWaitsPerLayerAndMatchesTheSynchronousOne) {
  const ckpt::ModelConfig config = TinyConfig(false);
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  ProcessGroups groups = SingleProcessGroups();
  ParamStore sync_params(ops.get(), *layout, 0, 0, false, MasterWeights::kHost);
  ParamStore over_params(ops.get(), *layout, 0, 0, false, MasterWeights::kHost);
  sync_params.Initialize(5, 0.02);
  over_params.Initialize(5, 0.02);
  const size_t n = sync_params.size();
  std::vector<uint16_t> sync_low(n), over_low(n);
  sync_params.set_bf16_copy(sync_low.data());
  over_params.set_bf16_copy(over_low.data());

  OptimizerOptions oo;
  oo.weight_decay = 0.1f;
  oo.clip_grad = 0.5f;
  oo.cpu_offload = true;
  oo.host_threads = 3;
  oo.offload_piece = 97;
  Optimizer sync(ops.get(), &sync_params, &groups, oo);
  oo.overlap_host_step = true;
  Optimizer over(ops.get(), &over_params, &groups, oo);
  EXPECT_TRUE(over.host_step_overlapped());
  EXPECT_FALSE(sync.host_step_overlapped());
  HostStepWaits waits(&over, over_params, 0, config.num_layers);
  // Embeddings, then each layer further into the buffers; the final norm after them.
  ASSERT_GT(waits.end_of(-1), 0u);
  for (int l = 0; l < config.num_layers; ++l)
    ASSERT_GT(waits.end_of(l), l == 0 ? waits.end_of(-1) : waits.end_of(l - 1));
  ASSERT_LT(waits.end_of(config.num_layers - 1), n);
  EXPECT_EQ(waits.end_of(config.num_layers), 0u);

  auto prefix_is_sync = [&](size_t end, const std::string& what) {
    for (size_t i = 0; i < end; ++i) ASSERT_EQ(over_low[i], sync_low[i]) << what << " " << i;
    for (const ParamView& v : over_params.views()) {
      if (v.mirror == ParamView::kNoMirror || v.offset + v.numel > end) continue;
      const float* a = over_params.Param(v.name);
      const float* b = sync_params.Param(v.name);
      for (size_t j = 0; j < v.numel; ++j) ASSERT_EQ(a[j], b[j]) << what << " " << v.name;
    }
  };
  for (int step = 0; step < 4; ++step) {
    sync.ZeroGrad();
    over.ZeroGrad();
    // The last step's gradients are still being read: their zeroing waits.
    if (step > 0) {
      EXPECT_NE(over_params.grad()[1], 0.0f) << "step " << step;
    }
    // The next forward, part by part.
    waits.WeightsNeeded(-1);
    prefix_is_sync(waits.end_of(-1), "embeddings");
    for (int l = 0; l < config.num_layers; ++l) {
      waits.WeightsNeeded(l);
      prefix_is_sync(waits.end_of(l), "layer " + std::to_string(l));
    }
    waits.HeadWeightsNeeded();
    prefix_is_sync(n, "all");
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(over_params.grad()[i], 0.0f) << "gradient " << i;
    const auto [a, b] = StepBoth(sync, sync_params, over, over_params, 2e-3f, [&](double i) {
      return static_cast<float>(std::sin(0.37 * i + step)) * 0.04f;
    });
    ASSERT_FALSE(b.skipped);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
  }
  // Reading the moments finishes the step under way.
  std::vector<float> sm, sv, om, ov;
  sync.GatherState(&sm, &sv);
  over.GatherState(&om, &ov);
  EXPECT_EQ(om, sm);
  EXPECT_EQ(ov, sv);
  EXPECT_EQ(over_params.HostData(), sync_params.HostData());
  EXPECT_EQ(over_low, sync_low);
  EXPECT_GE(over.host_waited_ms(), 0.0);
}

// --optimizer-offload-fraction below 1: the last tensors (at least the fraction of the elements)
// on the host, the rest stepped by the backend at the same time. The split falls between tensors,
// only the host's norms and embeddings have a mirror, and weights, bf16 copy and moments are the
// backend optimizer's bit for bit, with the host's step beside the next forward.
TEST(OptimizerTest, PartlyOffloadedStepMatchesTheBackendsBitForBit) {
  const ckpt::ModelConfig config = TinyConfig(false);
  auto layout = ckpt::ModelLayout::Create(config, {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  ProcessGroups groups = SingleProcessGroups();
  ParamStore ref_params(ops.get(), *layout, 0, 0, false);
  ParamStore part(ops.get(), *layout, 0, 0, false, MasterWeights::kHost, 0.5);
  const size_t n = ref_params.size();
  const size_t b = part.host_begin();
  ASSERT_GT(b, 0u);
  ASSERT_LT(b, n);
  EXPECT_GE(2 * (n - b), n);  // at least half on the host
  EXPECT_TRUE(part.offloaded());
  EXPECT_FALSE(part.host_master());
  EXPECT_EQ(part.data(), nullptr);
  EXPECT_EQ(part.MasterRunEnd(0), b);
  EXPECT_EQ(part.MasterRunEnd(b), n);
  bool boundary = false;
  size_t mirrored = 0;
  for (const ParamView& v : part.views()) {
    boundary = boundary || v.offset == b;
    EXPECT_TRUE(v.offset + v.numel <= b || v.offset >= b) << v.name;
    const bool mirror = v.offset >= b && Bf16ModelReadsFp32(v.name);
    EXPECT_EQ(v.mirror != ParamView::kNoMirror, mirror) << v.name;
    if (mirror) mirrored += v.numel;
    if (v.offset < b && Bf16ModelReadsFp32(v.name)) {
      EXPECT_EQ(part.Param(v.name), part.Master(v.offset)) << v.name;  // read where it is stepped
    }
  }
  EXPECT_TRUE(boundary);
  EXPECT_EQ(part.backend_elements(), b + mirrored);
  ref_params.Initialize(3, 0.02);
  part.Initialize(3, 0.02);
  EXPECT_EQ(part.HostData(), ref_params.HostData());
  std::vector<uint16_t> ref_low(n), part_low(n);
  ref_params.set_bf16_copy(ref_low.data());
  part.set_bf16_copy(part_low.data());

  OptimizerOptions oo;
  oo.weight_decay = 0.1f;
  oo.clip_grad = 0.5f;
  Optimizer ref(ops.get(), &ref_params, &groups, oo);
  oo.cpu_offload = true;
  oo.host_threads = 2;
  oo.offload_piece = 53;
  oo.overlap_host_step = true;
  Optimizer host(ops.get(), &part, &groups, oo);
  EXPECT_EQ(host.host_state_elements(), n - b);
  HostStepWaits waits(&host, part, 0, config.num_layers);
  for (int step = 0; step < 3; ++step) {
    ref.ZeroGrad();
    host.ZeroGrad();
    waits.WeightsNeeded(-1);
    waits.HeadWeightsNeeded();
    const auto [x, y] = StepBoth(ref, ref_params, host, part, 4e-3f, [&](double i) {
      return static_cast<float>(std::cos(0.53 * i + step)) * 0.02f;
    });
    EXPECT_EQ(x.grad_norm, y.grad_norm);
  }
  host.FinishHostStep();
  EXPECT_EQ(part.HostData(), ref_params.HostData());
  EXPECT_EQ(part_low, ref_low);
  ExpectFp32ReadsEqual(part, ref_params.data());
  float *pm = nullptr, *pv = nullptr;
  EXPECT_FALSE(host.HostState(&pm, &pv));  // in two places: through GatherState
  ExpectMomentsRoundTrip(host, ref, ops.get(), &part, &groups, oo);
}

// With the weights on the host the backend has fp32 copies of the norms and embeddings only:
// asking for another tensor's is a programming error, stopped at once.
TEST(OptimizerTest, HostMasterHasNoBackendCopyOfLinearWeights) {
  auto layout = ckpt::ModelLayout::Create(TinyConfig(false), {1, 1, 1});
  ASSERT_TRUE(layout.ok());
  auto ops = *CreateOps("cpu");
  ParamStore params(ops.get(), *layout, 0, 0, false, MasterWeights::kHost);
  EXPECT_NE(params.Param("decoder.layers.0.input_layernorm.weight"), nullptr);
  EXPECT_DEATH(params.Param("decoder.layers.0.mlp.linear_fc1.weight"), "no fp32 copy");
}

}  // namespace
}  // namespace leantron::trainer
