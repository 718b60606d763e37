// Every bf16 module of trainer/cuda/nn alone against its float32 reference module
// (trainer/reference/modules.h) built from the same LayerSpec, forward and backward, on the GPU:
// Norm (the residual add and dropout fused in), AttentionBlock, MlpBlock and a whole
// TransformerLayer for GPT-2 layers (erf and tanh GELU) and Llama layers (RMSNorm, SwiGLU, RoPE
// with Llama 3.1's scaling, grouped queries, no biases), Embedding and OutputHead. The reference
// runs on CpuOps in float32 on the same bf16-rounded inputs and weights; outputs and every
// parameter gradient must agree within bf16 accuracy (‖got − want‖ / ‖want‖), and GPU outputs are
// poisoned with NaN first so an element a module does not write fails.
#include "trainer/cuda/nn/modules.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "libckpt/layout.h"
#include "tests/gpu/gpu_test_util.h"
#include "trainer/core/layer_spec.h"
#include "trainer/core/params.h"
#include "trainer/cuda/device_memory.h"
#include "trainer/cuda/fp8_products.h"
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/matmul.h"
#include "trainer/cuda/nn/flash_attention.h"
#include "trainer/cuda/nn/transformer_layer.h"
#include "trainer/cuda/op_profile.h"
#include "trainer/cuda/parallel/tensor_parallel.h"
#include "trainer/reference/modules.h"

