#include "trainer/core/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "trainer/core/adamw.h"
#include "trainer/core/grad_buffers.h"
#include "trainer/core/weight_buffers.h"

namespace leantron::trainer {

Optimizer::Optimizer(Ops* ops, ParamStore* params, ProcessGroups* groups,
                     const OptimizerOptions& options)
    : ops_(ops), params_(params), groups_(groups), opt_(options) {
  const size_t n = params_->size();
  if (opt_.buckets.empty()) opt_.buckets.push_back({0, n, -1, -1});
  // The buckets must tile the buffer: every element reduced once and stepped by one rank.
  {
    std::vector<std::pair<size_t, size_t>> tiles;
    for (const DpBucket& b : opt_.buckets) tiles.push_back({b.offset, b.offset + b.numel});
    std::sort(tiles.begin(), tiles.end());
    size_t at = 0;
    for (const auto& [b, e] : tiles) {
      if (b != at) break;
      at = e;
    }
    if (at != n) {
      std::fprintf(stderr, "Optimizer: the data-parallel buckets do not cover the %zu parameters\n",
                   n);
      std::abort();
    }
  }
  // The store's fp32 weights sharded: this rank's parts even when it is the only one (its buffers
  // keep them part by part).
  if (sharded() || (opt_.distributed && params_->sharded())) {
    for (const auto& [first, last] : DpOwnedParts(opt_.buckets, dp_cp().rank(), dp_cp().size()))
      owned_.push_back({first, last, 0});
  } else {
    owned_.push_back({0, n, 0});
  }
  for (Owned& o : owned_) {
    o.state = state_elements_;
    state_elements_ += o.end - o.begin;
  }
  if (params_->sharded()) {
    // The store keeps the fp32 weights this rank steps, and only those.
    std::vector<std::pair<size_t, size_t>> mine;
    for (const Owned& o : owned_) mine.push_back({o.begin, o.end});
    if (!opt_.distributed || mine != params_->shard()) {
      std::fprintf(stderr,
                   "Optimizer: the sharded fp32 weights need the distributed optimizer and this "
                   "rank's parts of the same buckets (DpOwnedParts)\n");
      std::abort();
    }
  }
  // The moments of [0, host_begin) on the backend, of the rest (offloaded) on the host; with one
  // owner of everything (offloading) both in the flat order.
  host_begin_ = state_elements_;
  if (opt_.cpu_offload) {
    // One owner of everything (kHost), or this rank's parts (kHostSharded), stepped
    // synchronously: the other ranks gather them after the step.
    if (!params_->offloaded() || params_->grads().sharded() || sharded() != params_->sharded() ||
        (sharded() && opt_.overlap_host_step)) {
      std::fprintf(stderr,
                   "Optimizer: the offloaded step needs the weights on the host (this rank's "
                   "parts with the distributed optimizer, stepped before the next forward) and "
                   "whole gradients\n");
      std::abort();
    }
    host_begin_ = params_->host_begin();
    host_ = std::make_unique<HostAdamW>(params_, state_elements_ - host_begin_, opt_.host_threads,
                                        opt_.offload_piece);
  }
  if (host_begin_ > 0) {
    exp_avg_ = ops_->Alloc(host_begin_);
    exp_avg_sq_ = ops_->Alloc(host_begin_);
  }
  const GradBuffers& grads = params_->grads();
  // Adjacent pieces with the same treatment merge into one range: a few long kernels (and, for
  // the norm, a few device-to-host reads) per step instead of one per tensor.
  for (const Owned& o : owned_) {
    for (const ParamView& v : params_->views()) {
      const size_t b = std::max(o.begin, v.offset), e = std::min(o.end, v.offset + v.numel);
      if (b >= e) continue;
      // A range is also one run of reduced gradients in memory (GradBuffers::ReducedRunEnd).
      if (v.count_in_norm) {
        if (!norm_ranges_.empty() && norm_ranges_.back().second == b &&
            grads.ReducedRunEnd(norm_ranges_.back().first) >= e) {
          norm_ranges_.back().second = e;
        } else {
          norm_ranges_.push_back({b, e});
        }
      }
      const size_t state = o.state + (b - o.begin);
      AdamRange* last = adam_ranges_.empty() ? nullptr : &adam_ranges_.back();
      // One range is one run of fp32 weights in memory (with them sharded, the norms and
      // embeddings are stepped in the store's mirror, the rest apart).
      if (last != nullptr && last->end == b && last->decay == v.decay &&
          last->state + (last->end - last->begin) == state &&
          params_->MasterRunEnd(last->begin) >= e && grads.ReducedRunEnd(last->begin) >= e &&
          (params_->weights() == nullptr ||
           params_->weights()->layout().OwnedRunEnd(last->begin) >= e)) {
        last->end = e;
      } else {
        adam_ranges_.push_back({b, e, state, v.decay});
      }
    }
  }
  // The host steps the ranges from host_begin_ on (MasterRunEnd cuts them there), with its
  // moments counted from there.
  if (host_ != nullptr) {
    auto first_host = std::find_if(adam_ranges_.begin(), adam_ranges_.end(),
                                   [&](const AdamRange& r) { return r.begin >= host_begin_; });
    for (auto it = first_host; it != adam_ranges_.end(); ++it)
      host_ranges_.push_back({it->begin, it->end, it->state - host_begin_, it->decay});
    adam_ranges_.erase(first_host, adam_ranges_.end());
  }
}

Optimizer::~Optimizer() {
  FinishHostStep();
  if (exp_avg_ == nullptr) return;
  ops_->Free(exp_avg_);
  ops_->Free(exp_avg_sq_);
}

void Optimizer::ZeroGrad() {
  // The host step may still be bringing the gradients down.
  if (host_ != nullptr && host_->active()) {
    zero_pending_ = true;
    return;
  }
  params_->grads().Zero();
}

void Optimizer::WaitHostWeights(size_t end) {
  if (host_ != nullptr) host_->WaitUploaded(end);
}

void Optimizer::FinishHostStep() {
  if (host_ == nullptr) return;
  host_->Finish();
  if (zero_pending_) {
    params_->grads().Zero();
    zero_pending_ = false;
  }
}

void Optimizer::FinalizeGrads() {
  if (zero_pending_) {
    std::fprintf(stderr,
                 "Optimizer: gradients computed while the overlapped host step was under way (no "
                 "listener called FinishHostStep before the backward)\n");
    std::abort();
  }
  GradBuffers& grads = params_->grads();
  Communicator& dp = dp_cp();
  // The sum over data- and context-parallel ranks (each CP rank holds its tokens' share of the
  // micro-batches' gradient), bucket by bucket (the Gloo backend's reduce-scatter is an
  // all-reduce underneath, so the distributed optimizer reduces whole buckets too and uses its
  // parts). The 1/DP averaging happens inside the step. Sharded gradients: a listener has summed
  // the layers' buckets already (their slots are gone); the whole buffers of the others are
  // summed here, before the sums below, which then need only this rank's parts.
  auto reduce_dp = [&](bool whole_buffers_only) {
    if (dp.size() == 1 || opt_.dp_by_reducer) return;
    for (const DpBucket& b : opt_.buckets) {
      if (whole_buffers_only && grads.Find(b.offset)->slot >= 0) continue;
      dp.AllReduceSum(grads.At(b.offset), b.numel);
    }
  };
  // The pieces of a tensor's gradient to sum: all of it, or with sharded gradients this rank's
  // parts (the same parts on every rank that holds the tensor).
  auto pieces = [&](const ParamView& v, std::vector<std::pair<float*, size_t>>* out) {
    if (!grads.sharded()) return out->push_back({grads.At(v.offset), v.numel});
    for (const Owned& o : owned_) {
      for (size_t x = std::max(o.begin, v.offset), e = std::min(o.end, v.offset + v.numel);
           x < e;) {
        const size_t y = std::min(e, grads.ReducedRunEnd(x));
        out->push_back({grads.Reduced(x), y - x});
        x = y;
      }
    }
  };
  if (grads.sharded()) reduce_dp(/*whole_buffers_only=*/true);
  // Sequence parallelism: replicated parameters saw only this rank's rows.
  if (groups_->tp->size() > 1) {
    std::vector<std::pair<float*, size_t>> partial;
    for (const ParamView& v : params_->views())
      if (v.tp_partial_grad) pieces(v, &partial);
    groups_->tp->AllReduceSumMany(partial);
  }
  // Tied embeddings across the first and last stage: both copies get the sum.
  if (groups_->embedding && !params_->layout().config().untie_embeddings_and_output_weights) {
    for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
      const ParamView* v = params_->Find(name);
      if (v == nullptr) continue;
      if (std::string(name) == "output_layer.weight" && v->spec->tied_to.empty()) continue;
      std::vector<std::pair<float*, size_t>> tied;
      pieces(*v, &tied);
      for (const auto& [p, n] : tied) groups_->embedding->AllReduceSum(p, n);
    }
  }
  if (!grads.sharded()) reduce_dp(/*whole_buffers_only=*/false);
}

