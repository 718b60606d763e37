#include "trainer/cuda/nn/bf16_model.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "trainer/cuda/device_memory.h"
#include "trainer/cuda/fp8_products.h"
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/matmul.h"
#include "trainer/cuda/nn/flash_attention.h"
#include "trainer/cuda/nn/modules.h"
#include "trainer/cuda/nn/transformer_layer.h"
#include "trainer/cuda/op_profile.h"
#include "trainer/cuda/parallel/tensor_parallel.h"

namespace leantron::trainer::cuda {
namespace {

class Bf16Model final : public StageModel, public StepCopies {
 public:
  Bf16Model(const ckpt::ModelLayout& layout, ParamStore* params, const Bf16Options& options,
            std::unique_ptr<CoreAttention> attention);
  ~Bf16Model() override;

  bool first_stage() const override { return first_stage_; }
  bool last_stage() const override { return last_stage_; }
  int first_layer() const override { return first_layer_; }
  int last_layer() const override { return first_layer_ + static_cast<int>(layers_.size()); }
  int64_t hidden_rows() const override { return geo_.local_rows; }
  // Stage messages are bf16 [rows, h]: counted in floats, as the schedule sends them.
  int64_t hidden_size() const override { return geo_.hidden / 2; }
  void BeginStep() override;
  // Returns 0: the loss stays on the device (TakeDeferredLoss), so the last stage never waits
  // for its GPU between micro-batches.
  float Forward(int slot, const MicroBatch& mb, const float* input) override;
  double TakeDeferredLoss() override { return head_ ? head_->TakeLoss() : 0.0; }
  const float* Output(int slot) const override {
    return reinterpret_cast<const float*>(slots_[slot]->x.back());
  }
  void Backward(int slot, const float* doutput, float loss_scale) override;
  const float* InputGrad() const override { return reinterpret_cast<const float*>(dx_); }
  float* input_buffer() override { return reinterpret_cast<float*>(recv_input_); }
  float* grad_buffer() override { return reinterpret_cast<float*>(recv_grad_); }
  int64_t recomputed_layers() const override { return recomputed_layers_; }
  int64_t activation_bytes() const override { return memory_.bytes(); }
  bool StepTimes(double* compute_ms, double* tp_comm_ms) const override {
    return prof_.Averages(compute_ms, tp_comm_ms);
  }
  bool ProductTimes(double* fp8_ms, double* fp8_cast_ms, double* bf16_ms) const override {
    return opt_.fp8.enabled && prof_.PrecisionAverages(fp8_ms, fp8_cast_ms, bf16_ms);
  }
  // FP8 weights under delayed scaling: the step writes them (Fp8Products::StepWeight).
  StepCopies* step_copies() override { return fp8_scaling_ ? this : nullptr; }
  std::vector<std::pair<size_t, size_t>> CopiedWeights() const override {
    std::vector<std::pair<size_t, size_t>> out;
    if (!fp8_scaling_ || !opt_.fp8.delayed) return out;
    for (const Fp8Products::WeightCopy& w : fp8_->weights())
      out.push_back({static_cast<size_t>(w.w16 - w16_), static_cast<size_t>(w.n * w.k)});
    return out;
  }
  // The scales move on for the weights the step makes (the amaxes of this step's casts are all
  // recorded), so that the step can cast with them.
  void WeightsWillStep() override {
    fp8_scaling_->NewWeights(AsNccl(opt_.fp8_amax_group));
    fp8_version_ = params_->weights_version() + 1;  // the optimizer's WeightsStepped follows
  }
  void Update(size_t i, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
              const AdamWConstants& c, uint16_t* bf16_out) override {
    fp8_->StepWeight(i, param, grad, exp_avg, exp_avg_sq, c, reinterpret_cast<bf16*>(bf16_out));
  }
  // The scaling state, and one float more: 1 when the scales have moved on for the current
  // weights already (the step that made them did it), so that a resumed run does not move them
  // twice.
  std::vector<float> Fp8State() const override {
    if (!fp8_scaling_) return {};
    std::vector<float> state(fp8_scaling_->state_floats() + 1);
    LT_CUDA_CHECK(cudaMemcpyAsync(state.data(), fp8_scaling_->state(),
                                  fp8_scaling_->state_floats() * sizeof(float),
                                  cudaMemcpyDeviceToHost, MainStream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    state.back() = fp8_version_ == params_->weights_version() ? 1.0f : 0.0f;
    return state;
  }
  void SyncFp8State() override {
    if (fp8_scaling_) fp8_scaling_->ReduceHistories(AsNccl(opt_.fp8_amax_group));
  }
  // After the load has written the weights.
  void SetFp8State(const std::vector<float>& state) override {
    if (!fp8_scaling_ || state.size() != fp8_scaling_->state_floats() + 1)
      Die("Bf16Model::SetFp8State", "FP8 state of another size", __FILE__, __LINE__);
    LT_CUDA_CHECK(cudaMemcpyAsync(fp8_scaling_->state(), state.data(),
                                  fp8_scaling_->state_floats() * sizeof(float),
                                  cudaMemcpyHostToDevice, MainStream()));
    LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
    if (state.back() == 1.0f) fp8_version_ = params_->weights_version();
    fp8_scaling_->Restored();
    fp8_scaling_->CopiesStale();  // the weights were loaded: cast them again
  }

 private:
  // One micro-batch in flight.
  struct Slot {
    MicroBatch mb;
    bool has_grad = false;
    float grad_scale = 0.0f;
    int32_t *tokens = nullptr, *labels = nullptr;  // all rows
    // Pinned staging of tokens and labels, reused once the previous copy from it has run.
    int32_t* host_ids = nullptr;
    cudaEvent_t ids_copied = nullptr;
    std::vector<bf16*> x;  // [layers + 1] residual stream, this rank's rows
    std::vector<TransformerLayer::Acts> acts;
    bf16 *lnf = nullptr, *dlnf = nullptr;  // last stage
    Norm::Stats lnf_stats;
    float* losses = nullptr;
  };
  Slot& GetSlot(int index);
  HiddenDropout Drop(const Slot& s, int global_layer, int site) const;
  // The dropout of the branch that feeds chunk layer l's input (the previous layer's MLP output,
  // or the embedding's).
  HiddenDropout InputDrop(const Slot& s, int l) const {
    const int g = layers_[l].global_index();
    return g > 0 ? Drop(s, g - 1, 2) : Drop(s, -1, 0);
  }

  const ckpt::ModelLayout& layout_;
  ParamStore* params_;
  Bf16Options opt_;
  ModelSpec spec_;
  bool first_stage_ = true, last_stage_ = true;
  int first_layer_ = 0;
  RowGeometry geo_;
  // Declared before everything that allocates: freed last.
  DeviceMemory memory_;
  OpProfile prof_;
  Matmul mm_;
  // FP8 layers' state and products (--fp8-format; null when no layer of the chunk is FP8).
  std::unique_ptr<Fp8Scaling> fp8_scaling_;
  std::unique_ptr<Fp8Products> fp8_;
  std::unique_ptr<TensorParallel> tp_;
  std::unique_ptr<CoreAttention> attention_;
  ModuleContext ctx_;

  // bf16 copy of the whole flat parameter buffer, shared by the chunks of a stage (the first one
  // allocates it; the optimizer keeps it in step); converted anew after the fp32 weights were
  // rewritten, gathered from the other DP ranks after a distributed-optimizer step (by the
  // gradient reducer, on StepBegins).
  bf16* w16_ = nullptr;
  bool owns_w16_ = false;
  uint64_t w16_version_ = 0;  // ParamStore::weights_version() it reflects
  uint64_t fp8_version_ = 0;  // the weights version the FP8 scales last moved on for
  StageTensors<bf16> stage_;  // embeddings, final norm, output layer (bf16 copy)

  std::vector<TransformerLayer> layers_;
  std::unique_ptr<Embedding> embedding_;
  std::unique_ptr<Norm> final_norm_;
  std::unique_ptr<OutputHead> head_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<TransformerLayer::Acts> shared_acts_;  // recomputed layers
  bf16* shared_act_ = nullptr;                           // --recompute-gelu
  bf16* shared_norm_ = nullptr;                          // --recompute-modules layernorm
  bf16* shared_pre_ = nullptr;                           // --recompute-modules mlp
  bf16* fp8_norm_ = nullptr;  // FP8 layers' norm outputs, read by the forward only
  bf16 *junk_ = nullptr, *lnf_full_ = nullptr, *dlnf_full_ = nullptr;
  bf16* dx_ = nullptr;  // the residual stream's gradient, this rank's rows
  bf16 *recv_input_, *recv_grad_;
  int64_t recomputed_layers_ = 0;  // layer forwards run again in backwards
};

Bf16Model::Bf16Model(const ckpt::ModelLayout& layout, ParamStore* params,
                     const Bf16Options& options, std::unique_ptr<CoreAttention> attention)
    : layout_(layout),
      params_(params),
      opt_(options),
      spec_(ModelSpecFromConfig(layout.config(), layout.padded_vocab_size())),
      prof_(options.profile_ops, options.fp8.enabled),
      mm_(/*tune=*/!options.deterministic),
      attention_(std::move(attention)) {
  const ckpt::ParallelConfig& p = layout.parallel();
  NcclCommunicator* tp = AsNccl(opt_.tp);
  const int tp_size = tp != nullptr && tp->size() > 1 ? tp->size() : 1;
  const int tp_rank = tp_size > 1 ? tp->rank() : 0;
  const bool sp = opt_.model.sequence_parallel && tp_size > 1;
  first_stage_ = opt_.pp_rank == 0 && opt_.virtual_chunk == 0;
  last_stage_ = opt_.pp_rank == p.pp - 1 && opt_.virtual_chunk == p.vpp - 1;
  const int64_t b = opt_.model.micro_batch, t = opt_.model.seq_length, n = b * t;
  const int64_t h = spec_.hidden;
  geo_.rows = n;
  geo_.local_rows = sp ? n / tp_size : n;
  geo_.row_offset = sp ? tp_rank * geo_.local_rows : 0;
  geo_.hidden = h;
  tp_ = std::make_unique<TensorParallel>(tp, sp, geo_, opt_.tp_copy_engine, &prof_);
  const int64_t rows_l = geo_.local_rows;
  const int64_t vocab_l = spec_.padded_vocab / tp_size;

  // The bf16 copy: the store's (whole, or with optim_grads_params in its weight buffers, the
  // layers' tensors in slots that the WeightGatherer fills before use), or this model's.
  if (params_->bf16_copy() == nullptr && params_->weights() == nullptr) {
    w16_ = memory_.Alloc<bf16>(params_->size());
    params_->set_bf16_copy(reinterpret_cast<uint16_t*>(w16_));
    owns_w16_ = true;
  } else {
    w16_ = reinterpret_cast<bf16*>(params_->bf16_copy());
  }
  auto w16 = [&](const std::string& name) -> const bf16* {
    const ParamView* v = params_->Find(name);
    return v ? reinterpret_cast<const bf16*>(params_->Bf16At(v->offset)) : nullptr;
  };
  auto f32 = [&](const std::string& name) -> const float* { return params_->Param(name); };
  auto grad = [&](const std::string& name) { return params_->Grad(name); };
  stage_ = BindStageTensors<bf16>(*params_, first_stage_, last_stage_, w16, f32, grad);

  // Shared buffers and scratch, sized for the widest layer of the chunk.
  const auto [first, last] = layout.StageLayers(opt_.pp_rank, opt_.virtual_chunk);
  first_layer_ = first;
  int64_t qkv_width = 0, attn_width = 0, ffn = 0, act_width = 0;
  bool grouped = false, gated = false;
  const AttentionSpec* rope = nullptr;
  for (int i = first; i < last; ++i) {
    const LayerSpec& ls = spec_.layers[i];
    const LayerShard shard = ShardOf(ls, tp_size);
    qkv_width = std::max(qkv_width, shard.qkv_width);
    attn_width = std::max(attn_width, shard.attn_width);
    ffn = std::max(ffn, shard.fc1_width);
    act_width = std::max(act_width, shard.ffn);
    grouped = grouped || !ls.attention.interleaved_mha();
    gated = gated || ls.mlp.gated();
    if (ls.attention.rope) rope = &ls.attention;
  }
  ctx_.memory = &memory_;
  ctx_.linear.mm = &mm_;
  ctx_.linear.tp = tp_.get();
  ctx_.linear.prof = &prof_;
  ctx_.batch = b;
  ctx_.seq = t;
  RowParallelBuffers& row_out = ctx_.row_out;
  row_out.partial = memory_.Alloc<bf16>(n * h);
  if (sp && tp_size == 2) {  // partial sums exchanged with the peer (RowParallelLinear)
    row_out.local = tp_->LocalRows(row_out.partial);
    row_out.peer = memory_.Alloc<bf16>(rows_l * h);
  } else {
    row_out.local = sp ? memory_.Alloc<bf16>(rows_l * h) : row_out.partial;
  }
  junk_ = memory_.Alloc<bf16>(rows_l * h);
  if (last_stage_) {
    lnf_full_ = sp ? memory_.Alloc<bf16>(n * h) : nullptr;
    dlnf_full_ = memory_.Alloc<bf16>(n * h);
  }
  dx_ = memory_.Alloc<bf16>(rows_l * h);
  // Under SP this rank's rows of the branch gradient sit in place inside the gathered buffer.
  ctx_.dbranch_full = memory_.Alloc<bf16>(sp ? n * h : rows_l * h);
  ctx_.dln = memory_.Alloc<bf16>(n * h);
  ctx_.dqkv = memory_.Alloc<bf16>(n * qkv_width);
  ctx_.datt = memory_.Alloc<bf16>(n * attn_width);
  ctx_.dfc = memory_.Alloc<bf16>(n * ffn);
  if (grouped) ctx_.dqkv_attention = memory_.Alloc<bf16>(n * qkv_width);
  if (gated) ctx_.dact = memory_.Alloc<bf16>(n * act_width);
  if (rope != nullptr) {  // one table for the chunk: its layers share base, head dim and scaling
    std::vector<float> cos, sin;
    RopeTable(RopeInverseFrequencies(rope->rotary_base, rope->head_dim, rope->rope_scaling), t,
              &cos, &sin);
    float* table = memory_.Alloc<float>(cos.size() + sin.size());
    LT_CUDA_CHECK(
        cudaMemcpy(table, cos.data(), cos.size() * sizeof(float), cudaMemcpyHostToDevice));
    LT_CUDA_CHECK(cudaMemcpy(table + cos.size(), sin.data(), sin.size() * sizeof(float),
                             cudaMemcpyHostToDevice));
    ctx_.rope_cos = table;
    ctx_.rope_sin = table + cos.size();
  }
  recv_input_ = memory_.Alloc<bf16>(rows_l * h);
  recv_grad_ = memory_.Alloc<bf16>(rows_l * h);
  const int64_t widest = std::max<int64_t>(qkv_width, std::max(ffn, h));
  const size_t scratch_bytes =
      std::max({LayerNormBackwardScratchBytes(rows_l, h), ColumnSumScratchBytes(n, widest),
                EmbeddingBackwardScratchBytes(n, h), size_t{1} << 20});
  ctx_.linear.scratch = {memory_.Alloc<char>(scratch_bytes), scratch_bytes};
  ctx_.linear.bias_grad = memory_.Alloc<float>(widest);
  ctx_.attn_workspace = memory_.Alloc<char>(attention_->workspace_bytes());

  // FP8 layers: all but --num-layers-at-start/end-in-bf16 at the model's ends.
  const int num_layers = static_cast<int>(spec_.layers.size());
  auto fp8_layer = [&](int i) {
    return opt_.fp8.enabled && i >= opt_.fp8.bf16_layers_start &&
           i < num_layers - opt_.fp8.bf16_layers_end;
  };
  int fp8_layers = 0;
  for (int i = first; i < last; ++i) fp8_layers += fp8_layer(i);
  const bool fp8_head = last_stage_ && opt_.fp8.enabled && opt_.fp8.output_layer;
  // The output layer's logits a chunk of rows at a time: up to 2 GiB of bf16 logits, in multiples
  // of 16 rows for FP8 products (their weight gradient reduces over the rows).
  int64_t chunk_rows = opt_.logits_chunk_rows > 0
                           ? std::min<int64_t>(n, opt_.logits_chunk_rows)
                           : std::clamp<int64_t>((int64_t{1} << 30) / vocab_l, 1, n);
  if (fp8_head) chunk_rows = std::max<int64_t>(16, chunk_rows / 16 * 16);
  if (fp8_layers > 0 || fp8_head) {
    fp8_scaling_ =
        std::make_unique<Fp8Scaling>(opt_.fp8, 4 * fp8_layers + (fp8_head ? 1 : 0), &memory_);
    fp8_ = std::make_unique<Fp8Products>(
        fp8_scaling_.get(), n, std::max({h, attn_width, act_width}), std::max({h, qkv_width, ffn}),
        &memory_, fp8_head ? chunk_rows * vocab_l : 0);
    ctx_.linear.fp8 = fp8_.get();
  }
  const int recompute = std::min(opt_.model.recompute_layers, last - first);
  layers_.reserve(last - first);
  for (int i = first; i < last; ++i) {
    LayerTensors<bf16> w;
    BindLayerTensors(&w, i, w16, f32, grad);
    layers_.emplace_back(ctx_, spec_.layers[i], ShardOf(spec_.layers[i], tp_size), attention_.get(),
                         w, i - first < recompute, fp8_layer(i));
  }
  if (first_stage_) {
    embedding_ = std::make_unique<Embedding>(ctx_, h, vocab_l, stage_.word_emb, stage_.pos_emb,
                                             stage_.d_word_emb, stage_.d_pos_emb);
  }
  if (last_stage_) {
    final_norm_ = std::make_unique<Norm>(ctx_, spec_.final_norm, h, stage_.lnf_w, stage_.lnf_b,
                                         stage_.d_lnf_w, stage_.d_lnf_b);
    head_ = std::make_unique<OutputHead>(ctx_, h, vocab_l, chunk_rows, stage_.out_w, stage_.d_out_w,
                                         fp8_head);
  }
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
}

Bf16Model::~Bf16Model() {
  cudaStreamSynchronize(MainStream());
  if (owns_w16_) params_->set_bf16_copy(nullptr);
  for (const auto& s : slots_) {
    if (!s) continue;
    cudaFreeHost(s->host_ids);
    cudaEventDestroy(s->ids_copied);
  }
}

// Slots are allocated on first use; the schedule uses at most min(micro-batches, warm-up + 1).
Bf16Model::Slot& Bf16Model::GetSlot(int index) {
  if (index < static_cast<int>(slots_.size()) && slots_[index]) return *slots_[index];
  if (index >= static_cast<int>(slots_.size())) slots_.resize(index + 1);
  auto s = std::make_unique<Slot>();
  const int64_t n = geo_.rows, rows_l = geo_.local_rows, h = geo_.hidden;
  s->tokens = memory_.Alloc<int32_t>(n);
  s->labels = memory_.Alloc<int32_t>(n);
  LT_CUDA_CHECK(cudaMallocHost(&s->host_ids, 2 * n * sizeof(int32_t)));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&s->ids_copied, cudaEventDisableTiming));
  for (size_t l = 0; l <= layers_.size(); ++l) s->x.push_back(memory_.Alloc<bf16>(rows_l * h));
  if (opt_.model.recompute_norms && shared_norm_ == nullptr)
    shared_norm_ = memory_.Alloc<bf16>(n * h);
  if (!opt_.model.recompute_norms && fp8_norm_ == nullptr &&
      std::any_of(layers_.begin(), layers_.end(),
                  [](const TransformerLayer& l) { return l.fp8() && !l.recompute(); }))
    fp8_norm_ = memory_.Alloc<bf16>(n * h);
  // With GELU or MLP recomputation every layer shares one activation buffer (and with MLP
  // recomputation one fc1 output buffer), rebuilt in the backward: as wide as the widest layer's.
  if ((opt_.recompute_gelu || opt_.model.recompute_mlp) && shared_act_ == nullptr) {
    int64_t ffn = 0, fc1 = 0;
    for (const TransformerLayer& layer : layers_) {
      const LayerShard shard = ShardOf(spec_.layers[layer.global_index()], tp_->size());
      ffn = std::max(ffn, shard.ffn);
      fc1 = std::max(fc1, shard.fc1_width);
    }
    shared_act_ = memory_.Alloc<bf16>(n * ffn);
    if (opt_.model.recompute_mlp) shared_pre_ = memory_.Alloc<bf16>(n * fc1);
  }
  // Recomputed layers share one set, made by a bf16 layer when there is one (FP8 layers keep no
  // MLP activation).
  const TransformerLayer* shared_maker = nullptr;
  for (const TransformerLayer& layer : layers_) {
    if (layer.recompute() && (shared_maker == nullptr || shared_maker->fp8()))
      shared_maker = &layer;
  }
  for (const TransformerLayer& layer : layers_) {
    if (layer.recompute()) {  // the whole forward runs again: fc1's output is kept for it
      if (!shared_acts_) {
        shared_acts_ = std::make_unique<TransformerLayer::Acts>(
            shared_maker->MakeActs(shared_act_, shared_norm_));
      }
      s->acts.push_back(*shared_acts_);
    } else {
      s->acts.push_back(layer.MakeActs(shared_act_, shared_norm_, shared_pre_, fp8_norm_));
    }
  }
  if (last_stage_) {
    s->lnf = memory_.Alloc<bf16>(tp_->sequence_parallel() ? rows_l * h : n * h);
    s->dlnf = memory_.Alloc<bf16>(rows_l * h);
    s->lnf_stats = {memory_.Alloc<float>(rows_l), memory_.Alloc<float>(rows_l)};
    s->losses = memory_.Alloc<float>(n);
  }
  slots_[index] = std::move(s);
  return *slots_[index];
}

HiddenDropout Bf16Model::Drop(const Slot& s, int global_layer, int site) const {
  HiddenDropout d;
  d.p = s.mb.training ? opt_.model.hidden_dropout : 0.0f;
  d.seed = DropoutSiteSeed(opt_.model.seed, global_layer, site);
  d.first_sample = s.mb.first_sample;
  d.seq_length = opt_.model.seq_length;
  d.row_offset = geo_.row_offset;
  return d;
}

void Bf16Model::BeginStep() {
  prof_.Step();
  // Listeners first: the gradient reducer measures the last step and, after a distributed-
  // optimizer step, starts gathering the other ranks' parts of the weights (and of this copy).
  Notify([](ModelEvents& e) { e.StepBegins(); });
  // After a rewrite of the fp32 weights (initialisation, loading) the copy is converted anew (the
  // first chunk does it for all; weights on the host are pinned memory, which the kernel reads
  // across the bus); after optimizer steps AdamW has written it.
  if (params_->weights_version() != w16_version_) {
    if (owns_w16_ && params_->weights_rewritten() > w16_version_) {
      // The fp32 weights may lie in two places (offloaded in part): run by run.
      for (size_t at = 0, n = params_->size(); at < n;) {
        const size_t end = params_->MasterRunEnd(at);
        ConvertFromFloat<bf16>(w16_ + at, params_->Master(at), end - at, MainStream());
        at = end;
      }
    }
    w16_version_ = params_->weights_version();
  }
  // New weights the step did not announce (initialisation, loading): delayed scales move on once
  // per version, and each FP8 weight is cast again at its next use.
  if (fp8_scaling_ && params_->weights_version() != fp8_version_) {
    fp8_scaling_->NewWeights(AsNccl(opt_.fp8_amax_group));
    fp8_version_ = params_->weights_version();
  }
  if (head_) head_->BeginStep();
}

float Bf16Model::Forward(int slot, const MicroBatch& mb, const float* input) {
  Slot& s = GetSlot(slot);
  const int64_t n = geo_.rows, rows_l = geo_.local_rows, h = geo_.hidden;
  const bool sp = tp_->sequence_parallel();
  s.mb = mb;
  int64_t valid = 0;
  for (int32_t label : mb.labels) valid += label >= 0;
  s.has_grad = mb.training && valid > 0;
  s.grad_scale = s.has_grad ? opt_.loss_scale / static_cast<float>(valid) : 0.0f;
  LT_CUDA_CHECK(cudaEventSynchronize(s.ids_copied));  // the slot's previous copy has run
  std::memcpy(s.host_ids, mb.tokens.data(), n * sizeof(int32_t));
  std::memcpy(s.host_ids + n, mb.labels.data(), n * sizeof(int32_t));
  LT_CUDA_CHECK(cudaMemcpyAsync(s.tokens, s.host_ids, n * sizeof(int32_t), cudaMemcpyHostToDevice,
                                MainStream()));
  LT_CUDA_CHECK(cudaMemcpyAsync(s.labels, s.host_ids + n, n * sizeof(int32_t),
                                cudaMemcpyHostToDevice, MainStream()));
  LT_CUDA_CHECK(cudaEventRecord(s.ids_copied, MainStream()));
  if (fp8_) fp8_->set_record(mb.training);  // evaluations leave the amax histories alone
  Notify([](ModelEvents& e) { e.WeightsNeeded(-1); });
  if (first_stage_) {
    embedding_->Forward(s.tokens, s.x[0], Drop(s, -1, 0));
  } else {
    LT_CUDA_CHECK(cudaMemcpyAsync(s.x[0], input, rows_l * h * sizeof(bf16),
                                  cudaMemcpyDeviceToDevice, MainStream()));
  }
  const int num_layers = static_cast<int>(layers_.size());
  if (num_layers > 0) {
    Notify([](ModelEvents& e) { e.WeightsNeeded(0); });
    layers_[0].NormInput(nullptr, {s.x[0], nullptr}, nullptr, s.acts[0], Drop(s, -1, 0));
  }
  for (int l = 0; l < num_layers; ++l) {
    const TransformerLayer& layer = layers_[l];
    const RowParallelOutput mlp =
        layer.Forward(s.x[l], s.acts[l], Drop(s, layer.global_index(), 1));
    // The residual add closing layer l, fused with the norm that reads its result.
    const HiddenDropout drop = Drop(s, layer.global_index(), 2);
    if (l + 1 < num_layers) {
      Notify([&](ModelEvents& e) { e.WeightsNeeded(l + 1); });
      layers_[l + 1].NormInput(s.acts[l].mid, mlp, s.x[l + 1], s.acts[l + 1], drop);
    } else if (last_stage_) {
      Notify([](ModelEvents& e) { e.HeadWeightsNeeded(); });
      bf16* out = sp ? lnf_full_ : s.lnf;
      final_norm_->Forward(s.acts[l].mid, mlp, s.x[l + 1], tp_->LocalRows(out), s.lnf_stats, drop,
                           out);
    } else {  // the stage's output x[L]: the fused kernel's norm output is not needed
      layer.input_norm().Forward(s.acts[l].mid, mlp, s.x[l + 1], junk_, {}, drop);
    }
    // The add just issued read layer l's last bias (`mlp`).
    Notify([&](ModelEvents& e) { e.LayerForwardDone(l); });
  }
  if (!last_stage_) return 0.0f;
  bf16* lnf = sp ? lnf_full_ : s.lnf;
  if (num_layers == 0) {
    Notify([](ModelEvents& e) { e.HeadWeightsNeeded(); });
    final_norm_->Forward(nullptr, {s.x[0], nullptr}, nullptr, tp_->LocalRows(lnf), s.lnf_stats,
                         Drop(s, -1, 0), lnf);
  }
  head_->Forward(lnf, s.labels, s.losses, s.grad_scale, sp ? dlnf_full_ : s.dlnf, s.dlnf);
  return 0.0f;
}

void Bf16Model::Backward(int slot, const float* doutput, float loss_scale) {
  Slot& s = *slots_[slot];
  Notify([](ModelEvents& e) { e.BackwardBegins(); });
  const int num_layers = static_cast<int>(layers_.size());
  const int64_t rows_l = geo_.local_rows, h = geo_.hidden;
  if (last_stage_ && !s.has_grad) {  // no labelled token: no gradient, the reduction still runs
    // Every event of a backward, so that the listeners issue the same collectives as the other
    // data-parallel ranks (the gradient reduction, ZeRO-3's gathers).
    for (int l = num_layers - 1; l >= 0; --l) {
      Notify([&](ModelEvents& e) { e.LayerBackwardBegins(l); });
      Notify([&](ModelEvents& e) { e.LayerBackwardDone(l); });
    }
    Notify([](ModelEvents& e) { e.BackwardDone(); });
    LT_CUDA_CHECK(cudaMemsetAsync(dx_, 0, rows_l * h * sizeof(bf16), MainStream()));
    return;
  }
  if (loss_scale != opt_.loss_scale) {
    Die("Bf16Model::Backward", "loss scale differs from the one the forward applied", __FILE__,
        __LINE__);
  }
  const HiddenDropout last_drop =
      num_layers > 0 ? Drop(s, layers_.back().global_index(), 2) : Drop(s, -1, 0);
  // The gradient of the last layer's MLP output (all rows), through its dropout.
  bf16* dbranch = nullptr;
  if (last_stage_) {
    dbranch = final_norm_->Backward(dx_, s.dlnf, nullptr, s.x[num_layers], s.lnf_stats, last_drop);
  } else {  // the next stage's gradient of this stage's output
    bf16* local = tp_->LocalRows(ctx_.dbranch_full);
    prof_.Begin("stage input");
    LT_CUDA_CHECK(cudaMemcpyAsync(dx_, doutput, rows_l * h * sizeof(bf16), cudaMemcpyDeviceToDevice,
                                  MainStream()));
    LT_CUDA_CHECK(cudaMemcpyAsync(local, doutput, rows_l * h * sizeof(bf16),
                                  cudaMemcpyDeviceToDevice, MainStream()));
    Dropout<bf16>(local, rows_l, h, last_drop, MainStream());
    dbranch = ctx_.dbranch_full;
  }
  prof_.End();
  for (int l = num_layers - 1; l >= 0; --l) {
    const TransformerLayer& layer = layers_[l];
    const TransformerLayer::Acts& a = s.acts[l];
    Notify([&](ModelEvents& e) { e.LayerBackwardBegins(l); });
    if (layer.recompute()) {
      layer.Recompute(s.x[l], a, Drop(s, layer.global_index(), 1));
      ++recomputed_layers_;
    } else if (opt_.recompute_gelu && !a.mlp_recomputed) {
      layer.RecomputeActivation(a);
    }
    dbranch =
        layer.Backward(dx_, dbranch, s.x[l], a, Drop(s, layer.global_index(), 1), InputDrop(s, l));
    Notify([&](ModelEvents& e) { e.LayerBackwardDone(l); });
  }
  if (first_stage_) embedding_->Backward(dbranch, s.tokens);
  Notify([](ModelEvents& e) { e.BackwardDone(); });
}

}  // namespace

absl::Status Bf16Supported(const ckpt::ModelLayout& layout, const Bf16Options& options) {
  const ckpt::ModelConfig& c = layout.config();
  const ckpt::ParallelConfig& p = layout.parallel();
  auto no = [](auto... what) {
    return absl::UnimplementedError(absl::StrCat("--bf16 on the cuda backend: ", what...));
  };
  if (p.tp > 1 && AsNccl(options.tp) == nullptr)
    return no("tensor parallelism needs NCCL process groups");
  if (c.kv_channels % 8 != 0 || c.kv_channels > 256)
    return no(
        "flash attention needs a head dimension that is a multiple of 8 and at most 256, not ",
        c.kv_channels);
  if (options.model.attention_dropout > 0.0f)
    return no(
        "attention dropout is not supported by the flash-attention path; pass "
        "--attention-dropout 0");
  if (options.model.sequence_parallel &&
      (options.model.micro_batch * options.model.seq_length) % p.tp != 0)
    return no("sequence parallelism needs micro-batch x sequence divisible by TP");
  if (options.fp8.enabled) {
    // cuBLASLt's FP8 products reduce over, and lay out, every one of these dimensions.
    const int64_t kv = c.kv_channels;
    const std::pair<const char*, int64_t> dims[] = {
        {"the hidden size", c.hidden_size},
        {"the attention width per TP rank", c.num_attention_heads * kv / p.tp},
        {"the query/key/value width per TP rank",
         (c.num_attention_heads + 2 * c.num_query_groups) * kv / p.tp},
        {"the MLP width per TP rank", c.ffn_hidden_size / p.tp},
        {"micro-batch x sequence", options.model.micro_batch * options.model.seq_length},
        {"the vocabulary per TP rank (--fp8-output-layer)",
         options.fp8.output_layer ? layout.padded_vocab_size() / p.tp : 16}};
    for (const auto& [what, v] : dims) {
      if (v % 16 != 0)
        return no("FP8 products (--fp8-format) need ", what, " to be a multiple of 16, not ", v);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StageModel>> CreateBf16Model(const ckpt::ModelLayout& layout,
                                                            ParamStore* params,
                                                            const Bf16Options& options) {
  if (absl::Status s = Bf16Supported(layout, options); !s.ok()) return s;
  if (options.fp8.enabled && params->weights() != nullptr)
    return absl::UnimplementedError(
        "--bf16: FP8 layers keep whole weight copies; they do not go with the weights sharded "
        "per layer (optim_grads_params)");
  const ckpt::ModelConfig& c = layout.config();
  const ckpt::ParallelConfig& p = layout.parallel();
  const ModelSpec spec = ModelSpecFromConfig(c, layout.padded_vocab_size());
  absl::StatusOr<std::unique_ptr<FlashAttention>> attention = FlashAttention::Create(
      options.model.micro_batch, options.model.seq_length, c.num_attention_heads / p.tp,
      c.num_query_groups / p.tp, c.kv_channels,
      spec.layers.front().attention.interleaved_mha() ? QkvLayout::kInterleaved
                                                      : QkvLayout::kGrouped,
      options.deterministic ? FlashAttention::BackwardAlgo::kDeterministic
                            : FlashAttention::BackwardAlgo::kFast);
  if (!attention.ok()) return attention.status();
  return std::unique_ptr<StageModel>(new Bf16Model(layout, params, options, std::move(*attention)));
}

int64_t DeviceMemoryInUse() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return -1;
  return static_cast<int64_t>(total_bytes - free_bytes);
}

}  // namespace leantron::trainer::cuda