namespace leantron::trainer::cuda {
namespace {

using namespace testutil;

constexpr int64_t kBatch = 2, kSeq = 32, kRows = kBatch * kSeq;

// ‖got − want‖ / ‖want‖ below `tol` (NaN fails).
::testing::AssertionResult RelClose(const std::vector<float>& got, const std::vector<float>& want,
                                    double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  if (rel < tol) return ::testing::AssertionSuccess() << "relative error " << rel;
  return ::testing::AssertionFailure() << "relative error " << rel << " (limit " << tol << ")";
}

HiddenDropout Drop(float p, int site) {
  HiddenDropout d;
  d.p = p;
  d.seed = DropoutSiteSeed(11, 0, site);
  d.first_sample = 3;
  d.seq_length = kSeq;
  return d;
}

enum class Arch { kGpt2Erf, kGpt2Tanh, kLlama };

// One tiny layer and its ends, the weights random, held twice: on the host for the
// reference (linear weights rounded to bf16, as the bf16 model computes with them) and on the
// device as the bf16 model holds them (fp32, a bf16 copy, fp32 gradients).
class ModulesTest : public GpuTest {
 protected:
  void Build(Arch arch) {
    if (arch == Arch::kLlama) {
      config_ = ckpt::LlamaStyleConfig(1, 64, 128, 4, 2, 100, kSeq);
      // Scaled: wavelengths beyond 16 positions stretched, between 4 and 16 interpolated.
      config_.rope_scaling.llama3 = true;
      config_.rope_scaling.original_max_position_embeddings = 16;
    } else {
      config_ = ckpt::Gpt2StyleConfig(1, 64, 4, 100, kSeq);
      config_.activation =
          arch == Arch::kGpt2Erf ? ckpt::Activation::kGelu : ckpt::Activation::kGeluTanh;
    }
    config_.make_vocab_size_divisible_by = 64;
    config_.untie_embeddings_and_output_weights = true;
    auto layout = ckpt::ModelLayout::Create(config_, {});
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = std::make_unique<ckpt::ModelLayout>(std::move(*layout));
    spec_ = ModelSpecFromConfig(config_, layout_->padded_vocab_size());
    shard_ = ShardOf(spec_.layers[0], 1);
    h_ = spec_.hidden;
    vocab_ = layout_->padded_vocab_size();
    params_ = std::make_unique<ParamStore>(cpu_.get(), *layout_, 0, 0, false);
    params_->Initialize(5, 0.2);
    // Norms away from (1, 0) so their weights matter.
    for (const ParamView& v : params_->views()) {
      if (v.name.find("layernorm") == std::string::npos) continue;
      const auto r = Rand(v.numel, 60 + static_cast<uint32_t>(v.offset), 0.3f, 1.0f);
      std::copy(r.begin(), r.end(), params_->data() + v.offset);
    }
    const size_t n = params_->size();
    const std::vector<float> exact(params_->data(), params_->data() + n);
    rounded_ = RoundT<bf16>(exact);
    f32_ = std::make_unique<Dev<float>>(exact);
    b16_ = DevT<bf16>(exact);
    grad_ = std::make_unique<Dev<float>>(std::vector<float>(n, 0.0f));
    cpu_->Zero(params_->grad(), n);

    ref_ctx_.ops = cpu_.get();
    ref_ctx_.tp = self_.get();
    ref_ctx_.micro_batch = kBatch;
    ref_ctx_.seq_length = kSeq;
    ref_ctx_.chunks = SequenceChunks{kSeq, 0, 1};
    ref_ctx_.cp = self_.get();
    ref_ctx_.rows_full = ref_ctx_.rows_local = kRows;
    ref_positions_.resize(kRows);
    for (int64_t r = 0; r < kRows; ++r) ref_positions_[r] = static_cast<int32_t>(r % kSeq);
    ref_ctx_.chunk_positions = ref_positions_.data();
    for (float** p : {&ref_ws_.tmp_full, &ref_ws_.dfull, &ref_ws_.dfull2}) *p = Host(kRows * h_);
    ref_ws_.dqkv = Host(kRows * shard_.qkv_width);
    ref_ws_.dattn = Host(kRows * shard_.attn_width);
    ref_ws_.dfc1 = Host(kRows * shard_.fc1_width);
    ref_ws_.dact = Host(kRows * shard_.ffn);
    BindLayerTensors(
        &ref_w_, 0, [&](const std::string& s) -> const float* { return At(rounded_.data(), s); },
        [&](const std::string& s) -> const float* { return At(params_->data(), s); },
        [&](const std::string& s) { return At(params_->grad(), s); });

    RowGeometry geo{kRows, kRows, 0, h_};
    tp_ = std::make_unique<TensorParallel>(nullptr, false, geo, false, &prof_);
    const AttentionSpec& as = spec_.layers[0].attention;
    auto attention = FlashAttention::Create(
        kBatch, kSeq, shard_.heads, shard_.groups, 16,
        as.interleaved_mha() ? QkvLayout::kInterleaved : QkvLayout::kGrouped);
    ASSERT_TRUE(attention.ok()) << attention.status();
    attention_ = std::move(*attention);
    ctx_.memory = &memory_;
    ctx_.linear = {&mm_,
                   tp_.get(),
                   &prof_,
                   memory_.Alloc<float>(4 * h_),
                   {memory_.Alloc<char>(8 << 20), size_t{8} << 20}};
    ctx_.row_out.partial = ctx_.row_out.local = memory_.Alloc<bf16>(kRows * h_);
    ctx_.batch = kBatch;
    ctx_.seq = kSeq;
    ctx_.dbranch_full = memory_.Alloc<bf16>(kRows * h_);
    ctx_.dln = memory_.Alloc<bf16>(kRows * h_);
    ctx_.dqkv = memory_.Alloc<bf16>(kRows * shard_.qkv_width);
    ctx_.datt = memory_.Alloc<bf16>(kRows * shard_.attn_width);
    ctx_.dfc = memory_.Alloc<bf16>(kRows * shard_.fc1_width);
    ctx_.dqkv_attention = memory_.Alloc<bf16>(kRows * shard_.qkv_width);
    ctx_.dact = memory_.Alloc<bf16>(kRows * shard_.ffn);
    if (as.rope) {
      std::vector<float> cos, sin;
      RopeTable(RopeInverseFrequencies(as.rotary_base, as.head_dim, as.rope_scaling), kSeq, &cos,
                &sin);
      rope_cos_ = std::make_unique<Dev<float>>(cos);
      rope_sin_ = std::make_unique<Dev<float>>(sin);
      ctx_.rope_cos = rope_cos_->get();
      ctx_.rope_sin = rope_sin_->get();
    }
    ctx_.attn_workspace = memory_.Alloc<char>(attention_->workspace_bytes());
    BindLayerTensors(
        &w_, 0, [&](const std::string& s) -> const bf16* { return At(b16_->get(), s); },
        [&](const std::string& s) -> const float* { return At(f32_->get(), s); },
        [&](const std::string& s) { return At(grad_->get(), s); });
  }

