#include "trainer/cuda/gpt_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/cuda/attention.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/kernels.h"
#include "trainer/cuda/matmul.h"

namespace leantron::trainer::cuda {
namespace {

// Per-op GPU time by category (LEANTRON_PROFILE=1): CUDA events around each op, summed when the
// next step begins (the optimizer step has synchronised by then) and printed at exit.
class OpProfile {
 public:
  OpProfile() : enabled_(std::getenv("LEANTRON_PROFILE") != nullptr) {}
  ~OpProfile() {
    if (!enabled_) return;
    Step();  // the last step's marks
    double total = 0;
    for (const auto& [name, ms] : totals_) total += ms;
    std::fprintf(stderr, "GPU time by op over %ld steps (%.1f ms per step):\n",
                 static_cast<long>(steps_), steps_ ? total / steps_ : 0.0);
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [name, ms] : totals_) rows.push_back({ms, name});
    std::sort(rows.rbegin(), rows.rend());
    for (const auto& [ms, name] : rows) {
      std::fprintf(stderr, "  %-28s %9.2f ms/step %6.1f%%\n", name.c_str(),
                   steps_ ? ms / steps_ : 0.0, total > 0 ? 100.0 * ms / total : 0.0);
    }
    for (auto& e : pool_) cudaEventDestroy(e);
  }
  bool enabled() const { return enabled_; }
  // Starts timing `name`; the next Begin or End closes it.
  void Begin(const char* name) {
    if (!enabled_) return;
    if (open_ != nullptr) End();
    open_ = name;
    marks_.push_back({name, Event(), nullptr});
    LT_CUDA_CHECK(cudaEventRecord(marks_.back().start, MainStream()));
  }
  void End() {
    if (!enabled_ || open_ == nullptr) return;
    marks_.back().end = Event();
    LT_CUDA_CHECK(cudaEventRecord(marks_.back().end, MainStream()));
    open_ = nullptr;
  }
  void Step() {
    if (!enabled_) return;
    Collect(/*keep=*/steps_ >= 0);
    ++steps_;
  }

 private:
  struct Mark {
    const char* name;
    cudaEvent_t start, end;
  };
  cudaEvent_t Event() {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      LT_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    return pool_[used_++];
  }
  void Collect(bool keep = true) {
    End();
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    for (const Mark& m : marks_) {
      if (!keep) break;
      float ms = 0;
      LT_CUDA_CHECK(cudaEventElapsedTime(&ms, m.start, m.end));
      totals_[m.name] += ms;
    }
    marks_.clear();
    used_ = 0;
  }
  bool enabled_;
  const char* open_ = nullptr;
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<Mark> marks_;
  std::map<std::string, double> totals_;
  // The first step (kernel loading, matmul tuning) is left out: steps_ counts from -2.
  int64_t steps_ = -2;
};

class BF16GptModel : public StageModel {
 public:
  BF16GptModel(const ckpt::ModelLayout& layout, ParamStore* params, const BF16Options& options,
               std::unique_ptr<FlashAttention> attention);
  ~BF16GptModel() override;

  bool first_stage() const override { return true; }
  bool last_stage() const override { return true; }
  int first_layer() const override { return 0; }
  int last_layer() const override { return static_cast<int>(layers_.size()); }
  int64_t hidden_rows() const override { return n_; }
  int64_t hidden_size() const override { return h_; }
  void BeginStep() override;
  float Forward(int slot, const MicroBatch& mb, const float* input) override;
  const float* Output(int) const override { return nullptr; }
  void Backward(int slot, const float* doutput, float loss_scale) override;
  const float* InputGrad() const override { return nullptr; }
  float* input_buffer() override { return nullptr; }
  float* grad_buffer() override { return nullptr; }
  int64_t activation_bytes() const override { return activation_bytes_; }

 private:
  struct Layer {
    // bf16 weights (views into w16_), fp32 gradients (views into the ParamStore's gradient).
    const bf16 *qkv_w, *qkv_b, *proj_w, *proj_b, *fc1_w, *fc1_b, *fc2_w, *fc2_b;
    const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    float *d_qkv_w, *d_qkv_b, *d_proj_w, *d_proj_b, *d_fc1_w, *d_fc1_b, *d_fc2_w, *d_fc2_b;
    float *d_ln1_w, *d_ln1_b, *d_ln2_w, *d_ln2_b;
    // Activations: own buffers, or the shared ones when the layer is recomputed.
    bf16 *ln1, *qkv, *att, *mid, *ln2, *pre, *gelu;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *stats;
    bool recompute = false;
  };