StepResult Optimizer::Step(float lr) {
  StepResult result;
  const GradBuffers& grads = params_->grads();
  // Squared norm over the parameters this rank counts, restricted to what it steps; the
  // gradients are still the sum over DP ranks.
  double sq = 0.0;
  for (const auto& [b, e] : norm_ranges_) sq += ops_->SumSquares(grads.Reduced(b), e - b);
  groups_->model->AllReduceSumDouble(&sq, 1);
  if (sharded()) dp_cp().AllReduceSumDouble(&sq, 1);
  // The sum over CP ranks is the micro-batches' gradient; over DP ranks, DP times the mean.
  const double inv_dp = 1.0 / static_cast<double>(groups_->dp->size());
  result.grad_norm = std::sqrt(sq) * inv_dp;
  if (!std::isfinite(result.grad_norm)) {
    result.skipped = true;
    return result;
  }
  float grad_scale = static_cast<float>(inv_dp);
  if (opt_.clip_grad > 0.0f) {
    const double coeff = opt_.clip_grad / (result.grad_norm + 1e-6);
    if (coeff < 1.0) grad_scale *= static_cast<float>(coeff);
  }
  ++step_;
  for (StepCopies* c : step_copies_) c->WeightsWillStep();
  // The host's part first, so that it steps while the backend steps the rest.
  if (host_ != nullptr)
    host_->Start(host_ranges_,
                 MakeAdamWConstants(lr, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay, step_,
                                    grad_scale),
                 MakeAdamWConstants(lr, opt_.beta1, opt_.beta2, opt_.eps, 0.0f, step_, grad_scale));
  for (const AdamRange& r : adam_ranges_) {
    const float decay = r.decay ? opt_.weight_decay : 0.0f;
    const AdamWConstants constants =
        MakeAdamWConstants(lr, opt_.beta1, opt_.beta2, opt_.eps, decay, step_, grad_scale);
    // [at, e) of the range by the plain update; the copied weights inside it by their copies.
    size_t at = r.begin;
    auto plain = [&](size_t e) {
      if (at < e)
        ops_->AdamWStep(params_->Master(at), grads.Reduced(at), exp_avg_ + r.state + (at - r.begin),
                        exp_avg_sq_ + r.state + (at - r.begin), e - at, lr, opt_.beta1, opt_.beta2,
                        opt_.eps, decay, step_, grad_scale, params_->Bf16Owned(at));
      at = e;
    };
    auto it = std::lower_bound(copied_.begin(), copied_.end(), r.begin,
                               [](const Copied& c, size_t b) { return c.begin < b; });
    for (; it != copied_.end() && it->end <= r.end; ++it) {
      plain(it->begin);
      const size_t state = r.state + (it->begin - r.begin);
      it->copies->Update(it->index, params_->Master(it->begin), grads.Reduced(it->begin),
                         exp_avg_ + state, exp_avg_sq_ + state, constants,
                         params_->Bf16Owned(it->begin));
      at = it->end;
    }
    plain(r.end);
  }
  if (host_ != nullptr && !opt_.overlap_host_step) host_->Finish();
  params_->WeightsStepped();
  if (sharded()) {
    // The gradient reducer gathers the other parts before the next forward. With the fp32
    // weights sharded the bf16 copy and the mirror are all the model needs whole, and a save
    // gathers the fp32 weights itself (GatherMaster).
    if (params_->weights() != nullptr) {
      // optim_grads_params: the model's listeners gather the parts before each use.
    } else if (!opt_.dp_by_reducer) {
      BroadcastParts();
    } else if (!params_->sharded()) {
      params_partial_ = true;
    }
  }
  return result;
}

