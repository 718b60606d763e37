#include "trainer/cuda/nn/gpt_cuda.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "trainer/cuda/nn/flash_attention.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/nn/gpt_cuda_model.h"
#include "trainer/cuda/parallel/grad_reduce.h"
#include "trainer/cuda/kernels/kernels.h"
#include "trainer/cuda/matmul.h"
#include "trainer/cuda/op_profile.h"
#include "trainer/cuda/parallel/peer_exchange.h"

namespace leantron::trainer::cuda {
namespace detail {

BF16GptModel::BF16GptModel(const ckpt::ModelLayout& layout, ParamStore* params,
                           const BF16Options& options, std::unique_ptr<FlashAttention> attention)
    : layout_(layout), params_(params), opt_(options), attention_(std::move(attention)) {
  const ckpt::ModelConfig& c = layout.config();
  const ckpt::ParallelConfig& p = layout.parallel();
  tp_ = AsNccl(opt_.tp);
  if (tp_ != nullptr && tp_->size() > 1) {
    tp_size_ = tp_->size();
    tp_rank_ = tp_->rank();
  } else {
    tp_ = nullptr;
  }
  sp_ = opt_.model.sequence_parallel && tp_size_ > 1;
  if (tp_ != nullptr) {
    int least = 0, greatest = 0;
    LT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    LT_CUDA_CHECK(cudaStreamCreateWithPriority(&tp_stream_, cudaStreamNonBlocking, greatest));
    LT_CUDA_CHECK(cudaEventCreateWithFlags(&tp_main_ready_, cudaEventDisableTiming));
    LT_CUDA_CHECK(cudaEventCreateWithFlags(&tp_done_, cudaEventDisableTiming));
    ring_events_.resize(tp_size_);
    for (cudaEvent_t& e : ring_events_)
      LT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (const char* v = std::getenv("LEANTRON_TP_OVERLAP")) tp_overlap_ = v[0] != '0';
    if (const char* v = std::getenv("LEANTRON_TP_SM_MARGIN"); v != nullptr && std::atoi(v) > 0) {
      int device = 0, sms = 0;
      LT_CUDA_CHECK(cudaGetDevice(&device));
      LT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      overlap_sms_ = std::max(1, sms - std::atoi(v));
    }
  }
  first_stage_ = opt_.pp_rank == 0 && opt_.virtual_chunk == 0;
  last_stage_ = opt_.pp_rank == p.pp - 1 && opt_.virtual_chunk == p.vpp - 1;
  b_ = opt_.model.micro_batch;
  t_ = opt_.model.seq_length;
  n_ = b_ * t_;
  rows_l_ = sp_ ? n_ / tp_size_ : n_;
  row_offset_ = sp_ ? tp_rank_ * rows_l_ : 0;
  h_ = c.hidden_size;
  heads_l_ = c.num_attention_heads / tp_size_;
  head_dim_ = c.kv_channels;
  ffn_l_ = c.ffn_hidden_size / tp_size_;
  vocab_l_ = layout.padded_vocab_size() / tp_size_;
  vocab_begin_ = tp_rank_ * vocab_l_;
  if (const char* ce = std::getenv("LEANTRON_TP_COPY_ENGINE");
      sp_ && tp_overlap_ && (ce == nullptr || ce[0] != '0')) {
    exchange_ = PeerExchange::Create(tp_, static_cast<size_t>(rows_l_ * h_) * sizeof(bf16));
  }
  eps_ = static_cast<float>(c.norm_epsilon);
  tanh_gelu_ = c.activation == ckpt::Activation::kGeluTanh;
  chunk_rows_ = opt_.logits_chunk_rows > 0
                    ? std::min<int64_t>(n_, opt_.logits_chunk_rows)
                    // up to 2 GiB of bf16 logits at a time
                    : std::clamp<int64_t>((int64_t{1} << 30) / vocab_l_, 1, n_);

  if (params_->bf16_copy() == nullptr) {
    w16_ = Alloc<bf16>(params_->size());
    params_->set_bf16_copy(reinterpret_cast<uint16_t*>(w16_));
    owns_w16_ = true;
  } else {
    w16_ = reinterpret_cast<bf16*>(params_->bf16_copy());
  }
  auto w16 = [&](const std::string& name) -> const bf16* {
    const float* q = params_->Param(name);
    return q ? w16_ + (q - params_->data()) : nullptr;
  };
  auto f32 = [&](const std::string& name) -> const float* { return params_->Param(name); };
  auto grad = [&](const std::string& name) { return params_->Grad(name); };
  const auto [first, last] = layout.StageLayers(opt_.pp_rank, opt_.virtual_chunk);
  first_layer_ = first;
  const int recompute = std::min(opt_.model.recompute_layers, last - first);
  for (int i = first; i < last; ++i) {
    Weights w{};
    w.global_index = i;
    w.recompute = i - first < recompute;
    BindLayerTensors(&w, i, w16, f32, grad);
    layers_.push_back(w);
  }
  stage_ = BindStageTensors<bf16>(*params_, first_stage_, last_stage_, w16, f32, grad);

  positions_ = Alloc<int32_t>(rows_l_);
  std::vector<int32_t> positions(rows_l_);
  for (int64_t r = 0; r < rows_l_; ++r) positions[r] = static_cast<int32_t>((row_offset_ + r) % t_);
  LT_CUDA_CHECK(cudaMemcpyAsync(positions_, positions.data(), rows_l_ * sizeof(int32_t),
                                cudaMemcpyHostToDevice, MainStream()));
  branch_ = Alloc<bf16>(n_ * h_);
  if (sp_ && tp_size_ == 2) {  // partial sums exchanged with the peer (RowParallelForward)
    branch_l_ = LocalRows(branch_);
    branch_peer_ = Alloc<bf16>(rows_l_ * h_);
  } else {
    branch_l_ = sp_ ? Alloc<bf16>(rows_l_ * h_) : branch_;
  }
  junk_ = Alloc<bf16>(rows_l_ * h_);
  if (last_stage_) {
    lnf_full_ = sp_ ? Alloc<bf16>(n_ * h_) : nullptr;
    dlnf_full_ = Alloc<bf16>(n_ * h_);
    logits_ = Alloc<bf16>(chunk_rows_ * vocab_l_);
    ce_part_ = Alloc<float>(3 * chunk_rows_);
    ce_max_ = Alloc<float>(chunk_rows_);
    ce_sums_ = Alloc<float>(2 * chunk_rows_);
  }
  if (last_stage_) {
    loss_sum_ = Alloc<double>(1);
    LT_CUDA_CHECK(cudaMallocHost(&host_loss_sum_, sizeof(double)));
  }
  dx_ = Alloc<bf16>(rows_l_ * h_);
  // Under SP this rank's rows of the branch gradient sit in place inside the gathered buffer.
  dbranch_full_ = Alloc<bf16>(sp_ ? n_ * h_ : rows_l_ * h_);
  dbranch_ = LocalRows(dbranch_full_);
  dln_ = Alloc<bf16>(n_ * h_);
  dqkv_ = Alloc<bf16>(n_ * 3 * heads_l_ * head_dim_);
  datt_ = Alloc<bf16>(n_ * heads_l_ * head_dim_);
  dfc_ = Alloc<bf16>(n_ * ffn_l_);
  recv_input_ = Alloc<bf16>(rows_l_ * h_);
  recv_grad_ = Alloc<bf16>(rows_l_ * h_);
  const int64_t widest = std::max<int64_t>(3 * heads_l_ * head_dim_, std::max(ffn_l_, h_));
  scratch_bytes_ =
      std::max({LayerNormBackwardScratchBytes(rows_l_, h_), ColumnSumScratchBytes(n_, widest),
                EmbeddingBackwardScratchBytes(n_, h_), size_t{1} << 20});
  scratch_ = Alloc<char>(scratch_bytes_);
  bias_grad_ = Alloc<float>(widest);
  attn_workspace_ = Alloc<char>(attention_->workspace_bytes());

  NcclCommunicator* dp = AsNccl(opt_.dp);
  if (dp != nullptr && dp->size() > 1) {
    GradReducer::Options ro;
    ro.overlap_grad_reduce = opt_.overlap_grad_reduce;
    ro.distributed = opt_.distributed_optimizer;
    ro.overlap_param_gather = opt_.overlap_param_gather;
    ro.reduce_in_bf16 = opt_.grad_reduce_in_bf16;
    reducer_ = std::make_unique<GradReducer>(dp, params_->grad(), params_->data(), w16_,
                                             opt_.dp_buckets, ro);
  }
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
}

BF16GptModel::~BF16GptModel() {
  cudaStreamSynchronize(MainStream());
  reducer_.reset();
  if (owns_w16_) params_->set_bf16_copy(nullptr);
  for (void* q : allocations_) cudaFree(q);
  for (const auto& s : slots_) {
    if (!s) continue;
    cudaFreeHost(s->host_ids);
    cudaEventDestroy(s->ids_copied);
  }
  cudaFreeHost(host_loss_sum_);
  for (cudaEvent_t e : ring_events_) cudaEventDestroy(e);
  if (tp_stream_ != nullptr) {
    cudaEventDestroy(tp_main_ready_);
    cudaEventDestroy(tp_done_);
    cudaStreamDestroy(tp_stream_);
  }
}

BF16GptModel::Acts BF16GptModel::MakeActs() {
  Acts a;
  a.ln1 = Alloc<bf16>(n_ * h_);
  a.qkv = Alloc<bf16>(n_ * 3 * heads_l_ * head_dim_);
  a.att = Alloc<bf16>(n_ * heads_l_ * head_dim_);
  a.mid = Alloc<bf16>(rows_l_ * h_);
  a.ln2 = Alloc<bf16>(n_ * h_);
  a.pre = Alloc<bf16>(n_ * ffn_l_);
  // With GELU recomputation every layer shares one GELU buffer, rebuilt in the backward.
  if (opt_.recompute_gelu) {
    if (shared_gelu_ == nullptr) shared_gelu_ = Alloc<bf16>(n_ * ffn_l_);
    a.gelu = shared_gelu_;
  } else {
    a.gelu = Alloc<bf16>(n_ * ffn_l_);
  }
  a.ln1_mean = Alloc<float>(rows_l_);
  a.ln1_rstd = Alloc<float>(rows_l_);
  a.ln2_mean = Alloc<float>(rows_l_);
  a.ln2_rstd = Alloc<float>(rows_l_);
  a.stats = Alloc<float>(b_ * heads_l_ * t_);
  return a;
}

// Slots are allocated on first use; the schedule uses at most min(micro-batches, warm-up + 1).
BF16GptModel::Slot& BF16GptModel::GetSlot(int index) {
  if (index < static_cast<int>(slots_.size()) && slots_[index]) return *slots_[index];
  if (index >= static_cast<int>(slots_.size())) slots_.resize(index + 1);
  auto s = std::make_unique<Slot>();
  s->tokens = Alloc<int32_t>(n_);
  s->labels = Alloc<int32_t>(n_);
  LT_CUDA_CHECK(cudaMallocHost(&s->host_ids, 2 * n_ * sizeof(int32_t)));
  LT_CUDA_CHECK(cudaEventCreateWithFlags(&s->ids_copied, cudaEventDisableTiming));
  for (size_t l = 0; l <= layers_.size(); ++l) s->x.push_back(Alloc<bf16>(rows_l_ * h_));
  for (const Weights& w : layers_) {
    if (w.recompute) {
      if (!shared_acts_) shared_acts_ = std::make_unique<Acts>(MakeActs());
      s->acts.push_back(*shared_acts_);
    } else {
      s->acts.push_back(MakeActs());
    }
  }
  if (last_stage_) {
    s->lnf = sp_ ? Alloc<bf16>(rows_l_ * h_) : Alloc<bf16>(n_ * h_);
    s->dlnf = Alloc<bf16>(rows_l_ * h_);
    s->lnf_mean = Alloc<float>(rows_l_);
    s->lnf_rstd = Alloc<float>(rows_l_);
    s->losses = Alloc<float>(n_);
  }
  slots_[index] = std::move(s);
  return *slots_[index];
}

HiddenDropout BF16GptModel::Drop(const Slot& s, int global_layer, int site) const {
  HiddenDropout d;
  d.p = s.mb.training ? opt_.model.hidden_dropout : 0.0f;
  d.seed = DropoutSiteSeed(opt_.model.seed, global_layer, site);
  d.first_sample = s.mb.first_sample;
  d.seq_length = t_;
  d.row_offset = row_offset_;
  return d;
}

void BF16GptModel::NormGather(bf16* out_full, float* mean, float* rstd, const bf16* residual,
                              const bf16* branch, bf16* x_out, const float* w, const float* b,
                              const HiddenDropout& d, bool gather, const bf16* branch2) {
  prof_.Begin("residual+layernorm fwd");
  AddLayerNormForward<bf16>(x_out, LocalRows(out_full), mean, rstd, residual, branch, w, b, rows_l_,
                            h_, eps_, d, MainStream(), branch2);
  if (gather) GatherRows(out_full);
  prof_.End();
}

void BF16GptModel::BeginStep() {
  prof_.Step();
  if (reducer_ != nullptr && backwards_this_step_ > 0) {
    double comm = 0, exposed = 0;
    reducer_->LastStep(&comm, &exposed);
    if (comm > 0) {
      comm_ms_ += comm;
      exposed_ms_ += exposed;
      ++measured_steps_;
    }
  }
  backwards_this_step_ = 0;
  // The bf16 copy: converted anew after a rewrite of the fp32 weights (the first chunk does it for
  // all); after optimizer steps AdamW has written it for what this rank stepped, and with the
  // distributed optimizer the other ranks' parts are gathered (each chunk its buckets).
  if (params_->weights_version() != w16_version_) {
    if (params_->weights_rewritten() > w16_version_) {
      if (owns_w16_) ConvertFromFloat<bf16>(w16_, params_->data(), params_->size(), MainStream());
    } else if (reducer_ != nullptr) {
      reducer_->GatherParams();
    }
    w16_version_ = params_->weights_version();
  }
  if (loss_sum_ != nullptr)
    LT_CUDA_CHECK(cudaMemsetAsync(loss_sum_, 0, sizeof(double), MainStream()));
  loss_pending_ = false;
}

double BF16GptModel::TakeDeferredLoss() {
  if (!loss_pending_) return 0.0;
  loss_pending_ = false;
  LT_CUDA_CHECK(cudaMemcpyAsync(host_loss_sum_, loss_sum_, sizeof(double), cudaMemcpyDeviceToHost,
                                MainStream()));
  LT_CUDA_CHECK(cudaStreamSynchronize(MainStream()));
  return *host_loss_sum_;
}

void BF16GptModel::LayerForward(Slot& s, int l) {
  const Weights& w = layers_[l];
  Acts& a = s.acts[l];
  const int64_t qkv_w = 3 * heads_l_ * head_dim_, att_w = heads_l_ * head_dim_;
  GatherRun(a.ln1, "matmul fwd qkv", [&](int64_t r0, int64_t rows) {
    mm_.Forward(a.qkv + r0 * qkv_w, a.ln1 + r0 * h_, w.qkv_w, w.qkv_b, rows, h_, qkv_w);
  });
  prof_.Begin("attention fwd");
  attention_->Forward(a.att, a.stats, a.qkv, attn_workspace_);
  const bf16* attn_addend = RowParallelForward("matmul fwd proj", [&](int64_t r0, int64_t rows) {
    mm_.Forward(branch_ + r0 * h_, a.att + r0 * att_w, w.proj_w, RowParallelBias(w.proj_b), rows,
                att_w, h_);
  });
  NormGather(a.ln2, a.ln2_mean, a.ln2_rstd, s.x[l], branch_l_, a.mid, w.ln2_w, w.ln2_b,
             Drop(s, w.global_index, 1), /*gather=*/false, attn_addend);
  GatherRun(a.ln2, "matmul fwd fc1", [&](int64_t r0, int64_t rows) {
    if (tanh_gelu_) {  // GELU in the matmul's epilogue
      mm_.ForwardGelu(a.gelu + r0 * ffn_l_, a.pre + r0 * ffn_l_, a.ln2 + r0 * h_, w.fc1_w, w.fc1_b,
                      rows, h_, ffn_l_);
    } else {
      mm_.Forward(a.pre + r0 * ffn_l_, a.ln2 + r0 * h_, w.fc1_w, w.fc1_b, rows, h_, ffn_l_);
    }
  });
  if (!tanh_gelu_) {
    prof_.Begin("gelu");
    GeluForward<bf16>(a.gelu, a.pre, n_ * ffn_l_, false, MainStream());
  }
  mlp_addend_ = RowParallelForward("matmul fwd fc2", [&](int64_t r0, int64_t rows) {
    mm_.Forward(branch_ + r0 * h_, a.gelu + r0 * ffn_l_, w.fc2_w, RowParallelBias(w.fc2_b), rows,
                ffn_l_, h_);
  });
  prof_.End();
}

void BF16GptModel::ResidualNorm(Slot& s, int l, bf16* out, float* mean, float* rstd, const float* w,
                                const float* b, bool gather) {
  NormGather(out, mean, rstd, s.acts[l].mid, branch_l_, s.x[l + 1], w, b,
             Drop(s, layers_[l].global_index, 2), gather, mlp_addend_);
}

float BF16GptModel::Forward(int slot, const MicroBatch& mb, const float* input) {
  Slot& s = GetSlot(slot);
  s.mb = mb;
  int64_t valid = 0;
  for (int32_t label : mb.labels) valid += label >= 0;
  s.has_grad = mb.training && valid > 0;
  s.grad_scale = s.has_grad ? opt_.loss_scale / static_cast<float>(valid) : 0.0f;
  LT_CUDA_CHECK(cudaEventSynchronize(s.ids_copied));  // the slot's previous copy has run
  std::memcpy(s.host_ids, mb.tokens.data(), n_ * sizeof(int32_t));
  std::memcpy(s.host_ids + n_, mb.labels.data(), n_ * sizeof(int32_t));
  LT_CUDA_CHECK(cudaMemcpyAsync(s.tokens, s.host_ids, n_ * sizeof(int32_t), cudaMemcpyHostToDevice,
                                MainStream()));
  LT_CUDA_CHECK(cudaMemcpyAsync(s.labels, s.host_ids + n_, n_ * sizeof(int32_t),
                                cudaMemcpyHostToDevice, MainStream()));
  LT_CUDA_CHECK(cudaEventRecord(s.ids_copied, MainStream()));
  // Weights still being gathered from the other DP ranks: each waited for just before its use.
  auto wait_params = [&](int layer) {
    if (reducer_ != nullptr) reducer_->WaitParams(layer);
  };
  wait_params(-1);
  if (first_stage_) {
    prof_.Begin("embedding fwd");
    // Vocabulary-parallel lookup: each rank fills the rows whose ids it owns, the rest zero.
    EmbeddingForward<bf16>(branch_, s.tokens, stage_.word_emb, n_, h_, vocab_begin_,
                           vocab_begin_ + vocab_l_, MainStream());
    ReduceRows(branch_, s.x[0]);
    prof_.Begin("embedding fwd");
    PositionForward<bf16>(s.x[0], positions_, stage_.pos_emb, rows_l_, h_, MainStream());
    Dropout<bf16>(s.x[0], rows_l_, h_, Drop(s, -1, 0), MainStream());
  } else {
    LT_CUDA_CHECK(cudaMemcpyAsync(s.x[0], input, rows_l_ * h_ * sizeof(bf16),
                                  cudaMemcpyDeviceToDevice, MainStream()));
  }
  const int num_layers = static_cast<int>(layers_.size());
  if (num_layers > 0) {
    const Weights& w = layers_[0];
    wait_params(0);
    NormGather(s.acts[0].ln1, s.acts[0].ln1_mean, s.acts[0].ln1_rstd, nullptr, s.x[0], nullptr,
               w.ln1_w, w.ln1_b, Drop(s, -1, 0), /*gather=*/false);
  }
  for (int l = 0; l < num_layers; ++l) {
    LayerForward(s, l);
    if (l + 1 < num_layers) {
      const Weights& next = layers_[l + 1];
      wait_params(l + 1);
      ResidualNorm(s, l, s.acts[l + 1].ln1, s.acts[l + 1].ln1_mean, s.acts[l + 1].ln1_rstd,
                   next.ln1_w, next.ln1_b, /*gather=*/false);
    } else if (last_stage_) {
      ResidualNorm(s, l, sp_ ? lnf_full_ : s.lnf, s.lnf_mean, s.lnf_rstd, stage_.lnf_w,
                   stage_.lnf_b,
                   /*gather=*/true);
    } else {  // the stage's output x[L]; the LayerNorm output is not needed
      prof_.Begin("residual+layernorm fwd");
      AddLayerNormForward<bf16>(s.x[l + 1], junk_, nullptr, nullptr, s.acts[l].mid, branch_l_,
                                layers_[l].ln1_w, layers_[l].ln1_b, rows_l_, h_, eps_,
                                Drop(s, layers_[l].global_index, 2), MainStream(), mlp_addend_);
      prof_.End();
    }
  }
  if (!last_stage_) return 0.0f;
  if (num_layers == 0) {
    NormGather(sp_ ? lnf_full_ : s.lnf, s.lnf_mean, s.lnf_rstd, nullptr, s.x[0], nullptr,
               stage_.lnf_w, stage_.lnf_b, Drop(s, -1, 0), /*gather=*/true);
  }
  HeadForward(s);
  return 0.0f;
}

// Logits a chunk of rows at a time: loss, and when training the gradient back to the final
// LayerNorm's output and into the output weight, scaled by loss_scale / tokens. Under TP each
// rank holds a vocabulary shard and the softmax statistics are combined across ranks.
void BF16GptModel::HeadForward(Slot& s) {
  const bf16* lnf = sp_ ? lnf_full_ : s.lnf;  // all rows
  bf16* dlnf = sp_ ? dlnf_full_ : s.dlnf;     // all rows (partial sums under TP)
  for (int64_t r0 = 0; r0 < n_; r0 += chunk_rows_) {
    const int64_t rows = std::min(chunk_rows_, n_ - r0);
    prof_.Begin("matmul head fwd");
    mm_.Forward(logits_, lnf + r0 * h_, stage_.out_w, nullptr, rows, h_, vocab_l_);
    prof_.Begin("cross-entropy");
    if (tp_ == nullptr) {
      CrossEntropyForwardBackward<bf16>(s.losses + r0, logits_, s.labels + r0, rows, vocab_l_,
                                        s.grad_scale, MainStream());
    } else {
      CrossEntropyShardPartials<bf16>(ce_part_, logits_, s.labels + r0, rows, vocab_l_,
                                      vocab_begin_, MainStream());
      CrossEntropyShardMax(ce_max_, ce_part_, rows, MainStream());
      TpAllReduce(ce_max_, rows, ReduceOp::kMax);
      prof_.Begin("cross-entropy");
      CrossEntropyShardRescale(ce_sums_, ce_part_, ce_max_, rows, MainStream());
      TpAllReduce(ce_sums_, 2 * rows, ReduceOp::kSum);
      prof_.Begin("cross-entropy");
      CrossEntropyShardFinish<bf16>(s.losses + r0, logits_, s.labels + r0, ce_max_, ce_sums_, rows,
                                    vocab_l_, vocab_begin_, s.grad_scale, MainStream());
    }
    if (s.has_grad) {
      prof_.Begin("matmul head bwd");
      mm_.BackwardData(dlnf + r0 * h_, logits_, stage_.out_w, rows, h_, vocab_l_);
      mm_.BackwardWeight(stage_.d_out_w, logits_, lnf + r0 * h_, rows, h_, vocab_l_);
    }
  }
  if (s.has_grad) ReduceRows(dlnf, s.dlnf);
  prof_.End();
  AccumulateMeanLoss(loss_sum_, s.losses, s.labels, n_, MainStream());
  loss_pending_ = true;
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

void BF16GptModel::NormBackward(float* dw, float* db, const bf16* dout, const bf16* dresidual,
                                const bf16* x, const float* w, const float* mean, const float* rstd,
                                const HiddenDropout& drop) {
  const bool same = !sp_ && drop.p <= 0.0f;
  LayerNormBackward<bf16>(dx_, same ? nullptr : dbranch_, dw, db, dout, dresidual, x, w, mean, rstd,
                          rows_l_, h_, drop, scratch(), MainStream());
  branch_grad_ = same ? dx_ : dbranch_full_;
}

void BF16GptModel::LayerBackward(Slot& s, int l) {
  const Weights& w = layers_[l];
  Acts& a = s.acts[l];
  const int64_t qkv_w = 3 * heads_l_ * head_dim_, att_w = heads_l_ * head_dim_;
  if (w.recompute) {
    prof_.Begin("recompute");
    NormGather(a.ln1, a.ln1_mean, a.ln1_rstd, nullptr, s.x[l], nullptr, w.ln1_w, w.ln1_b,
               Drop(s, w.global_index - 1, 2), /*gather=*/false);
    LayerForward(s, l);  // ends with the MLP output in branch_, which the backward does not need
  } else if (opt_.recompute_gelu) {
    prof_.Begin("gelu");
    GeluForward<bf16>(a.gelu, a.pre, n_ * ffn_l_, tanh_gelu_, MainStream());
  }
  // On entry dx_ = d(x[l+1]) and branch_grad_ = d(MLP output), dropout applied (under SP its
  // local rows are dbranch_).
  // A row-parallel linear's gradients: under SP the bias's from this rank's rows (summed over TP
  // by the optimizer), the weight's and the input's block by block as the ring gathers the
  // output gradient's rows (`dgrad(first_row, rows)`); otherwise from all rows.
  auto row_parallel_backward = [&](const char* op, float* dw, float* db, const bf16* in, int64_t k,
                                   const std::function<void(int64_t, int64_t)>& dgrad) {
    prof_.Begin(op);
    if (!sp_) {
      WeightGrad(dw, db, branch_grad_, in, k, h_);
      dgrad(0, n_);
      return;
    }
    if (db != nullptr)
      ColumnSumAccumulate<bf16>(db, dbranch_, rows_l_, h_, scratch(), MainStream());
    GatherRun(dbranch_full_, op, [&](int64_t r0, int64_t rows) {
      mm_.BackwardWeight(dw, dbranch_full_ + r0 * h_, in + r0 * k, rows, k, h_);
      dgrad(r0, rows);
    });
  };
  row_parallel_backward(
      "matmul bwd fc2", w.d_fc2_w, w.d_fc2_b, a.gelu, ffn_l_, [&](int64_t r0, int64_t rows) {
        if (tanh_gelu_) {  // GELU's derivative in the matmul's epilogue
          mm_.BackwardDataGelu(dfc_ + r0 * ffn_l_, branch_grad_ + r0 * h_, w.fc2_w,
                               a.pre + r0 * ffn_l_, rows, ffn_l_, h_);
        } else {
          mm_.BackwardData(dfc_ + r0 * ffn_l_, branch_grad_ + r0 * h_, w.fc2_w, rows, ffn_l_, h_);
        }
      });
  if (!tanh_gelu_) {
    prof_.Begin("gelu");
    GeluBackward<bf16>(dfc_, dfc_, a.pre, n_ * ffn_l_, false, MainStream());
  }
  // A column-parallel linear: the input gradient's TP reduction runs while the weight gradient
  // is computed.
  ColumnParallelBackward("matmul bwd fc1", dfc_, w.fc1_w, ffn_l_,
                         [&] { WeightGrad(w.d_fc1_w, w.d_fc1_b, dfc_, a.ln2, h_, ffn_l_); });
  prof_.Begin("layernorm bwd");
  NormBackward(w.d_ln2_w, w.d_ln2_b, LocalRows(dln_), dx_, a.mid, w.ln2_w, a.ln2_mean, a.ln2_rstd,
               Drop(s, w.global_index, 1));
  row_parallel_backward(
      "matmul bwd proj", w.d_proj_w, w.d_proj_b, a.att, att_w, [&](int64_t r0, int64_t rows) {
        mm_.BackwardData(datt_ + r0 * att_w, branch_grad_ + r0 * h_, w.proj_w, rows, att_w, h_);
      });
  prof_.Begin("attention bwd");
  attention_->Backward(dqkv_, datt_, a.qkv, a.att, a.stats, attn_workspace_);
  ColumnParallelBackward("matmul bwd qkv", dqkv_, w.qkv_w, qkv_w,
                         [&] { WeightGrad(w.d_qkv_w, w.d_qkv_b, dqkv_, a.ln1, h_, qkv_w); });
  // d(x[l]) = residual + LayerNorm's share; the part into the previous layer's MLP output (or
  // the embedding) goes through that site's dropout mask.
  prof_.Begin("layernorm bwd");
  NormBackward(w.d_ln1_w, w.d_ln1_b, LocalRows(dln_), dx_, s.x[l], w.ln1_w, a.ln1_mean, a.ln1_rstd,
               w.global_index > 0 ? Drop(s, w.global_index - 1, 2) : Drop(s, -1, 0));
  prof_.End();
}

std::string BF16GptModel::TimeReport() const {
  if (reducer_ == nullptr || measured_steps_ == 0) return {};
  const int start = reducer_->start_layer();
  const std::string held =
      start < 0 ? ""
                : absl::StrFormat(", started once layer %d was done (%.0f ms of the backward left)",
                                  layers_[start].global_index, reducer_->start_left_ms());
  return absl::StrFormat(
      "data-parallel gradient %s%s %s: %.1f ms per step from the first bucket to the last, %.1f "
      "ms of it exposed (the backward had finished)%s; by %s",
      opt_.distributed_optimizer ? "reduce-scatter" : "all-reduce",
      opt_.grad_reduce_in_bf16 ? " in bf16" : "",
      opt_.overlap_grad_reduce ? "overlapped with the backward" : "after the backward",
      comm_ms_ / measured_steps_, exposed_ms_ / measured_steps_, held, reducer_->transport());
}

void BF16GptModel::Backward(int slot, const float* doutput, float loss_scale) {
  Slot& s = *slots_[slot];
  ++backwards_this_step_;
  if (reducer_ != nullptr) reducer_->BeginBackward(backwards_this_step_ == opt_.num_micro_batches);
  const int num_layers = static_cast<int>(layers_.size());
  if (last_stage_ && !s.has_grad) {  // no labelled token: no gradient, the reduction still runs
    if (reducer_ != nullptr) {
      for (int l = num_layers - 1; l >= 0; --l) reducer_->LayerDone(l);
      reducer_->BackwardDone();
    }
    LT_CUDA_CHECK(cudaMemsetAsync(dx_, 0, rows_l_ * h_ * sizeof(bf16), MainStream()));
    return;
  }
  if (loss_scale != opt_.loss_scale) {
    Die("BF16GptModel::Backward", "loss scale differs from the one the forward applied", __FILE__,
        __LINE__);
  }
  const HiddenDropout last_drop =
      num_layers > 0 ? Drop(s, layers_.back().global_index, 2) : Drop(s, -1, 0);
  if (last_stage_) {
    prof_.Begin("layernorm bwd");
    NormBackward(stage_.d_lnf_w, stage_.d_lnf_b, s.dlnf, nullptr, s.x[num_layers], stage_.lnf_w,
                 s.lnf_mean, s.lnf_rstd, last_drop);
  } else {  // the next stage's gradient of this stage's output
    prof_.Begin("stage input");
    LT_CUDA_CHECK(cudaMemcpyAsync(dx_, doutput, rows_l_ * h_ * sizeof(bf16),
                                  cudaMemcpyDeviceToDevice, MainStream()));
    LT_CUDA_CHECK(cudaMemcpyAsync(dbranch_, doutput, rows_l_ * h_ * sizeof(bf16),
                                  cudaMemcpyDeviceToDevice, MainStream()));
    Dropout<bf16>(dbranch_, rows_l_, h_, last_drop, MainStream());
    branch_grad_ = dbranch_full_;
  }
  prof_.End();
  for (int l = num_layers - 1; l >= 0; --l) {
    LayerBackward(s, l);
    if (reducer_ != nullptr) reducer_->LayerDone(l);
  }
  if (first_stage_) {
    prof_.Begin("embedding bwd");
    GatherRowsFrom(dbranch_, dbranch_full_);
    prof_.Begin("embedding bwd");
    EmbeddingBackward<bf16>(stage_.d_word_emb, branch_grad_, s.tokens, n_, h_, vocab_begin_,
                            vocab_begin_ + vocab_l_, scratch(), MainStream());
    PositionBackward<bf16>(stage_.d_pos_emb, sp_ ? dbranch_ : branch_grad_, positions_, rows_l_, h_,
                           scratch(), MainStream());
    prof_.End();
  }
  if (reducer_ != nullptr) reducer_->BackwardDone();
}

}  // namespace detail

using detail::BF16GptModel;

absl::Status BF16Supported(const ckpt::ModelLayout& layout, const BF16Options& options) {
  const ckpt::ModelConfig& c = layout.config();
  const ckpt::ParallelConfig& p = layout.parallel();
  auto no = [](auto... what) {
    return absl::UnimplementedError(absl::StrCat("--bf16 on the cuda backend: ", what...));
  };
  if (p.tp > 1 && AsNccl(options.tp) == nullptr)
    return no("tensor parallelism needs NCCL process groups");
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
  if (options.model.sequence_parallel &&
      (options.model.micro_batch * options.model.seq_length) % p.tp != 0)
    return no("sequence parallelism needs micro-batch x sequence divisible by TP");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StageModel>> CreateBF16GptModel(const ckpt::ModelLayout& layout,
                                                               ParamStore* params,
                                                               const BF16Options& options) {
  if (absl::Status s = BF16Supported(layout, options); !s.ok()) return s;
  const ckpt::ModelConfig& c = layout.config();
  const ckpt::ParallelConfig& p = layout.parallel();
  absl::StatusOr<std::unique_ptr<FlashAttention>> attention = FlashAttention::Create(
      options.model.micro_batch, options.model.seq_length, c.num_attention_heads / p.tp,
      c.num_query_groups / p.tp, c.kv_channels);
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