  template <typename T>
  T* At(T* base, const std::string& name) const {
    const ParamView* v = params_->Find(name);
    return v == nullptr ? nullptr : base + v->offset;
  }
  float* Host(size_t n) { return host_.emplace_back(n, 0.0f).data(); }
  // Every gradient of the tensors whose names start with `prefix`.
  void ExpectGradsOf(const std::string& prefix, double tol) {
    std::vector<std::string> names;
    for (const ParamView& v : params_->views())
      if (v.name.rfind(prefix, 0) == 0) names.push_back(v.name);
    ASSERT_FALSE(names.empty()) << prefix;
    ExpectGrads(names, tol);
  }
  // Every gradient of `names`, bf16 model's against the reference's.
  void ExpectGrads(const std::vector<std::string>& names, double tol) {
    const std::vector<float> got = grad_->Download();
    for (const std::string& name : names) {
      const ParamView* v = params_->Find(name);
      ASSERT_NE(v, nullptr) << name;
      const std::vector<float> g(got.begin() + v->offset, got.begin() + v->offset + v->numel);
      const std::vector<float> w(params_->grad() + v->offset,
                                 params_->grad() + v->offset + v->numel);
      EXPECT_TRUE(RelClose(g, w, tol)) << "gradient of " << name;
    }
  }
  std::string L(const std::string& s) const { return "decoder.layers.0." + s; }