void Optimizer::AddStepCopies(StepCopies* copies) {
  step_copies_.push_back(copies);
  // The offloaded step writes the bf16 copy from the host; the model casts its copies itself.
  if (host_ != nullptr || params_->bf16_copy() == nullptr) return;
  const std::vector<std::pair<size_t, size_t>> weights = copies->CopiedWeights();
  for (size_t i = 0; i < weights.size(); ++i) {
    const auto [offset, numel] = weights[i];
    const size_t end = offset + numel;
    for (const AdamRange& r : adam_ranges_) {
      if (r.begin <= offset && end <= r.end) copied_.push_back({offset, end, copies, i});
    }
  }
  std::sort(copied_.begin(), copied_.end(),
            [](const Copied& a, const Copied& b) { return a.begin < b.begin; });
}

void Optimizer::BroadcastParts() {
  Communicator& dp = dp_cp();
  const bool whole = !params_->sharded();
  uint16_t* low = params_->bf16_copy();
  for (const DpBucket& b : opt_.buckets) {
    for (int r = 0; r < dp.size(); ++r) {
      const auto [first, last] = b.Part(r, dp.size());
      if (first >= last) continue;
      if (whole) {
        dp.Broadcast(params_->data() + first, last - first, r);
        continue;
      }
      if (low != nullptr) dp.Broadcast16(low + first, last - first, r);
      for (const ParamView& v : params_->views()) {
        const size_t vb = std::max(first, v.offset), ve = std::min(last, v.offset + v.numel);
        if (vb < ve && v.mirror != ParamView::kNoMirror)
          dp.Broadcast(params_->MirrorAt(vb), ve - vb, r);
      }
    }
  }
}