  template <typename T>
  T* Alloc(size_t n, bool activation = true) {
    void* p = nullptr;
    LT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    LT_CUDA_CHECK(cudaMemsetAsync(p, 0, std::max<size_t>(n, 1) * sizeof(T), MainStream()));
    allocations_.push_back(p);
    if (activation) activation_bytes_ += static_cast<int64_t>(n * sizeof(T));
    return static_cast<T*>(p);
  }
  void AllocActs(Layer* a);
  HiddenDropout Drop(int layer, int site) const;
  // Layer l's forward from its input x_[l] (ln1 already computed) up to fc1/GELU; the MLP output
  // lands in branch_ for the next residual-add + LayerNorm.
  void LayerForward(int l);
  void LayerBackward(int l);
  // Closes layer l's MLP: x_[l+1] = mid + dropout(branch_), and LayerNorm into `out`.
  void ResidualNorm(int l, bf16* out, float* mean, float* rstd, const float* w, const float* b);
  float HeadForward();
  // dW += doutᵀ·in and db += Σ_rows dout (db may be null): the bias gradient from cuBLASLt's
  // epilogue when it has one for this shape, else a column-sum kernel.
  void WeightGrad(float* dw, float* db, const bf16* dout, const bf16* in, int64_t k, int64_t n);
  Scratch scratch() const { return {scratch_, scratch_bytes_}; }

  const ckpt::ModelLayout& layout_;
  ParamStore* params_;
  BF16Options opt_;
  std::unique_ptr<FlashAttention> attention_;
  Matmul mm_;
  OpProfile prof_;
  int64_t b_, t_, n_, h_, heads_, head_dim_, ffn_, vocab_;
  float eps_;
  bool tanh_gelu_;
  std::vector<Layer> layers_;
  std::vector<void*> allocations_;
  int64_t activation_bytes_ = 0;

  bf16* w16_ = nullptr;  // bf16 copy of the whole flat parameter buffer
  const float *wte_, *wpe_, *lnf_w_, *lnf_b_;
  const bf16* out_w16_;
  float *d_wte_, *d_wpe_, *d_lnf_w_, *d_lnf_b_, *d_out_w_;

