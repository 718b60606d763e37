#include "trainer/model.h"

#include "absl/strings/str_format.h"

namespace leantron::trainer {

GptModel::GptModel(Ops* ops, const ckpt::ModelLayout& layout, Communicator* tp, ParamStore* params,
                   int pp_rank, int virtual_chunk, const ModelOptions& options)
    : ops_(ops), layout_(layout), tp_(tp), params_(params), opt_(options) {
  const ckpt::ModelConfig& c = layout.config();
  const ckpt::ParallelConfig& p = layout.parallel();
  tp_rank_ = tp->rank();
  tp_size_ = tp->size();
  first_stage_ = pp_rank == 0 && virtual_chunk == 0;
  last_stage_ = pp_rank == p.pp - 1 && virtual_chunk == p.vpp - 1;
  h_ = c.hidden_size;
  total_heads_ = c.num_attention_heads;
  heads_local_ = c.num_attention_heads / tp_size_;
  head_dim_ = c.kv_channels;
  ffn_local_ = c.ffn_hidden_size / tp_size_;
  groups_local_ = c.num_query_groups / tp_size_;
  qkv_width_ = (heads_local_ + 2 * groups_local_) * head_dim_;
  swiglu_ = c.swiglu();
  fc1_width_ = swiglu_ ? 2 * ffn_local_ : ffn_local_;
  rms_norm_ = c.normalization == ckpt::NormType::kRMSNorm;
  rope_ = c.position_embedding_type == ckpt::PositionEmbedding::kRope;
  rope_base_ = c.rotary_base;
  vocab_local_ = layout.padded_vocab_size() / tp_size_;
  rows_full_ = opt_.micro_batch * opt_.seq_length;
  rows_local_ = opt_.sequence_parallel ? rows_full_ / tp_size_ : rows_full_;
  eps_ = static_cast<float>(c.norm_epsilon);
  tanh_gelu_ = c.activation == ckpt::Activation::kGeluTanh;

  auto param = [&](const std::string& n) { return params_->Param(n); };
  auto grad = [&](const std::string& n) { return params_->Grad(n); };
  const auto [first_layer, last_layer] = layout.StageLayers(pp_rank, virtual_chunk);
  for (int i = first_layer; i < last_layer; ++i) {
    LayerWeights w;
    w.global_index = i;
    BindLayerTensors(&w, i, param, param, grad);
    layers_.push_back(w);
  }
  stage_ = BindStageTensors<float>(*params_, first_stage_, last_stage_, param, param, grad);
  dhidden_ = A(rows_local_ * h_);
  dtmp_ = A(rows_local_ * h_);
  dfull_ = A(rows_full_ * h_);
  dfull2_ = A(rows_full_ * h_);
  tmp_full_ = A(rows_full_ * h_);
  dqkv_ = A(rows_full_ * qkv_width_);
  dattn_ = A(rows_full_ * heads_local_ * head_dim_);
  dfc1_ = A(rows_full_ * fc1_width_);
  dgelu_ = A(rows_full_ * ffn_local_);
  dlogits_ = last_stage_ ? A(rows_full_ * vocab_local_) : nullptr;
  dlosses_ = A(rows_full_);
  std::vector<int32_t> positions(rows_local_);
  const int64_t row_offset = opt_.sequence_parallel ? tp_rank_ * rows_local_ : 0;
  for (int64_t r = 0; r < rows_local_; ++r)
    positions[r] = static_cast<int32_t>((row_offset + r) % opt_.seq_length);
  positions_ = AInt(rows_local_);
  ops_->CopyFromHost(positions_, positions.data(), rows_local_ * sizeof(int32_t));
  host_rows_.resize(rows_full_);
  recv_input_ = A(rows_local_ * h_);
  recv_grad_ = A(rows_local_ * h_);
}

GptModel::~GptModel() {
  for (float* p : allocations_) ops_->Free(p);
  for (void* p : byte_allocations_) ops_->FreeBytes(p);
}

int32_t* GptModel::AInt(size_t n) {
  void* p = ops_->AllocBytes(n * sizeof(int32_t));
  byte_allocations_.push_back(p);
  return static_cast<int32_t*>(p);
}

float* GptModel::A(size_t n) {
  float* p = ops_->Alloc(n);
  allocations_.push_back(p);
  return p;
}

GptModel::Slot& GptModel::GetSlot(int index) {
  if (index < static_cast<int>(slots_.size()) && slots_[index]) return *slots_[index];
  if (index >= static_cast<int>(slots_.size())) slots_.resize(index + 1);
  auto s = std::make_unique<Slot>();
  const bool sp = opt_.sequence_parallel;
  const int64_t nl = static_cast<int64_t>(layers_.size());
  s->tokens = AInt(rows_full_);
  s->labels = AInt(rows_full_);
  for (int64_t l = 0; l <= nl; ++l) s->hidden.push_back(A(rows_local_ * h_));
  for (int64_t l = 0; l < nl; ++l) {
    if (l < opt_.recompute_layers) {
      if (!recomputed_acts_) recomputed_acts_ = std::make_unique<LayerActs>(MakeLayerActs());
      s->layers.push_back(*recomputed_acts_);
      continue;
    }
    s->layers.push_back(MakeLayerActs());
  }
  if (last_stage_) {
    s->lnf = A(rows_local_ * h_);
    s->lnf_mean = A(rows_local_);
    s->lnf_rstd = A(rows_local_);
    s->lnf_full = sp ? A(rows_full_ * h_) : s->lnf;
    s->logits = A(rows_full_ * vocab_local_);
    s->ce_stats = A(2 * rows_full_);
    s->losses = A(rows_full_);
  }
  slots_[index] = std::move(s);
  return *slots_[index];
}

GptModel::LayerActs GptModel::MakeLayerActs() {
  const bool sp = opt_.sequence_parallel;
  LayerActs a;
  a.ln1 = A(rows_local_ * h_);
  a.ln1_mean = A(rows_local_);
  a.ln1_rstd = A(rows_local_);
  a.ln1_full = sp ? A(rows_full_ * h_) : a.ln1;
  a.qkv = A(rows_full_ * qkv_width_);
  const size_t probs = opt_.micro_batch * heads_local_ * opt_.seq_length * opt_.seq_length;
  if (opt_.recompute_attention) {
    if (shared_probs_ == nullptr) shared_probs_ = A(probs);
    a.probs = shared_probs_;
  } else {
    a.probs = A(probs);
  }
  a.attn = A(rows_full_ * heads_local_ * head_dim_);
  a.mid = A(rows_local_ * h_);
  a.ln2 = A(rows_local_ * h_);
  a.ln2_mean = A(rows_local_);
  a.ln2_rstd = A(rows_local_);
  a.ln2_full = sp ? A(rows_full_ * h_) : a.ln2;
  a.fc1 = A(rows_full_ * fc1_width_);
  a.gelu = A(rows_full_ * ffn_local_);
  return a;
}

HiddenDropout GptModel::HiddenDrop(const MicroBatch& mb, int layer, int site) const {
  HiddenDropout d;
  d.p = mb.training ? opt_.hidden_dropout : 0.0f;
  d.seed = DropoutSiteSeed(opt_.seed, layer, site);
  d.first_sample = mb.first_sample;
  d.seq_length = opt_.seq_length;
  d.row_offset = opt_.sequence_parallel ? tp_rank_ * rows_local_ : 0;
  return d;
}

AttentionDropout GptModel::AttnDrop(const MicroBatch& mb, int layer) const {
  AttentionDropout d;
  d.p = mb.training ? opt_.attention_dropout : 0.0f;
  d.seed = DropoutSiteSeed(opt_.seed, layer, 3);
  d.first_sample = mb.first_sample;
  d.head_offset = tp_rank_ * heads_local_;
  d.total_heads = total_heads_;
  return d;
}

const float* GptModel::GatherRows(const float* shard, float* full) {
  if (!opt_.sequence_parallel) return shard;
  tp_->AllGather(shard, full, rows_local_ * h_);
  return full;
}

void GptModel::ReduceRows(float* full, float* shard) {
  if (opt_.sequence_parallel) {
    tp_->ReduceScatter(full, shard, rows_local_ * h_);
    return;
  }
  if (tp_size_ > 1) tp_->AllReduceSum(full, rows_full_ * h_);
  if (shard != full) ops_->Copy(shard, full, rows_full_ * h_);
}

void GptModel::EmbeddingForward(Slot& s) {
  const int64_t vocab_begin = tp_rank_ * vocab_local_;
  ops_->EmbeddingForward(tmp_full_, s.tokens, stage_.word_emb, rows_full_, h_, vocab_begin,
                         vocab_begin + vocab_local_);
  ReduceRows(tmp_full_, s.hidden[0]);
  if (stage_.pos_emb != nullptr)
    ops_->PositionForward(s.hidden[0], positions_, stage_.pos_emb, rows_local_, h_);
  ops_->Dropout(s.hidden[0], rows_local_, h_, HiddenDrop(s.mb, -1, 0));
}

void GptModel::EmbeddingBackward(Slot& s) {
  ops_->Dropout(dhidden_, rows_local_, h_, HiddenDrop(s.mb, -1, 0));
  if (stage_.d_pos_emb != nullptr)
    ops_->PositionBackward(stage_.d_pos_emb, dhidden_, positions_, rows_local_, h_);
  const float* d = GatherRows(dhidden_, dfull_);
  const int64_t vocab_begin = tp_rank_ * vocab_local_;
  ops_->EmbeddingBackward(stage_.d_word_emb, d, s.tokens, rows_full_, h_, vocab_begin,
                          vocab_begin + vocab_local_);
}

void GptModel::LayerForward(Slot& s, int l) {
  const LayerWeights& w = layers_[l];
  LayerActs& a = s.layers[l];
  const float* x = s.hidden[l];
  float* y = s.hidden[l + 1];
  const int64_t n_local = rows_local_ * h_;
  const int64_t attn_width = heads_local_ * head_dim_;
  // Attention block: mid = x + dropout(proj(attention(qkv(ln1(x)))) + b_proj).
  NormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b, rows_local_, h_, eps_);
  const float* ln1 = GatherRows(a.ln1, a.ln1_full);
  ops_->LinearForward(a.qkv, ln1, w.qkv_w, w.qkv_b, rows_full_, h_, qkv_width_);
  if (rope_) {
    ops_->Rope(a.qkv, opt_.micro_batch, opt_.seq_length, heads_local_, groups_local_, head_dim_,
               rope_base_, /*inverse=*/false);
  }
  ops_->AttentionForward(a.attn, a.probs, a.qkv, opt_.micro_batch, opt_.seq_length, heads_local_,
                         groups_local_, head_dim_, AttnDrop(s.mb, w.global_index));
  ops_->LinearForward(tmp_full_, a.attn, w.proj_w, nullptr, rows_full_, attn_width, h_);
  ReduceRows(tmp_full_, a.mid);
  if (w.proj_b) ops_->AddBias(a.mid, w.proj_b, rows_local_, h_);
  ops_->Dropout(a.mid, rows_local_, h_, HiddenDrop(s.mb, w.global_index, 1));
  ops_->AddInPlace(a.mid, x, n_local);
  // MLP block: y = mid + dropout(fc2(gelu(fc1(ln2(mid)))) + b_fc2).
  NormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.mid, w.ln2_w, w.ln2_b, rows_local_, h_, eps_);
  const float* ln2 = GatherRows(a.ln2, a.ln2_full);
  ops_->LinearForward(a.fc1, ln2, w.fc1_w, w.fc1_b, rows_full_, h_, fc1_width_);
  ActivationForward(a.gelu, a.fc1);
  ops_->LinearForward(tmp_full_, a.gelu, w.fc2_w, nullptr, rows_full_, ffn_local_, h_);
  ReduceRows(tmp_full_, y);
  if (w.fc2_b) ops_->AddBias(y, w.fc2_b, rows_local_, h_);
  ops_->Dropout(y, rows_local_, h_, HiddenDrop(s.mb, w.global_index, 2));
  ops_->AddInPlace(y, a.mid, n_local);
}