void Optimizer::GatherParams() {
  FinishHostStep();
  if (!params_partial_) return;
  BroadcastParts();
  params_partial_ = false;
}

void Optimizer::GatherMaster(std::vector<float>* out) {
  FinishHostStep();
  const size_t n = params_->size();
  if (!params_->sharded()) {
    GatherParams();
    if (out != nullptr) *out = params_->HostData();
    return;
  }
  // A window of the flat order at a time: each part broadcast from its owner, bit for bit.
  if (out != nullptr) out->assign(n, 0.0f);
  Communicator& dp = dp_cp();
  const size_t window = std::max<size_t>(1, std::min(n, opt_.gather_window));
  float* buffer = ops_->Alloc(window);
  for (size_t w = 0; w < n; w += window) {
    const size_t len = std::min(window, n - w);
    for (const DpBucket& b : opt_.buckets) {
      for (int r = 0; r < dp.size(); ++r) {
        const auto [first, last] = b.Part(r, dp.size());
        const size_t pb = std::max(first, w), pe = std::min(last, w + len);
        if (pb >= pe) continue;
        for (size_t x = pb; r == dp.rank() && x < pe;) {
          const size_t y = std::min(pe, params_->MasterRunEnd(x));
          if (params_->offloaded()) {  // this rank's parts in host memory
            ops_->CopyFromHost(buffer + (x - w), params_->Master(x), (y - x) * sizeof(float));
          } else {
            ops_->Copy(buffer + (x - w), params_->Master(x), y - x);
          }
          x = y;
        }
        dp.Broadcast(buffer + (pb - w), pe - pb, r);
      }
    }
    if (out != nullptr) ops_->CopyToHost(out->data() + w, buffer, len * sizeof(float));
  }
  ops_->Free(buffer);
}