  // Forward state of the one micro-batch in flight.
  MicroBatch mb_;
  int32_t *tokens_, *labels_, *positions_;
  std::vector<bf16*> x_;  // [layers + 1] residual stream, each [n, h]
  bf16 *branch_, *lnf_, *dlnf_, *logits_;
  float *lnf_mean_, *lnf_rstd_, *losses_;
  std::vector<float> host_losses_;
  float grad_scale_ = 0.0f;  // applied to the head's gradient during the forward
  bool has_grad_ = false;
  // Backward scratch.
  bf16 *dx_, *dbranch_, *dln_, *dqkv_, *datt_, *dfc_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* attn_workspace_ = nullptr;
  bf16* shared_gelu_ = nullptr;
  float* bias_grad_ = nullptr;  // [max width], the epilogue's bias gradient before it is added
  int64_t chunk_rows_;
};

BF16GptModel::BF16GptModel(const ckpt::ModelLayout& layout, ParamStore* params,
                           const BF16Options& options, std::unique_ptr<FlashAttention> attention)
    : layout_(layout), params_(params), opt_(options), attention_(std::move(attention)) {
  const ckpt::ModelConfig& c = layout.config();
  b_ = opt_.model.micro_batch;
  t_ = opt_.model.seq_length;
  n_ = b_ * t_;
  h_ = c.hidden_size;
  heads_ = c.num_attention_heads;
  head_dim_ = c.kv_channels;
  ffn_ = c.ffn_hidden_size;
  vocab_ = layout.padded_vocab_size();
  eps_ = static_cast<float>(c.norm_epsilon);
  tanh_gelu_ = c.activation == ckpt::Activation::kGeluTanh;
  chunk_rows_ = opt_.logits_chunk_rows > 0
                    ? std::min<int64_t>(n_, opt_.logits_chunk_rows)
                    // up to 2 GiB of bf16 logits at a time
                    : std::clamp<int64_t>((int64_t{1} << 30) / vocab_, 1, n_);

  w16_ = Alloc<bf16>(params_->size());
  auto w16 = [&](const std::string& name) -> const bf16* {
    const float* p = params_->Param(name);
    return p ? w16_ + (p - params_->data()) : nullptr;
  };
  auto f32 = [&](const std::string& name) -> const float* { return params_->Param(name); };
  auto grad = [&](const std::string& name) { return params_->Grad(name); };

  const int num_layers = static_cast<int>(c.num_layers);
  Layer shared{};
  const int recompute = std::min(opt_.model.recompute_layers, num_layers);
  if (recompute > 0) AllocActs(&shared);
  for (int i = 0; i < num_layers; ++i) {
    const std::string pre = absl::StrFormat("decoder.layers.%d.", i);
    Layer w{};
    if (i < recompute) {
      w = shared;
      w.recompute = true;
    } else {
      AllocActs(&w);
    }
    w.ln1_w = f32(pre + "input_layernorm.weight");
    w.ln1_b = f32(pre + "input_layernorm.bias");
    w.qkv_w = w16(pre + "self_attention.linear_qkv.weight");
    w.qkv_b = w16(pre + "self_attention.linear_qkv.bias");
    w.proj_w = w16(pre + "self_attention.linear_proj.weight");
    w.proj_b = w16(pre + "self_attention.linear_proj.bias");
    w.ln2_w = f32(pre + "pre_mlp_layernorm.weight");
    w.ln2_b = f32(pre + "pre_mlp_layernorm.bias");
    w.fc1_w = w16(pre + "mlp.linear_fc1.weight");
    w.fc1_b = w16(pre + "mlp.linear_fc1.bias");
    w.fc2_w = w16(pre + "mlp.linear_fc2.weight");
    w.fc2_b = w16(pre + "mlp.linear_fc2.bias");
    w.d_ln1_w = grad(pre + "input_layernorm.weight");
    w.d_ln1_b = grad(pre + "input_layernorm.bias");
    w.d_qkv_w = grad(pre + "self_attention.linear_qkv.weight");
    w.d_qkv_b = grad(pre + "self_attention.linear_qkv.bias");
    w.d_proj_w = grad(pre + "self_attention.linear_proj.weight");
    w.d_proj_b = grad(pre + "self_attention.linear_proj.bias");
    w.d_ln2_w = grad(pre + "pre_mlp_layernorm.weight");
    w.d_ln2_b = grad(pre + "pre_mlp_layernorm.bias");
    w.d_fc1_w = grad(pre + "mlp.linear_fc1.weight");
    w.d_fc1_b = grad(pre + "mlp.linear_fc1.bias");
    w.d_fc2_w = grad(pre + "mlp.linear_fc2.weight");
    w.d_fc2_b = grad(pre + "mlp.linear_fc2.bias");
    layers_.push_back(w);
  }
  wte_ = f32("embedding.word_embeddings.weight");
  wpe_ = f32("embedding.position_embeddings.weight");
  d_wte_ = grad("embedding.word_embeddings.weight");
  d_wpe_ = grad("embedding.position_embeddings.weight");
  lnf_w_ = f32("decoder.final_layernorm.weight");
  lnf_b_ = f32("decoder.final_layernorm.bias");
  d_lnf_w_ = grad("decoder.final_layernorm.weight");
  d_lnf_b_ = grad("decoder.final_layernorm.bias");
  if (params_->Find("output_layer.weight") != nullptr) {
    out_w16_ = w16("output_layer.weight");
    d_out_w_ = grad("output_layer.weight");
  } else {
    out_w16_ = w16("embedding.word_embeddings.weight");
    d_out_w_ = d_wte_;
  }

  tokens_ = Alloc<int32_t>(n_);
  labels_ = Alloc<int32_t>(n_);
  positions_ = Alloc<int32_t>(n_);
  std::vector<int32_t> positions(n_);
  for (int64_t r = 0; r < n_; ++r) positions[r] = static_cast<int32_t>(r % t_);
  LT_CUDA_CHECK(cudaMemcpyAsync(positions_, positions.data(), n_ * sizeof(int32_t),
                                cudaMemcpyHostToDevice, MainStream()));
  for (int l = 0; l <= num_layers; ++l) x_.push_back(Alloc<bf16>(n_ * h_));
  branch_ = Alloc<bf16>(n_ * h_);
  lnf_ = Alloc<bf16>(n_ * h_);
  dlnf_ = Alloc<bf16>(n_ * h_);
  lnf_mean_ = Alloc<float>(n_);
  lnf_rstd_ = Alloc<float>(n_);
  losses_ = Alloc<float>(n_);
  logits_ = Alloc<bf16>(chunk_rows_ * vocab_);
  host_losses_.resize(n_);
  dx_ = Alloc<bf16>(n_ * h_);
  dbranch_ = Alloc<bf16>(n_ * h_);
  dln_ = Alloc<bf16>(n_ * h_);
  dqkv_ = Alloc<bf16>(n_ * 3 * h_);
  datt_ = Alloc<bf16>(n_ * h_);
  dfc_ = Alloc<bf16>(n_ * ffn_);
  scratch_bytes_ = std::max({LayerNormBackwardScratchBytes(n_, h_),
                             ColumnSumScratchBytes(n_, std::max<int64_t>(3 * h_, ffn_)),
                             EmbeddingBackwardScratchBytes(n_, h_), size_t{1} << 20});
  scratch_ = Alloc<char>(scratch_bytes_);
  bias_grad_ = Alloc<float>(std::max<int64_t>(3 * h_, ffn_));
  attn_workspace_ = Alloc<char>(attention_->workspace_bytes());
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
}

BF16GptModel::~BF16GptModel() {
  cudaStreamSynchronize(MainStream());
  for (void* p : allocations_) cudaFree(p);
}

void BF16GptModel::AllocActs(Layer* a) {
  a->ln1 = Alloc<bf16>(n_ * h_);
  a->qkv = Alloc<bf16>(n_ * 3 * h_);
  a->att = Alloc<bf16>(n_ * h_);
  a->mid = Alloc<bf16>(n_ * h_);
  a->ln2 = Alloc<bf16>(n_ * h_);
  a->pre = Alloc<bf16>(n_ * ffn_);
  // With GELU recomputation every layer shares one GELU buffer, rebuilt in the backward.
  if (opt_.recompute_gelu) {
    if (shared_gelu_ == nullptr) shared_gelu_ = Alloc<bf16>(n_ * ffn_);
    a->gelu = shared_gelu_;
  } else {
    a->gelu = Alloc<bf16>(n_ * ffn_);
  }
  a->ln1_mean = Alloc<float>(n_);
  a->ln1_rstd = Alloc<float>(n_);
  a->ln2_mean = Alloc<float>(n_);
  a->ln2_rstd = Alloc<float>(n_);
  a->stats = Alloc<float>(b_ * heads_ * t_);
}

HiddenDropout BF16GptModel::Drop(int layer, int site) const {
  HiddenDropout d;
  d.p = mb_.training ? opt_.model.hidden_dropout : 0.0f;
  d.seed = DropoutSiteSeed(opt_.model.seed, layer, site);
  d.first_sample = mb_.first_sample;
  d.seq_length = t_;
  d.row_offset = 0;
  return d;
}

void BF16GptModel::BeginStep() {
  prof_.Step();
  ConvertFromFloat<bf16>(w16_, params_->data(), params_->size(), MainStream());
}

void BF16GptModel::LayerForward(int l) {
  Layer& a = layers_[l];
  prof_.Begin("matmul fwd qkv");
  mm_.Forward(a.qkv, a.ln1, a.qkv_w, a.qkv_b, n_, h_, 3 * h_);
  prof_.Begin("attention fwd");
  attention_->Forward(a.att, a.stats, a.qkv, attn_workspace_);
  prof_.Begin("matmul fwd proj");
  mm_.Forward(branch_, a.att, a.proj_w, a.proj_b, n_, h_, h_);
  prof_.Begin("residual+layernorm fwd");
  AddLayerNormForward<bf16>(a.mid, a.ln2, a.ln2_mean, a.ln2_rstd, x_[l], branch_, a.ln2_w, a.ln2_b,
                            n_, h_, eps_, Drop(l, 1), MainStream());
  prof_.Begin("matmul fwd fc1");
  if (tanh_gelu_) {  // GELU in the matmul's epilogue
    mm_.ForwardGelu(a.gelu, a.pre, a.ln2, a.fc1_w, a.fc1_b, n_, h_, ffn_);
  } else {
    mm_.Forward(a.pre, a.ln2, a.fc1_w, a.fc1_b, n_, h_, ffn_);
    prof_.Begin("gelu");
    GeluForward<bf16>(a.gelu, a.pre, n_ * ffn_, false, MainStream());
  }
  prof_.Begin("matmul fwd fc2");
  mm_.Forward(branch_, a.gelu, a.fc2_w, a.fc2_b, n_, ffn_, h_);
  prof_.End();
}

void BF16GptModel::ResidualNorm(int l, bf16* out, float* mean, float* rstd, const float* w,
                                const float* b) {
  prof_.Begin("residual+layernorm fwd");
  AddLayerNormForward<bf16>(x_[l + 1], out, mean, rstd, layers_[l].mid, branch_, w, b, n_, h_, eps_,
                            Drop(l, 2), MainStream());
  prof_.End();
}

float BF16GptModel::Forward(int, const MicroBatch& mb, const float*) {
  mb_ = mb;
  int64_t valid = 0;
  for (int32_t label : mb.labels) valid += label >= 0;
  has_grad_ = mb.training && valid > 0;
  grad_scale_ = has_grad_ ? opt_.loss_scale / static_cast<float>(valid) : 0.0f;
  LT_CUDA_CHECK(cudaMemcpyAsync(tokens_, mb.tokens.data(), n_ * sizeof(int32_t),
                                cudaMemcpyHostToDevice, MainStream()));
  LT_CUDA_CHECK(cudaMemcpyAsync(labels_, mb.labels.data(), n_ * sizeof(int32_t),
                                cudaMemcpyHostToDevice, MainStream()));
  prof_.Begin("embedding fwd");
  EmbeddingForward<bf16>(x_[0], tokens_, wte_, n_, h_, 0, vocab_, MainStream());
  PositionForward<bf16>(x_[0], positions_, wpe_, n_, h_, MainStream());
  Dropout<bf16>(x_[0], n_, h_, Drop(-1, 0), MainStream());
  prof_.Begin("residual+layernorm fwd");
  const int num_layers = static_cast<int>(layers_.size());
  if (num_layers > 0) {
    Layer& a = layers_[0];
    AddLayerNormForward<bf16>(nullptr, a.ln1, a.ln1_mean, a.ln1_rstd, nullptr, x_[0], a.ln1_w,
                              a.ln1_b, n_, h_, eps_, Drop(-1, 0), MainStream());
  }
  prof_.End();
  for (int l = 0; l < num_layers; ++l) {
    LayerForward(l);
    if (l + 1 < num_layers) {
      Layer& next = layers_[l + 1];
      ResidualNorm(l, next.ln1, next.ln1_mean, next.ln1_rstd, next.ln1_w, next.ln1_b);
    } else {
      ResidualNorm(l, lnf_, lnf_mean_, lnf_rstd_, lnf_w_, lnf_b_);
    }
  }
  if (num_layers == 0) {
    AddLayerNormForward<bf16>(nullptr, lnf_, lnf_mean_, lnf_rstd_, nullptr, x_[0], lnf_w_, lnf_b_,
                              n_, h_, eps_, Drop(-1, 0), MainStream());
  }
  return HeadForward();
}

// Logits a chunk of rows at a time: loss, and when training the gradient back to the final
// LayerNorm's output (dlnf_) and into the output weight, scaled by loss_scale / tokens.
float BF16GptModel::HeadForward() {
  for (int64_t r0 = 0; r0 < n_; r0 += chunk_rows_) {
    const int64_t rows = std::min(chunk_rows_, n_ - r0);
    prof_.Begin("matmul head fwd");
    mm_.Forward(logits_, lnf_ + r0 * h_, out_w16_, nullptr, rows, h_, vocab_);
    prof_.Begin("cross-entropy");
    CrossEntropyForwardBackward<bf16>(losses_ + r0, logits_, labels_ + r0, rows, vocab_,
                                      grad_scale_, MainStream());
    if (has_grad_) {
      prof_.Begin("matmul head bwd");
      mm_.BackwardData(dlnf_ + r0 * h_, logits_, out_w16_, rows, h_, vocab_);
      mm_.BackwardWeight(d_out_w_, logits_, lnf_ + r0 * h_, rows, h_, vocab_);
    }
  }
  prof_.End();
  LT_CUDA_CHECK(cudaMemcpyAsync(host_losses_.data(), losses_, n_ * sizeof(float),
                                cudaMemcpyDeviceToHost, MainStream()));
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t r = 0; r < n_; ++r) {
    if (mb_.labels[r] < 0) continue;
    sum += host_losses_[r];
    ++count;
  }
  return count > 0 ? static_cast<float>(sum / count) : 0.0f;
}