std::string GptModel::TimeReport() const {
  if (opt_.recompute_layers == 0 && !opt_.recompute_attention) return {};
  return absl::StrFormat("layers [%d, %d): recomputed %d layer forwards and %d attention softmaxes",
                         first_layer(), last_layer(), recomputed_layers_, recomputed_softmaxes_);
}

void GptModel::LayerBackward(Slot& s, int l) {
  const LayerWeights& w = layers_[l];
  LayerActs& a = s.layers[l];
  if (l < opt_.recompute_layers) {
    ++recomputed_layers_;
    LayerForward(s, l);  // rewrites the shared activations and, identically, hidden[l + 1]
  } else if (opt_.recompute_attention) {
    ++recomputed_softmaxes_;
    // The softmax matrix is shared across layers: rebuild this layer's (its output, already
    // kept in a.attn, lands in scratch).
    ops_->AttentionForward(dattn_, a.probs, a.qkv, opt_.micro_batch, opt_.seq_length, heads_local_,
                           groups_local_, head_dim_, AttnDrop(s.mb, w.global_index));
  }
  const float* x = s.hidden[l];
  const int64_t n_local = rows_local_ * h_;
  const int64_t attn_width = heads_local_ * head_dim_;
  // dhidden_ holds d(y); it becomes d(mid), then d(x): the residual paths pass it through and
  // the norms' backward adds their share.
  ops_->Copy(dtmp_, dhidden_, n_local);
  ops_->Dropout(dtmp_, rows_local_, h_, HiddenDrop(s.mb, w.global_index, 2));
  if (w.d_fc2_b) ops_->BiasBackward(w.d_fc2_b, dtmp_, rows_local_, h_);
  const float* dy = GatherRows(dtmp_, dfull_);
  ops_->LinearBackward(dgelu_, w.d_fc2_w, nullptr, dy, a.gelu, w.fc2_w, rows_full_, ffn_local_, h_,
                       false);
  ActivationBackward(dfc1_, dgelu_, a.fc1);
  ops_->LinearBackward(dfull2_, w.d_fc1_w, w.d_fc1_b, dfc1_, a.ln2_full, w.fc1_w, rows_full_, h_,
                       fc1_width_, false);
  ReduceGradRows(dfull2_, dtmp_);
  NormBackward(dhidden_, w.d_ln2_w, w.d_ln2_b, dtmp_, a.mid, w.ln2_w, a.ln2_mean, a.ln2_rstd,
               rows_local_, h_);

  ops_->Copy(dtmp_, dhidden_, n_local);
  ops_->Dropout(dtmp_, rows_local_, h_, HiddenDrop(s.mb, w.global_index, 1));
  if (w.d_proj_b) ops_->BiasBackward(w.d_proj_b, dtmp_, rows_local_, h_);
  const float* dproj = GatherRows(dtmp_, dfull_);
  ops_->LinearBackward(dattn_, w.d_proj_w, nullptr, dproj, a.attn, w.proj_w, rows_full_, attn_width,
                       h_, false);
  ops_->AttentionBackward(dqkv_, dattn_, a.qkv, a.probs, opt_.micro_batch, opt_.seq_length,
                          heads_local_, groups_local_, head_dim_, AttnDrop(s.mb, w.global_index));
  if (rope_) {
    ops_->Rope(dqkv_, opt_.micro_batch, opt_.seq_length, heads_local_, groups_local_, head_dim_,
               rope_base_, /*inverse=*/true);
  }
  ops_->LinearBackward(dfull2_, w.d_qkv_w, w.d_qkv_b, dqkv_, a.ln1_full, w.qkv_w, rows_full_, h_,
                       qkv_width_, false);
  ReduceGradRows(dfull2_, dtmp_);
  NormBackward(dhidden_, w.d_ln1_w, w.d_ln1_b, dtmp_, x, w.ln1_w, a.ln1_mean, a.ln1_rstd,
               rows_local_, h_);
}