  ckpt::ModelConfig config_;
  std::unique_ptr<ckpt::ModelLayout> layout_;
  ModelSpec spec_;
  LayerShard shard_;
  int64_t h_ = 0, vocab_ = 0;
  std::unique_ptr<ParamStore> params_;
  std::vector<float> rounded_;
  std::unique_ptr<Dev<float>> f32_, grad_;
  std::unique_ptr<Dev<bf16>> b16_;
  std::unique_ptr<Communicator> self_ = MakeSelfCommunicator();
  reference::Context ref_ctx_;
  reference::Workspace ref_ws_;
  std::vector<int32_t> ref_positions_;  // every row's position in its sample
  LayerTensors<float> ref_w_;
  std::vector<std::vector<float>> host_;
  // The bf16 side.
  DeviceMemory memory_;
  OpProfile prof_{false};
  Matmul mm_;
  std::unique_ptr<TensorParallel> tp_;
  std::unique_ptr<CoreAttention> attention_;
  ModuleContext ctx_;
  LayerTensors<bf16> w_;
  std::unique_ptr<Dev<float>> rope_cos_, rope_sin_;
};

class BlockTest : public ModulesTest, public ::testing::WithParamInterface<Arch> {};

TEST_P(BlockTest, MlpBlock) {
  Build(GetParam());
  if (HasFatalFailure()) return;
  const auto x = RoundT<bf16>(Rand(kRows * h_, 1));
  const auto dy = RoundT<bf16>(Rand(kRows * h_, 2, 0.5f));
  // Reference.
  reference::MlpBlock ref(ref_ctx_, ref_ws_, spec_.layers[0], shard_, ref_w_);
  reference::MlpBlock::Saved rs{const_cast<float*>(x.data()), Host(kRows * shard_.fc1_width),
                                Host(kRows * shard_.ffn)};
  std::vector<float> y(kRows * h_), dx(kRows * h_);
  ref.Forward(y.data(), x.data(), rs);
  ref.Backward(dx.data(), dy.data(), rs);
  // bf16.
  MlpBlock block(ctx_, spec_.layers[0], shard_, w_);
  Dev<bf16> in(ToT<bf16>(x)), pre(kRows * shard_.fc1_width), act(kRows * shard_.ffn);
  const MlpBlock::Acts a{pre.get(), act.get()};
  const RowParallelOutput out = block.Forward(in.get(), a);
  ASSERT_EQ(out.addend, nullptr);
  std::vector<bf16> got(kRows * h_);
  LT_CUDA_CHECK(cudaMemcpy(got.data(), out.local, got.size() * sizeof(bf16), cudaMemcpyDefault));
  EXPECT_TRUE(RelClose(FromT<bf16>(got), y, 1e-2)) << "output";
  EXPECT_TRUE(RelClose(
      DownF(act), FromT<bf16>(ToT<bf16>(std::vector<float>(rs.act, rs.act + kRows * shard_.ffn))),
      1e-2))
      << "activation";
  Dev<bf16> dout(ToT<bf16>(dy));
  block.Backward(dout.get(), in.get(), a, ctx_.dln);
  std::vector<bf16> din(kRows * h_);
  LT_CUDA_CHECK(cudaMemcpy(din.data(), ctx_.dln, din.size() * sizeof(bf16), cudaMemcpyDefault));
  EXPECT_TRUE(RelClose(FromT<bf16>(din), dx, 2e-2)) << "input gradient";
  ExpectGradsOf(L("mlp."), 2e-2);
}

TEST_P(BlockTest, AttentionBlock) {
  Build(GetParam());
  if (HasFatalFailure()) return;
  const auto x = RoundT<bf16>(Rand(kRows * h_, 3));
  const auto dy = RoundT<bf16>(Rand(kRows * h_, 4, 0.5f));
  std::unique_ptr<reference::CoreAttention> core =
      reference::MakeLocalAttention(ref_ctx_, ref_ws_, shard_);
  reference::AttentionBlock ref(ref_ctx_, ref_ws_, spec_.layers[0], shard_, core.get(), ref_w_);
  reference::AttentionBlock::Saved rs{const_cast<float*>(x.data()), Host(kRows * shard_.qkv_width),
                                      Host(kBatch * shard_.heads * kSeq * kSeq),
                                      Host(kRows * shard_.attn_width)};
  std::vector<float> y(kRows * h_), dx(kRows * h_);
  const reference::AttentionInputs none{{}, ref_positions_.data(), nullptr};
  ref.Forward(y.data(), x.data(), rs, none);
  ref.Backward(dx.data(), dy.data(), rs, none);

  AttentionBlock block(ctx_, spec_.layers[0], shard_, attention_.get(), w_);
  Dev<bf16> in(ToT<bf16>(x)), qkv(kRows * shard_.qkv_width), att(kRows * shard_.attn_width);
  Dev<float> stats(kBatch * shard_.heads * kSeq);
  const AttentionBlock::Acts a{qkv.get(), att.get(), stats.get()};
  const RowParallelOutput out = block.Forward(in.get(), a);
  std::vector<bf16> got(kRows * h_);
  LT_CUDA_CHECK(cudaMemcpy(got.data(), out.local, got.size() * sizeof(bf16), cudaMemcpyDefault));
  EXPECT_TRUE(RelClose(FromT<bf16>(got), y, 1e-2)) << "output";
  if (spec_.layers[0].attention.interleaved_mha()) {  // else the attention layout, rotated
    EXPECT_TRUE(RelClose(DownF(qkv), std::vector<float>(rs.qkv, rs.qkv + qkv.size()), 1e-2))
        << "qkv";
  }
  Dev<bf16> dout(ToT<bf16>(dy));
  block.Backward(dout.get(), in.get(), a, ctx_.dln);
  std::vector<bf16> din(kRows * h_);
  LT_CUDA_CHECK(cudaMemcpy(din.data(), ctx_.dln, din.size() * sizeof(bf16), cudaMemcpyDefault));
  EXPECT_TRUE(RelClose(FromT<bf16>(din), dx, 2e-2)) << "input gradient";
  ExpectGradsOf(L("self_attention."), 2e-2);
}

// The whole layer: its input norm, attention, the residual + pre-MLP norm, the MLP (its output
// before the closing residual add), then the backward from d(y) and d(MLP output) to d(x) and the
// gradient of the branch that fed x, every parameter's gradient too.
TEST_P(BlockTest, TransformerLayer) {
  Build(GetParam());
  if (HasFatalFailure()) return;
  const float p = 0.1f;
  const auto x = RoundT<bf16>(Rand(kRows * h_, 5, 1.0f, 0.2f));
  const auto dy = RoundT<bf16>(Rand(kRows * h_, 6, 0.5f));
  // The reference layer, written out from its modules as ReferenceModel composes them.
  const LayerSpec& ls = spec_.layers[0];
  std::unique_ptr<reference::CoreAttention> core =
      reference::MakeLocalAttention(ref_ctx_, ref_ws_, shard_);
  reference::Norm norm1(ref_ctx_, ls.input_norm, h_, ref_w_.ln1_w, ref_w_.ln1_b, ref_w_.d_ln1_w,
                        ref_w_.d_ln1_b);
  reference::Norm norm2(ref_ctx_, ls.pre_mlp_norm, h_, ref_w_.ln2_w, ref_w_.ln2_b, ref_w_.d_ln2_w,
                        ref_w_.d_ln2_b);
  reference::AttentionBlock attn(ref_ctx_, ref_ws_, ls, shard_, core.get(), ref_w_);
  reference::MlpBlock mlp(ref_ctx_, ref_ws_, ls, shard_, ref_w_);
  const int64_t n = kRows * h_;
  float* ln1 = Host(n);
  float* ln2 = Host(n);
  float* mid = Host(n);
  reference::Norm::Saved s1{Host(kRows), Host(kRows)}, s2{Host(kRows), Host(kRows)};
  reference::AttentionBlock::Saved as{ln1, Host(kRows * shard_.qkv_width),
                                      Host(kBatch * shard_.heads * kSeq * kSeq),
                                      Host(kRows * shard_.attn_width)};
  reference::MlpBlock::Saved ms{ln2, Host(kRows * shard_.fc1_width), Host(kRows * shard_.ffn)};
  std::vector<float> mlp_out(n);
  norm1.Forward(ln1, s1, x.data());
  const reference::AttentionInputs attn_in{{}, ref_positions_.data(), nullptr};
  attn.Forward(mid, ln1, as, attn_in);
  cpu_->Dropout(mid, kRows, h_, Drop(p, 1));
  cpu_->AddInPlace(mid, x.data(), n);
  norm2.Forward(ln2, s2, mid);
  mlp.Forward(mlp_out.data(), ln2, ms);
  // Backward: d(y) passes the closing residual to d(mid); d(MLP output) is d(y) through its
  // dropout.
  std::vector<float> dx = dy, dbranch = dy, dx_input(n);
  cpu_->Dropout(dbranch.data(), kRows, h_, Drop(p, 2));
  mlp.Backward(dbranch.data(), dbranch.data(), ms);
  norm2.Backward(dx.data(), dbranch.data(), s2, mid);
  dbranch = dx;
  cpu_->Dropout(dbranch.data(), kRows, h_, Drop(p, 1));
  attn.Backward(dbranch.data(), dbranch.data(), as, attn_in);
  norm1.Backward(dx.data(), dbranch.data(), s1, x.data());
  dx_input = dx;
  cpu_->Dropout(dx_input.data(), kRows, h_, Drop(p, 0));

  // With the norm and MLP outputs kept, and recomputed in the backward (selective, layernorm and
  // mlp: shared buffers, poisoned between forward and backward so that only a recomputation can
  // pass).
  TransformerLayer layer(ctx_, ls, shard_, attention_.get(), w_, false);
  struct Mode {
    bool norms, mlp;
  };
  for (const Mode mode :
       {Mode{false, false}, Mode{true, false}, Mode{false, true}, Mode{true, true}}) {
    const bool recompute_norms = mode.norms;
    SCOPED_TRACE(testing::Message() << "norms " << (mode.norms ? "recomputed" : "kept") << ", MLP "
                                    << (mode.mlp ? "recomputed" : "kept"));
    LT_CUDA_CHECK(cudaMemset(grad_->get(), 0, grad_->size() * sizeof(float)));
    Dev<bf16> shared_norm(recompute_norms ? n : 0);
    Dev<bf16> shared_pre(mode.mlp ? kRows * shard_.fc1_width : 0),
        shared_act(mode.mlp ? kRows * shard_.ffn : 0);
    const TransformerLayer::Acts a = layer.MakeActs(mode.mlp ? shared_act.get() : nullptr,
                                                    recompute_norms ? shared_norm.get() : nullptr,
                                                    mode.mlp ? shared_pre.get() : nullptr);
    Dev<bf16> xd(ToT<bf16>(x));
    layer.NormInput(nullptr, {xd.get(), nullptr}, nullptr, a, Drop(p, 0));
    const RowParallelOutput out = layer.Forward(xd.get(), a, Drop(p, 1));
    std::vector<bf16> got(n), mid_got(n);
    LT_CUDA_CHECK(cudaMemcpy(got.data(), out.local, n * sizeof(bf16), cudaMemcpyDefault));
    LT_CUDA_CHECK(cudaMemcpy(mid_got.data(), a.mid, n * sizeof(bf16), cudaMemcpyDefault));
    EXPECT_TRUE(RelClose(FromT<bf16>(mid_got), std::vector<float>(mid, mid + n), 1e-2)) << "mid";
    EXPECT_TRUE(RelClose(FromT<bf16>(got), mlp_out, 2e-2)) << "MLP output";
    if (recompute_norms) shared_norm.Poison();
    if (mode.mlp) {
      shared_pre.Poison();
      shared_act.Poison();
    }
    Dev<bf16> dxd(ToT<bf16>(dy)), dmlp(ToT<bf16>(dy));
    Dropout<bf16>(dmlp.get(), kRows, h_, Drop(p, 2), MainStream());
    bf16* dinput = layer.Backward(dxd.get(), dmlp.get(), xd.get(), a, Drop(p, 1), Drop(p, 0));
    std::vector<bf16> dinput_got(n);
    LT_CUDA_CHECK(cudaMemcpy(dinput_got.data(), dinput, n * sizeof(bf16), cudaMemcpyDefault));
    EXPECT_TRUE(RelClose(DownF(dxd), dx, 3e-2)) << "d(x)";
    EXPECT_TRUE(RelClose(FromT<bf16>(dinput_got), dx_input, 3e-2)) << "d(input branch)";
    std::vector<std::string> names;
    for (const ParamView& v : params_->views())
      if (v.name.rfind("decoder.layers.0.", 0) == 0) names.push_back(v.name);
    ExpectGrads(names, 3e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, BlockTest,
                         ::testing::Values(Arch::kGpt2Erf, Arch::kGpt2Tanh, Arch::kLlama),
                         [](const auto& info) {
                           return std::string(info.param == Arch::kGpt2Erf    ? "Gpt2ErfGelu"
                                              : info.param == Arch::kGpt2Tanh ? "Gpt2TanhGelu"
                                                                              : "Llama");
                         });

// x = residual + dropout(branch + addend), the norm of x, and back: d(x) with the residual's
// gradient added, and the branch's gradient through the dropout.
TEST_P(BlockTest, NormWithResidualAndDropout) {
  Build(GetParam());
  if (HasFatalFailure()) return;
  const int64_t n = kRows * h_;
  const float p = 0.1f;
  const auto residual = RoundT<bf16>(Rand(n, 7, 1.0f, 0.3f));
  const auto branch = RoundT<bf16>(Rand(n, 8)), addend = RoundT<bf16>(Rand(n, 9));
  const auto dout = RoundT<bf16>(Rand(n, 10)), dres = RoundT<bf16>(Rand(n, 11));
  // Reference: the branch's two addends summed and rounded (as a reduce-scatter would), dropped
  // out, added to the residual, stored in bf16; then the norm of that.
  std::vector<float> x = branch;
  cpu_->AddInPlace(x.data(), addend.data(), n);
  x = RoundT<bf16>(x);
  cpu_->Dropout(x.data(), kRows, h_, Drop(p, 1));
  cpu_->AddInPlace(x.data(), residual.data(), n);
  x = RoundT<bf16>(x);
  reference::Norm ref(ref_ctx_, spec_.layers[0].pre_mlp_norm, h_, ref_w_.ln2_w, ref_w_.ln2_b,
                      ref_w_.d_ln2_w, ref_w_.d_ln2_b);
  reference::Norm::Saved rs{Host(kRows), Host(kRows)};
  std::vector<float> y(n), dx = dres;
  ref.Forward(y.data(), rs, x.data());
  ref.Backward(dx.data(), dout.data(), rs, x.data());
  std::vector<float> dbranch = dx;
  cpu_->Dropout(dbranch.data(), kRows, h_, Drop(p, 1));

  Norm norm(ctx_, spec_.layers[0].pre_mlp_norm, h_, w_.ln2_w, w_.ln2_b, w_.d_ln2_w, w_.d_ln2_b);
  Dev<bf16> r(ToT<bf16>(residual)), b(ToT<bf16>(branch)), ad(ToT<bf16>(addend));
  Dev<bf16> xo(n), out(n), dx_dev(ToT<bf16>(dres)), dout_dev(ToT<bf16>(dout));
  Dev<float> mean(kRows), rstd(kRows);
  norm.Forward(r.get(), {b.get(), ad.get()}, xo.get(), out.get(), {mean.get(), rstd.get()},
               Drop(p, 1));
  EXPECT_TRUE(RelClose(DownF(xo), x, 1e-3)) << "x";
  EXPECT_TRUE(RelClose(DownF(out), y, 1e-2)) << "norm output";
  EXPECT_TRUE(RelClose(rstd.Download(), std::vector<float>(rs.rstd, rs.rstd + kRows), 1e-4))
      << "1/std or 1/rms";
  bf16* db = norm.Backward(dx_dev.get(), dout_dev.get(), dx_dev.get(), xo.get(),
                           {mean.get(), rstd.get()}, Drop(p, 1));
  ASSERT_EQ(db, ctx_.dbranch_full) << "with dropout the branch's gradient is its own buffer";
  std::vector<bf16> dbranch_got(n);
  LT_CUDA_CHECK(cudaMemcpy(dbranch_got.data(), db, n * sizeof(bf16), cudaMemcpyDefault));
  EXPECT_TRUE(RelClose(DownF(dx_dev), dx, 1e-2)) << "d(x)";
  EXPECT_TRUE(RelClose(FromT<bf16>(dbranch_got), dbranch, 1e-2)) << "d(branch)";
  ExpectGradsOf(L("pre_mlp_layernorm."), 1e-2);
  // No dropout, no SP: the branch's gradient is d(x) itself.
  EXPECT_EQ(norm.Backward(dx_dev.get(), dout_dev.get(), dx_dev.get(), xo.get(),
                          {mean.get(), rstd.get()}, Drop(0.0f, 1)),
            dx_dev.get());
}

TEST_F(ModulesTest, Embedding) {
  Build(Arch::kGpt2Tanh);
  if (HasFatalFailure()) return;
  const int64_t n = kRows * h_;
  const float p = 0.1f;
  const auto tokens = RandInts(kRows, 12, 0, static_cast<int32_t>(config_.vocab_size));
  const auto dy = RoundT<bf16>(Rand(n, 13));
  const float* word = params_->Param("embedding.word_embeddings.weight");
  const float* pos = params_->Param("embedding.position_embeddings.weight");
  reference::Embedding ref(ref_ctx_, ref_ws_, h_, vocab_, word, pos,
                           params_->Grad("embedding.word_embeddings.weight"),
                           params_->Grad("embedding.position_embeddings.weight"));
  std::vector<float> y(n), dref = dy;
  ref.Forward(y.data(), tokens.data(), ref_positions_.data(), Drop(p, 0));
  ref.Backward(dref.data(), tokens.data(), ref_positions_.data(), Drop(p, 0));

  Embedding emb(ctx_, h_, vocab_, At(f32_->get(), "embedding.word_embeddings.weight"),
                At(f32_->get(), "embedding.position_embeddings.weight"),
                At(grad_->get(), "embedding.word_embeddings.weight"),
                At(grad_->get(), "embedding.position_embeddings.weight"));
  Dev<int32_t> tok(tokens);
  Dev<bf16> x(n);
  emb.Forward(tok.get(), x.get(), Drop(p, 0));
  EXPECT_TRUE(RelClose(DownF(x), y, 1e-2)) << "output";
  // The backward takes the gradient already through the dropout (the norm above applied it).
  Dev<bf16> dx(ToT<bf16>(dy));
  Dropout<bf16>(dx.get(), kRows, h_, Drop(p, 0), MainStream());
  emb.Backward(dx.get(), tok.get());
  ExpectGrads({"embedding.word_embeddings.weight", "embedding.position_embeddings.weight"}, 1e-2);
}

// Logits a few rows at a time, the per-row losses, the step's mean loss on the device, and the
// gradient back to the input and into the output weight, scaled as the forward was told: in bf16
// (three chunks), and with --fp8-output-layer's FP8 products (chunks of 48 and 16 rows, tensorwise
// and delayed scaling, E5M2 gradients) within FP8's rounding of the same reference. The gradient
// scale is small, as a step's 1 / tokens is: unscaled, E5M2 would flush all but the labels'.
class OutputHeadTest : public ModulesTest {
 protected:
  struct Want {
    std::vector<float> x, losses, dx;
    std::vector<int32_t> labels;
    double mean = 0;
    float scale = 0;
  };
  static constexpr const char* kOut = "output_layer.weight";
  Want Reference() {
    Want w;
    const int64_t n = kRows * h_;
    w.x = RoundT<bf16>(Rand(n, 14));
    w.labels = RandInts(kRows, 15, 0, static_cast<int32_t>(config_.vocab_size));
    w.labels[1] = w.labels[40] = -1;
    w.scale = 1e-3f / (kRows - 2);
    std::vector<float> dlogits(kRows * vocab_), dlosses(kRows);
    reference::OutputHead ref(ref_ctx_, ref_ws_, h_, vocab_, At(rounded_.data(), kOut),
                              params_->Grad(kOut), dlogits.data(), dlosses.data());
    reference::OutputHead::Saved rs{w.x.data(), Host(kRows * vocab_), Host(2 * kRows), Host(kRows)};
    ref.Forward(w.x.data(), w.labels.data(), rs);
    std::vector<float> row_grad(kRows);
    w.dx.resize(n);
    for (int64_t r = 0; r < kRows; ++r) {
      row_grad[r] = w.labels[r] >= 0 ? w.scale : 0.0f;
      if (w.labels[r] >= 0) w.mean += rs.losses[r] / (kRows - 2);
    }
    ref.Backward(w.dx.data(), row_grad, w.labels.data(), rs);
    w.losses.assign(rs.losses, rs.losses + kRows);
    return w;
  }
  // One micro-batch through `head`, its outputs against `want` within the tolerances.
  void Check(OutputHead& head, const Want& want, double loss_tol, double grad_tol) {
    const int64_t n = kRows * h_;
    Dev<bf16> in(ToT<bf16>(want.x)), dx_all(n), dx_got(n);
    Dev<int32_t> lab(want.labels);
    Dev<float> losses(kRows);
    head.BeginStep();
    head.Forward(in.get(), lab.get(), losses.get(), want.scale, dx_all.get(), dx_got.get());
    const auto l = RelClose(losses.Download(), want.losses, loss_tol);
    const auto d = RelClose(DownF(dx_got), want.dx, grad_tol);
    std::printf("losses: %s; input gradient: %s\n", l.message(), d.message());
    EXPECT_TRUE(l) << "losses";
    EXPECT_NEAR(head.TakeLoss(), want.mean, loss_tol * want.mean) << "the step's loss";
    EXPECT_TRUE(d) << "input gradient";
    ExpectGrads({kOut}, grad_tol);
  }
};

TEST_F(OutputHeadTest, Bf16) {
  Build(Arch::kGpt2Tanh);
  if (HasFatalFailure()) return;
  const Want want = Reference();
  OutputHead head(ctx_, h_, vocab_, 24, At(b16_->get(), kOut), At(grad_->get(), kOut));
  Check(head, want, 1e-3, 2e-2);
}

TEST_F(OutputHeadTest, Fp8) {
  Build(Arch::kGpt2Tanh);
  if (HasFatalFailure()) return;
  const Want want = Reference();
  for (const bool delayed : {false, true}) {
    SCOPED_TRACE(delayed ? "delayed" : "tensorwise");
    Fp8Options o;
    o.enabled = o.output_layer = o.hybrid = true;
    o.delayed = delayed;
    o.amax_history_len = 2;
    DeviceMemory memory;
    Fp8Scaling scaling(o, 1, &memory);
    Fp8Products products(&scaling, kRows, h_, h_, &memory, 48 * vocab_);
    ctx_.linear.fp8 = &products;
    OutputHead head(ctx_, h_, vocab_, 48, At(b16_->get(), kOut), At(grad_->get(), kOut),
                    /*fp8=*/true);
    // E4M3 inputs and weights (3 mantissa bits) put about 4% of RMS error on the logits, E5M2
    // (2 bits) about 6% more on the gradients; a wrong operand, scale or chunk is off by 50%+.
    // Delayed scaling: first a fresh state (unit scales; the logits' gradient measures its own),
    // then scales from the recorded amaxes.
    for (int step = 0; step < (delayed ? 2 : 1); ++step) {
      LT_CUDA_CHECK(
          cudaMemsetAsync(grad_->get(), 0, params_->size() * sizeof(float), MainStream()));
      Check(head, want, 2e-2, 0.15);
      float amax = 0;  // the products ran in FP8: the gradient's cast recorded its amax
      LT_CUDA_CHECK(cudaMemcpy(&amax, scaling.history(0, Fp8Scaling::kGrad), sizeof(float),
                               cudaMemcpyDeviceToHost));
      EXPECT_GT(amax, 0.0f);
      if (delayed) scaling.NewWeights(nullptr);
    }
    ctx_.linear.fp8 = nullptr;
  }
}

}  // namespace
}  // namespace leantron::trainer::cuda