void Optimizer::GatherState(std::vector<float>* exp_avg, std::vector<float>* exp_avg_sq) {
  FinishHostStep();
  const size_t n = params_->size();
  const bool wanted = exp_avg != nullptr && exp_avg_sq != nullptr;
  if (wanted) {
    exp_avg->assign(n, 0.0f);
    exp_avg_sq->assign(n, 0.0f);
  } else if (!sharded()) {
    return;  // nothing to take part in
  }
  if (host_ != nullptr && !sharded()) {
    const size_t b = host_begin_;
    if (b > 0) {
      ops_->CopyToHost(exp_avg->data(), exp_avg_, b * sizeof(float));
      ops_->CopyToHost(exp_avg_sq->data(), exp_avg_sq_, b * sizeof(float));
    }
    std::memcpy(exp_avg->data() + b, host_->exp_avg(), (n - b) * sizeof(float));
    std::memcpy(exp_avg_sq->data() + b, host_->exp_avg_sq(), (n - b) * sizeof(float));
    return;
  }
  if (!sharded()) {
    ops_->CopyToHost(exp_avg->data(), exp_avg_, n * sizeof(float));
    ops_->CopyToHost(exp_avg_sq->data(), exp_avg_sq_, n * sizeof(float));
    return;
  }
  // A window of the flat order at a time (bounded extra device memory, as a save late in a run
  // near the memory limit needs): every rank places its parts in the zeroed window, the sum over
  // DP is the whole.
  const size_t window = std::max<size_t>(1, std::min(n, opt_.gather_window));
  float* buffer = ops_->Alloc(window);
  // The moments of this rank's parts: on the backend, or on the host (offloaded).
  float* const m = host_ != nullptr ? host_->exp_avg() : exp_avg_;
  float* const v = host_ != nullptr ? host_->exp_avg_sq() : exp_avg_sq_;
  for (auto [state, host] : {std::pair{m, exp_avg}, std::pair{v, exp_avg_sq}}) {
    for (size_t w = 0; w < n; w += window) {
      const size_t len = std::min(window, n - w);
      ops_->Zero(buffer, len);
      for (const Owned& o : owned_) {
        const size_t b = std::max(o.begin, w), e = std::min(o.end, w + len);
        if (b >= e) continue;
        const float* from = state + o.state + (b - o.begin);
        if (host_ != nullptr) {
          ops_->CopyFromHost(buffer + (b - w), from, (e - b) * sizeof(float));
        } else {
          ops_->Copy(buffer + (b - w), from, e - b);
        }
      }
      dp_cp().AllReduceSum(buffer, len);
      if (wanted) ops_->CopyToHost(host->data() + w, buffer, len * sizeof(float));
    }
  }
  ops_->Free(buffer);
}

bool Optimizer::HostState(float** exp_avg, float** exp_avg_sq) {
  FinishHostStep();
  if (host_ == nullptr || host_begin_ > 0 || sharded()) return false;
  *exp_avg = host_->exp_avg();
  *exp_avg_sq = host_->exp_avg_sq();
  return true;
}

void Optimizer::ScatterState(const std::vector<float>& exp_avg,
                             const std::vector<float>& exp_avg_sq) {
  SetState(0, params_->size(), exp_avg.data(), exp_avg_sq.data());
}

void Optimizer::SetState(size_t begin, size_t end, const float* exp_avg, const float* exp_avg_sq) {
  FinishHostStep();
  // Moments [0, host_begin_) live on the backend, the rest (offloaded) on the host.
  auto put = [&](size_t state, const float* m, const float* v, size_t n) {
    if (state >= host_begin_) {
      std::memcpy(host_->exp_avg() + (state - host_begin_), m, n * sizeof(float));
      std::memcpy(host_->exp_avg_sq() + (state - host_begin_), v, n * sizeof(float));
    } else {
      ops_->CopyFromHost(exp_avg_ + state, m, n * sizeof(float));
      ops_->CopyFromHost(exp_avg_sq_ + state, v, n * sizeof(float));
    }
  };
  for (const Owned& o : owned_) {
    const size_t b = std::max(begin, o.begin), e = std::min(end, o.end);
    if (b >= e) continue;
    const size_t state = o.state + (b - o.begin);
    const float *m = exp_avg + (b - begin), *v = exp_avg_sq + (b - begin);
    const size_t backend = state < host_begin_ ? std::min(e - b, host_begin_ - state) : 0;
    if (backend > 0) put(state, m, v, backend);
    if (backend < e - b) put(state + backend, m + backend, v + backend, e - b - backend);
  }
}

}  // namespace leantron::trainer