void GptModel::NormForward(float* out, float* mean, float* rstd, const float* in, const float* w,
                           const float* b, int64_t rows, int64_t cols, float eps) {
  if (rms_norm_) {
    ops_->RmsNormForward(out, rstd, in, w, rows, cols, eps);
  } else {
    ops_->LayerNormForward(out, mean, rstd, in, w, b, rows, cols, eps);
  }
}

void GptModel::NormBackward(float* din, float* dw, float* db, const float* dout, const float* in,
                            const float* w, const float* mean, const float* rstd, int64_t rows,
                            int64_t cols) {
  if (rms_norm_) {
    ops_->RmsNormBackward(din, dw, dout, in, w, rstd, rows, cols);
  } else {
    ops_->LayerNormBackward(din, dw, db, dout, in, w, mean, rstd, rows, cols);
  }
}

void GptModel::ActivationForward(float* out, const float* in) {
  if (swiglu_) {
    ops_->SwigluForward(out, in, rows_full_, ffn_local_);
  } else {
    ops_->GeluForward(out, in, rows_full_ * ffn_local_, tanh_gelu_);
  }
}

void GptModel::ActivationBackward(float* din, const float* dout, const float* in) {
  if (swiglu_) {
    ops_->SwigluBackward(din, dout, in, rows_full_, ffn_local_);
  } else {
    ops_->GeluBackward(din, dout, in, rows_full_ * ffn_local_, tanh_gelu_);
  }
}