void BF16GptModel::WeightGrad(float* dw, float* db, const bf16* dout, const bf16* in, int64_t k,
                              int64_t n) {
  if (db != nullptr && mm_.BackwardWeightBias(dw, bias_grad_, dout, in, n_, k, n)) {
    AddInPlace(db, bias_grad_, n, MainStream());
    return;
  }
  mm_.BackwardWeight(dw, dout, in, n_, k, n);
  if (db != nullptr) ColumnSumAccumulate<bf16>(db, dout, n_, n, scratch(), MainStream());
}

void BF16GptModel::LayerBackward(int l) {
  Layer& a = layers_[l];
  if (a.recompute) {
    prof_.Begin("recompute");
    AddLayerNormForward<bf16>(nullptr, a.ln1, a.ln1_mean, a.ln1_rstd, nullptr, x_[l], a.ln1_w,
                              a.ln1_b, n_, h_, eps_, Drop(l - 1, 2), MainStream());
    LayerForward(l);  // ends with the MLP output in branch_, which the backward does not need
  } else if (opt_.recompute_gelu) {
    prof_.Begin("gelu");
    GeluForward<bf16>(a.gelu, a.pre, n_ * ffn_, tanh_gelu_, MainStream());
  }
  // On entry dx_ = d(x_[l+1]) and dbranch_ = d(MLP output), the dropout already applied.
  prof_.Begin("matmul bwd fc2");
  WeightGrad(a.d_fc2_w, a.d_fc2_b, dbranch_, a.gelu, ffn_, h_);
  if (tanh_gelu_) {  // GELU's derivative in the matmul's epilogue
    mm_.BackwardDataGelu(dfc_, dbranch_, a.fc2_w, a.pre, n_, ffn_, h_);
  } else {
    mm_.BackwardData(dfc_, dbranch_, a.fc2_w, n_, ffn_, h_);
    prof_.Begin("gelu");
    GeluBackward<bf16>(dfc_, dfc_, a.pre, n_ * ffn_, false, MainStream());
  }
  prof_.Begin("matmul bwd fc1");
  mm_.BackwardData(dln_, dfc_, a.fc1_w, n_, h_, ffn_);
  WeightGrad(a.d_fc1_w, a.d_fc1_b, dfc_, a.ln2, h_, ffn_);
  prof_.Begin("layernorm bwd");
  LayerNormBackward<bf16>(dx_, dbranch_, a.d_ln2_w, a.d_ln2_b, dln_, dx_, a.mid, a.ln2_w,
                          a.ln2_mean, a.ln2_rstd, n_, h_, Drop(l, 1), scratch(), MainStream());
  prof_.Begin("matmul bwd proj");
  mm_.BackwardData(datt_, dbranch_, a.proj_w, n_, h_, h_);
  WeightGrad(a.d_proj_w, a.d_proj_b, dbranch_, a.att, h_, h_);
  prof_.Begin("attention bwd");
  attention_->Backward(dqkv_, datt_, a.qkv, a.att, a.stats, attn_workspace_);
  prof_.Begin("matmul bwd qkv");
  mm_.BackwardData(dln_, dqkv_, a.qkv_w, n_, h_, 3 * h_);
  WeightGrad(a.d_qkv_w, a.d_qkv_b, dqkv_, a.ln1, h_, 3 * h_);
  // d(x_[l]) = residual + LayerNorm's share; the part into the previous layer's MLP output (or
  // the embedding) goes through that site's dropout mask.
  prof_.Begin("layernorm bwd");
  LayerNormBackward<bf16>(dx_, dbranch_, a.d_ln1_w, a.d_ln1_b, dln_, dx_, x_[l], a.ln1_w,
                          a.ln1_mean, a.ln1_rstd, n_, h_, l > 0 ? Drop(l - 1, 2) : Drop(-1, 0),
                          scratch(), MainStream());
  prof_.End();
}

