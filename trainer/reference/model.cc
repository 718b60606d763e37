#include "trainer/reference/model.h"

#include "trainer/reference/context_parallel_attention.h"

namespace leantron::trainer {

using reference::AttentionBlock;
using reference::MlpBlock;
using reference::Norm;

ReferenceModel::ReferenceModel(Ops* ops, const ckpt::ModelLayout& layout, Communicator* tp,
                               Communicator* cp, ParamStore* params, int pp_rank, int virtual_chunk,
                               const ModelOptions& options)
    : ops_(ops),
      opt_(options),
      spec_(ModelSpecFromConfig(layout.config(), layout.padded_vocab_size())) {
  const ckpt::ParallelConfig& p = layout.parallel();
  ctx_.ops = ops;
  ctx_.tp = tp;
  ctx_.tp_rank = tp->rank();
  ctx_.tp_size = tp->size();
  ctx_.sequence_parallel = opt_.sequence_parallel;
  ctx_.micro_batch = opt_.micro_batch;
  ctx_.chunks = SequenceChunks{opt_.seq_length, cp->rank(), cp->size()};
  ctx_.cp = cp;
  ctx_.seq_length = ctx_.chunks.local_length();
  ctx_.rows_full = opt_.micro_batch * ctx_.seq_length;
  ctx_.rows_local = opt_.sequence_parallel ? ctx_.rows_full / ctx_.tp_size : ctx_.rows_full;
  first_stage_ = pp_rank == 0 && virtual_chunk == 0;
  last_stage_ = pp_rank == p.pp - 1 && virtual_chunk == p.vpp - 1;
  h_ = spec_.hidden;
  vocab_local_ = spec_.padded_vocab / ctx_.tp_size;
  const int64_t rows_full = ctx_.rows_full, rows_local = ctx_.rows_local;

  auto param = [&](const std::string& n) -> const float* { return params->Param(n); };
  auto grad = [&](const std::string& n) { return params->Grad(n); };
  const auto [first, last] = layout.StageLayers(pp_rank, virtual_chunk);
  first_layer_ = first;
  // Scratch sized for the widest layer of the chunk.
  int64_t qkv_width = 0, attn_width = 0, fc1_width = 0, ffn = 0;
  for (int i = first; i < last; ++i) {
    const LayerShard shard = ShardOf(spec_.layers[i], ctx_.tp_size);
    qkv_width = std::max(qkv_width, shard.qkv_width);
    attn_width = std::max(attn_width, shard.attn_width);
    fc1_width = std::max(fc1_width, shard.fc1_width);
    ffn = std::max(ffn, shard.ffn);
  }
  dhidden_ = A(rows_local * h_);
  dtmp_ = A(rows_local * h_);
  ws_.dfull = A(rows_full * h_);
  ws_.dfull2 = A(rows_full * h_);
  ws_.tmp_full = A(rows_full * h_);
  ws_.dqkv = A(rows_full * qkv_width);
  ws_.dattn = A(rows_full * attn_width);
  ws_.dfc1 = A(rows_full * fc1_width);
  ws_.dact = A(rows_full * ffn);

  {
    const SequenceChunks& c = ctx_.chunks;
    std::vector<int32_t> chunk(c.size * ctx_.seq_length), rows(rows_full);
    for (int r = 0; r < c.size; ++r)
      for (int64_t t = 0; t < ctx_.seq_length; ++t)
        chunk[r * ctx_.seq_length + t] =
            static_cast<int32_t>(ChunkTokenPosition(t, c.seq_length, r, c.size));
    for (int64_t row = 0; row < rows_full; ++row)
      rows[row] = chunk[c.rank * ctx_.seq_length + row % ctx_.seq_length];
    chunk_positions_ = AllocIds(chunk.size());
    row_positions_ = AllocIds(rows.size());
    ops->CopyFromHost(chunk_positions_, chunk.data(), chunk.size() * sizeof(int32_t));
    ops->CopyFromHost(row_positions_, rows.data(), rows.size() * sizeof(int32_t));
    ctx_.chunk_positions = chunk_positions_;
  }

  layers_.reserve(last - first);
  size_t attention_scratch = 0;
  for (int i = first; i < last; ++i) {
    const LayerSpec& ls = spec_.layers[i];
    const LayerShard shard = ShardOf(ls, ctx_.tp_size);
    LayerTensors<float> w;
    BindLayerTensors(&w, i, param, param, grad);
    core_attention_.push_back(cp->size() > 1 ? reference::MakeContextParallelAttention(
                                                   ctx_, ws_, shard, opt_.cp_comm_type)
                                             : reference::MakeLocalAttention(ctx_, ws_, shard));
    attention_scratch = std::max(attention_scratch, core_attention_.back()->scratch_elements());
    layers_.push_back(Layer{w, i - first < opt_.recompute_layers,
                            Norm(ctx_, ls.input_norm, h_, w.ln1_w, w.ln1_b, w.d_ln1_w, w.d_ln1_b),
                            Norm(ctx_, ls.pre_mlp_norm, h_, w.ln2_w, w.ln2_b, w.d_ln2_w, w.d_ln2_b),
                            AttentionBlock(ctx_, ws_, ls, shard, core_attention_.back().get(), w),
                            MlpBlock(ctx_, ws_, ls, shard, w)});
  }
  ws_.attention = A(attention_scratch);
  stage_ = BindStageTensors<float>(*params, first_stage_, last_stage_, param, param, grad);
  if (first_stage_) {
    embedding_ =
        std::make_unique<reference::Embedding>(ctx_, ws_, h_, vocab_local_, stage_.word_emb,
                                               stage_.pos_emb, stage_.d_word_emb, stage_.d_pos_emb);
  }
  if (last_stage_) {
    final_norm_ = std::make_unique<Norm>(ctx_, spec_.final_norm, h_, stage_.lnf_w, stage_.lnf_b,
                                         stage_.d_lnf_w, stage_.d_lnf_b);
    head_ = std::make_unique<reference::OutputHead>(ctx_, ws_, h_, vocab_local_, stage_.out_w,
                                                    stage_.d_out_w, A(rows_full * vocab_local_),
                                                    A(rows_full));
  }
  host_rows_.resize(rows_full);
  recv_input_ = A(rows_local * h_);
  recv_grad_ = A(rows_local * h_);
}

ReferenceModel::~ReferenceModel() {
  embedding_.reset();
  for (float* p : allocations_) ops_->Free(p);
  for (void* p : byte_allocations_) ops_->FreeBytes(p);
}

float* ReferenceModel::A(size_t n) {
  float* p = ops_->Alloc(n);
  allocations_.push_back(p);
  return p;
}

int32_t* ReferenceModel::AllocIds(size_t n) {
  void* p = ops_->AllocBytes(n * sizeof(int32_t));
  byte_allocations_.push_back(p);
  return static_cast<int32_t*>(p);
}

ReferenceModel::Slot& ReferenceModel::GetSlot(int index) {
  if (index < static_cast<int>(slots_.size()) && slots_[index]) return *slots_[index];
  if (index >= static_cast<int>(slots_.size())) slots_.resize(index + 1);
  auto s = std::make_unique<Slot>();
  const int64_t rows_full = ctx_.rows_full, rows_local = ctx_.rows_local;
  s->tokens = AllocIds(rows_full);
  s->labels = AllocIds(rows_full);
  for (size_t l = 0; l <= layers_.size(); ++l) s->hidden.push_back(A(rows_local * h_));
  for (const Layer& layer : layers_) {
    if (layer.recompute) {
      if (!recomputed_acts_) recomputed_acts_ = std::make_unique<LayerActs>(MakeLayerActs());
      s->layers.push_back(*recomputed_acts_);
      continue;
    }
    s->layers.push_back(MakeLayerActs());
  }
  if (last_stage_) {
    s->lnf = A(rows_local * h_);
    s->lnf_stats = {A(rows_local), A(rows_local)};
    s->head.x_full = ctx_.sequence_parallel ? A(rows_full * h_) : s->lnf;
    s->head.logits = A(rows_full * vocab_local_);
    s->head.stats = A(2 * rows_full);
    s->head.losses = A(rows_full);
  }
  slots_[index] = std::move(s);
  return *slots_[index];
}

// Allocated for the chunk's first layer's shapes (every layer of a chunk has the same today).
ReferenceModel::LayerActs ReferenceModel::MakeLayerActs() {
  const bool sp = ctx_.sequence_parallel;
  const int64_t rows_full = ctx_.rows_full, rows_local = ctx_.rows_local;
  const LayerShard shard = ShardOf(spec_.layers[first_layer_], ctx_.tp_size);
  LayerActs a;
  a.ln1 = A(rows_local * h_);
  a.ln1_stats = {A(rows_local), A(rows_local)};
  a.attention.x_full = sp ? A(rows_full * h_) : a.ln1;
  a.attention.qkv = A(rows_full * shard.qkv_width);
  const size_t core = core_attention_.front()->saved_elements();
  if (opt_.recompute_attention) {
    if (shared_core_ == nullptr) shared_core_ = A(core);
    a.attention.core = shared_core_;
  } else {
    a.attention.core = A(core);
  }
  a.attention.attn = A(rows_full * shard.attn_width);
  a.mid = A(rows_local * h_);
  a.ln2 = A(rows_local * h_);
  a.ln2_stats = {A(rows_local), A(rows_local)};
  a.mlp.x_full = sp ? A(rows_full * h_) : a.ln2;
  a.mlp.fc1 = A(rows_full * shard.fc1_width);
  a.mlp.act = A(rows_full * shard.ffn);
  return a;
}

HiddenDropout ReferenceModel::HiddenDrop(const MicroBatch& mb, int layer, int site) const {
  HiddenDropout d;
  d.p = mb.training ? opt_.hidden_dropout : 0.0f;
  d.seed = DropoutSiteSeed(opt_.seed, layer, site);
  d.first_sample = mb.first_sample;
  d.seq_length = opt_.seq_length;
  d.row_offset = ctx_.row_offset();
  d.cp_rank = ctx_.chunks.rank;
  d.cp_size = ctx_.chunks.size;
  return d;
}

AttentionDropout ReferenceModel::AttnDrop(const MicroBatch& mb, int layer) const {
  const LayerShard shard = ShardOf(spec_.layers[layer], ctx_.tp_size);
  AttentionDropout d;
  d.p = mb.training ? opt_.attention_dropout : 0.0f;
  d.seed = DropoutSiteSeed(opt_.seed, layer, 3);
  d.first_sample = mb.first_sample;
  d.head_offset = ctx_.tp_rank * shard.heads;
  d.total_heads = spec_.layers[layer].attention.heads;
  return d;
}

const int32_t* ReferenceModel::Positions(const Slot& s) const {
  return s.mb.positions.empty() ? row_positions_ : s.positions;
}

reference::AttentionInputs ReferenceModel::AttnInputs(const Slot& s, int layer) const {
  reference::AttentionInputs in;
  in.dropout = AttnDrop(s.mb, layer);
  in.positions = Positions(s);
  in.documents = s.mb.documents.empty() ? nullptr : s.documents;
  return in;
}

void ReferenceModel::LayerForward(Slot& s, int l) {
  const Layer& layer = layers_[l];
  const int g = layer.w.global_index;
  LayerActs& a = s.layers[l];
  const float* x = s.hidden[l];
  float* y = s.hidden[l + 1];
  const int64_t n_local = ctx_.rows_local * h_;
  layer.input_norm.Forward(a.ln1, a.ln1_stats, x);
  layer.attention.Forward(a.mid, a.ln1, a.attention, AttnInputs(s, g));
  ops_->Dropout(a.mid, ctx_.rows_local, h_, HiddenDrop(s.mb, g, 1));
  ops_->AddInPlace(a.mid, x, n_local);
  layer.pre_mlp_norm.Forward(a.ln2, a.ln2_stats, a.mid);
  layer.mlp.Forward(y, a.ln2, a.mlp);
  ops_->Dropout(y, ctx_.rows_local, h_, HiddenDrop(s.mb, g, 2));
  ops_->AddInPlace(y, a.mid, n_local);
}

void ReferenceModel::LayerBackward(Slot& s, int l) {
  const Layer& layer = layers_[l];
  const int g = layer.w.global_index;
  LayerActs& a = s.layers[l];
  if (layer.recompute) {
    LayerForward(s, l);  // rewrites the shared activations and, identically, hidden[l + 1]
    ++recomputed_layers_;
  } else if (opt_.recompute_attention) {
    layer.attention.RecomputeCore(a.attention, AttnInputs(s, g));
    ++recomputed_softmaxes_;
  }
  const int64_t n_local = ctx_.rows_local * h_;
  // dhidden_ holds d(y); it becomes d(mid), then d(x): the residual paths pass it through and
  // the norms' backward adds their share.
  ops_->Copy(dtmp_, dhidden_, n_local);
  ops_->Dropout(dtmp_, ctx_.rows_local, h_, HiddenDrop(s.mb, g, 2));
  layer.mlp.Backward(dtmp_, dtmp_, a.mlp);
  layer.pre_mlp_norm.Backward(dhidden_, dtmp_, a.ln2_stats, a.mid);
  ops_->Copy(dtmp_, dhidden_, n_local);
  ops_->Dropout(dtmp_, ctx_.rows_local, h_, HiddenDrop(s.mb, g, 1));
  layer.attention.Backward(dtmp_, dtmp_, a.attention, AttnInputs(s, g));
  layer.input_norm.Backward(dhidden_, dtmp_, a.ln1_stats, s.hidden[l]);
}

float ReferenceModel::HeadForward(Slot& s) {
  final_norm_->Forward(s.lnf, s.lnf_stats, s.hidden[layers_.size()]);
  head_->Forward(s.lnf, s.labels, s.head);
  const int64_t rows = ctx_.rows_full;
  ops_->CopyToHost(host_rows_.data(), s.head.losses, rows * sizeof(float));
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (s.mb.labels[r] < 0) continue;
    sum += host_rows_[r];
    ++count;
  }
  if (ctx_.chunks.size > 1) {
    // The mean over every token of the micro-batch's samples, whichever CP rank holds it.
    double totals[2] = {sum, static_cast<double>(count)};
    ctx_.cp->AllReduceSumDouble(totals, 2);
    sum = totals[0];
    count = static_cast<int64_t>(totals[1]);
  }
  s.loss_tokens = count;
  return count > 0 ? static_cast<float>(sum / count) : 0.0f;
}