float GptModel::HeadForward(Slot& s) {
  const float* x = s.hidden[layers_.size()];
  NormForward(s.lnf, s.lnf_mean, s.lnf_rstd, x, stage_.lnf_w, stage_.lnf_b, rows_local_, h_, eps_);
  const float* lnf = GatherRows(s.lnf, s.lnf_full);
  ops_->LinearForward(s.logits, lnf, stage_.out_w, nullptr, rows_full_, h_, vocab_local_);
  ReduceHook max_hook, sum_hook;
  if (tp_size_ > 1) {
    max_hook = [this](float* d, int64_t n) { tp_->AllReduceMax(d, n); };
    sum_hook = [this](float* d, int64_t n) { tp_->AllReduceSum(d, n); };
  }
  ops_->CrossEntropyForward(s.losses, s.ce_stats, s.logits, s.labels, rows_full_, vocab_local_,
                            tp_rank_ * vocab_local_, max_hook, sum_hook);
  ops_->CopyToHost(host_rows_.data(), s.losses, rows_full_ * sizeof(float));
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows_full_; ++r) {
    if (s.mb.labels[r] < 0) continue;
    sum += host_rows_[r];
    ++count;
  }
  s.loss_tokens = count;
  return count > 0 ? static_cast<float>(sum / count) : 0.0f;
}