void BF16GptModel::Backward(int, const float*, float loss_scale) {
  if (!has_grad_) return;  // no labelled token: no gradient
  if (loss_scale != opt_.loss_scale) {
    Die("BF16GptModel::Backward", "loss scale differs from the one the forward applied", __FILE__,
        __LINE__);
  }
  const int num_layers = static_cast<int>(layers_.size());
  prof_.Begin("layernorm bwd");
  LayerNormBackward<bf16>(dx_, dbranch_, d_lnf_w_, d_lnf_b_, dlnf_, nullptr, x_[num_layers], lnf_w_,
                          lnf_mean_, lnf_rstd_, n_, h_,
                          num_layers > 0 ? Drop(num_layers - 1, 2) : Drop(-1, 0), scratch(),
                          MainStream());
  prof_.End();
  for (int l = num_layers - 1; l >= 0; --l) LayerBackward(l);
  prof_.Begin("embedding bwd");
  EmbeddingBackward<bf16>(d_wte_, dbranch_, tokens_, n_, h_, 0, vocab_, scratch(), MainStream());
  PositionBackward<bf16>(d_wpe_, dbranch_, positions_, n_, h_, scratch(), MainStream());
  prof_.End();
}

}  // namespace

absl::Status BF16Supported(const ckpt::ModelLayout& layout, const BF16Options& options) {
  const ckpt::ModelConfig& c = layout.config();
  const ckpt::ParallelConfig& p = layout.parallel();
  auto no = [](auto... what) {
    return absl::UnimplementedError(absl::StrCat("--bf16 on the cuda backend: ", what...));
  };
  if (p.tp != 1 || p.pp != 1 || p.vpp != 1)
    return no(
        "one GPU per model replica for now (tensor/pipeline parallel need the NCCL "
        "backend); got TP ",
        p.tp, " PP ", p.pp);
  if (c.normalization != ckpt::NormType::kLayerNorm) return no("RMSNorm is not supported");
  if (c.swiglu()) return no("SwiGLU is not supported");
  if (c.position_embedding_type != ckpt::PositionEmbedding::kLearnedAbsolute)
    return no("rotary position embeddings are not supported");
  if (c.num_query_groups != c.num_attention_heads)
    return no("grouped-query attention is not supported");
  if (options.model.attention_dropout > 0.0f)
    return no(
        "attention dropout is not supported by the flash-attention path; pass "
        "--attention-dropout 0");
  if (options.model.sequence_parallel) return no("sequence parallelism needs TP > 1");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StageModel>> CreateBF16GptModel(const ckpt::ModelLayout& layout,
                                                               ParamStore* params,
                                                               const BF16Options& options) {
  if (absl::Status s = BF16Supported(layout, options); !s.ok()) return s;
  const ckpt::ModelConfig& c = layout.config();
  absl::StatusOr<std::unique_ptr<FlashAttention>> attention =
      FlashAttention::Create(options.model.micro_batch, options.model.seq_length,
                             c.num_attention_heads, c.num_query_groups, c.kv_channels);
  if (!attention.ok()) return attention.status();
  return std::unique_ptr<StageModel>(
      new BF16GptModel(layout, params, options, std::move(*attention)));
}

int64_t DeviceMemoryInUse() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return -1;
  return static_cast<int64_t>(total_bytes - free_bytes);
}

}  // namespace leantron::trainer::cuda