void ReferenceModel::HeadBackward(Slot& s, float loss_scale) {
  const float per_token = s.loss_tokens > 0 ? loss_scale / s.loss_tokens : 0.0f;
  for (int64_t r = 0; r < ctx_.rows_full; ++r)
    host_rows_[r] = s.mb.labels[r] >= 0 ? per_token : 0.0f;
  head_->Backward(dtmp_, host_rows_, s.labels, s.head);
  ops_->Zero(dhidden_, ctx_.rows_local * h_);
  final_norm_->Backward(dhidden_, dtmp_, s.lnf_stats, s.hidden[layers_.size()]);
}

float ReferenceModel::Forward(int slot, const MicroBatch& mb, const float* input) {
  Slot& s = GetSlot(slot);
  s.mb = mb;
  ops_->CopyFromHost(s.tokens, mb.tokens.data(), ctx_.rows_full * sizeof(int32_t));
  ops_->CopyFromHost(s.labels, mb.labels.data(), ctx_.rows_full * sizeof(int32_t));
  if (!mb.positions.empty()) {
    if (s.positions == nullptr) s.positions = AllocIds(ctx_.rows_full);
    ops_->CopyFromHost(s.positions, mb.positions.data(), ctx_.rows_full * sizeof(int32_t));
  }
  if (!mb.documents.empty()) {
    const size_t n = opt_.micro_batch * opt_.seq_length;
    if (s.documents == nullptr) s.documents = AllocIds(n);
    ops_->CopyFromHost(s.documents, mb.documents.data(), n * sizeof(int32_t));
  }
  Notify([](ModelEvents& e) { e.WeightsNeeded(-1); });
  if (first_stage_) {
    embedding_->Forward(s.hidden[0], s.tokens, Positions(s), HiddenDrop(s.mb, -1, 0));
  } else {
    ops_->Copy(s.hidden[0], input, ctx_.rows_local * h_);
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    Notify([&](ModelEvents& e) { e.WeightsNeeded(static_cast<int>(l)); });
    LayerForward(s, static_cast<int>(l));
    Notify([&](ModelEvents& e) { e.LayerForwardDone(static_cast<int>(l)); });
  }
  if (!last_stage_) return 0.0f;
  Notify([](ModelEvents& e) { e.HeadWeightsNeeded(); });
  return HeadForward(s);
}

const float* ReferenceModel::Output(int slot) const { return slots_[slot]->hidden[layers_.size()]; }

void ReferenceModel::Backward(int slot, const float* doutput, float loss_scale) {
  Slot& s = *slots_[slot];
  Notify([](ModelEvents& e) { e.BackwardBegins(); });
  if (last_stage_) {
    HeadBackward(s, loss_scale);
  } else {
    ops_->Copy(dhidden_, doutput, ctx_.rows_local * h_);
  }
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    Notify([&](ModelEvents& e) { e.LayerBackwardBegins(l); });
    LayerBackward(s, l);
    Notify([&](ModelEvents& e) { e.LayerBackwardDone(l); });
  }
  if (first_stage_) {
    embedding_->Backward(dhidden_, s.tokens, Positions(s), HiddenDrop(s.mb, -1, 0));
  }
  Notify([](ModelEvents& e) { e.BackwardDone(); });
}

}  // namespace leantron::trainer