void GptModel::HeadBackward(Slot& s, float loss_scale) {
  const float per_token = s.loss_tokens > 0 ? loss_scale / s.loss_tokens : 0.0f;
  for (int64_t r = 0; r < rows_full_; ++r) host_rows_[r] = s.mb.labels[r] >= 0 ? per_token : 0.0f;
  ops_->CopyFromHost(dlosses_, host_rows_.data(), rows_full_ * sizeof(float));
  ops_->CrossEntropyBackward(dlogits_, dlosses_, s.ce_stats, s.logits, s.labels, rows_full_,
                             vocab_local_, tp_rank_ * vocab_local_);
  ops_->LinearBackward(dfull_, stage_.d_out_w, nullptr, dlogits_, s.lnf_full, stage_.out_w,
                       rows_full_, h_, vocab_local_, false);
  ReduceGradRows(dfull_, dtmp_);
  ops_->Zero(dhidden_, rows_local_ * h_);
  NormBackward(dhidden_, stage_.d_lnf_w, stage_.d_lnf_b, dtmp_, s.hidden[layers_.size()],
               stage_.lnf_w, s.lnf_mean, s.lnf_rstd, rows_local_, h_);
}

float GptModel::Forward(int slot, const MicroBatch& mb, const float* input) {
  Slot& s = GetSlot(slot);
  s.mb = mb;
  ops_->CopyFromHost(s.tokens, mb.tokens.data(), rows_full_ * sizeof(int32_t));
  ops_->CopyFromHost(s.labels, mb.labels.data(), rows_full_ * sizeof(int32_t));
  if (first_stage_) {
    EmbeddingForward(s);
  } else {
    ops_->Copy(s.hidden[0], input, rows_local_ * h_);
  }
  for (size_t l = 0; l < layers_.size(); ++l) LayerForward(s, static_cast<int>(l));
  return last_stage_ ? HeadForward(s) : 0.0f;
}

const float* GptModel::Output(int slot) const { return slots_[slot]->hidden[layers_.size()]; }

void GptModel::Backward(int slot, const float* doutput, float loss_scale) {
  Slot& s = *slots_[slot];
  if (last_stage_) {
    HeadBackward(s, loss_scale);
  } else {
    ops_->Copy(dhidden_, doutput, rows_local_ * h_);
  }
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) LayerBackward(s, l);
  if (first_stage_) EmbeddingBackward(s);
}

}  // namespace leantron::trainer
