#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace leantron::trainer {

Optimizer::Optimizer(Ops* ops, ParamStore* params, ProcessGroups* groups,
                     const OptimizerOptions& options)
    : ops_(ops), params_(params), groups_(groups), opt_(options) {
  const size_t n = params_->size();
  const int dp = groups_->dp->size();
  if (opt_.distributed && dp > 1) {
    slice_ = (n + dp - 1) / dp;
    begin_ = std::min(n, slice_ * groups_->dp->rank());
    end_ = std::min(n, begin_ + slice_);
  } else {
    slice_ = n;
    begin_ = 0;
    end_ = n;
  }
  exp_avg_ = ops_->Alloc(end_ - begin_);
  exp_avg_sq_ = ops_->Alloc(end_ - begin_);
  // Adjacent views with the same treatment merge into one range: a few long kernels (and, for
  // the norm, a few device-to-host reads) per step instead of one per tensor.
  for (const ParamView& v : params_->views()) {
    const size_t b = std::max(begin_, v.offset), e = std::min(end_, v.offset + v.numel);
    if (b >= e) continue;
    if (v.count_in_norm) {
      if (!norm_ranges_.empty() && norm_ranges_.back().second == b) {
        norm_ranges_.back().second = e;
      } else {
        norm_ranges_.push_back({b, e});
      }
    }
    if (!adam_ranges_.empty() && adam_ranges_.back().end == b &&
        adam_ranges_.back().decay == v.decay) {
      adam_ranges_.back().end = e;
    } else {
      adam_ranges_.push_back({b, e, v.decay});
    }
  }
}

Optimizer::~Optimizer() {
  ops_->Free(exp_avg_);
  ops_->Free(exp_avg_sq_);
}

void Optimizer::ZeroGrad() { ops_->Zero(params_->grad(), params_->size()); }

void Optimizer::FinalizeGrads() {
  float* grad = params_->grad();
  // Sequence parallelism: replicated parameters saw only this rank's rows.
  if (groups_->tp->size() > 1) {
    std::vector<std::pair<float*, size_t>> partial;
    for (const ParamView& v : params_->views())
      if (v.tp_partial_grad) partial.push_back({grad + v.offset, v.numel});
    groups_->tp->AllReduceSumMany(partial);
  }
  // Tied embeddings across the first and last stage: both copies get the sum.
  if (groups_->embedding && !params_->layout().config().untie_embeddings_and_output_weights) {
    for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
      const ParamView* v = params_->Find(name);
      if (v == nullptr) continue;
      if (std::string(name) == "output_layer.weight" && v->spec->tied_to.empty()) continue;
      groups_->embedding->AllReduceSum(grad + v->offset, v->numel);
    }
  }
  Communicator* dp = groups_->dp.get();
  if (dp->size() == 1) return;
  const size_t n = params_->size();
  const float inv = 1.0f / static_cast<float>(dp->size());
  if (opt_.dp_reduced_by_model) {
    // Summed already, overlapped with the backward.
  } else if (opt_.distributed) {
    // Every rank needs only its slice summed; the Gloo backend's reduce-scatter is an all-reduce
    // underneath, so reduce whole buckets and keep everything (the others' slices are unused).
    for (size_t b = 0; b < n; b += opt_.bucket_elements)
      dp->AllReduceSum(grad + b, std::min<size_t>(opt_.bucket_elements, n - b));
  } else {
    // Buckets bound the message size; on the CPU there is no backward to overlap them with.
    for (size_t b = 0; b < n; b += opt_.bucket_elements)
      dp->AllReduceSum(grad + b, std::min<size_t>(opt_.bucket_elements, n - b));
  }
  ops_->Scale(grad + begin_, end_ - begin_, inv);
}

StepResult Optimizer::Step(float lr) {
  StepResult result;
  float* grad = params_->grad();
  float* data = params_->data();
  // Squared norm over the parameters this rank counts, restricted to its optimizer slice.
  double sq = 0.0;
  for (const auto& [b, e] : norm_ranges_) sq += ops_->SumSquares(grad + b, e - b);
  groups_->model->AllReduceSumDouble(&sq, 1);
  if (opt_.distributed && groups_->dp->size() > 1) groups_->dp->AllReduceSumDouble(&sq, 1);
  result.grad_norm = std::sqrt(sq);
  if (!std::isfinite(result.grad_norm)) {
    result.skipped = true;
    return result;
  }
  if (opt_.clip_grad > 0.0f) {
    const double coeff = opt_.clip_grad / (result.grad_norm + 1e-6);
    if (coeff < 1.0) ops_->Scale(grad + begin_, end_ - begin_, static_cast<float>(coeff));
  }
  ++step_;
  for (const Range& r : adam_ranges_) {
    ops_->AdamWStep(data + r.begin, grad + r.begin, exp_avg_ + (r.begin - begin_),
                    exp_avg_sq_ + (r.begin - begin_), r.end - r.begin, lr, opt_.beta1, opt_.beta2,
                    opt_.eps, r.decay ? opt_.weight_decay : 0.0f, step_);
  }
  if (opt_.distributed && groups_->dp->size() > 1) {
    // Each rank broadcasts its updated slice (a padded all-gather would need equal slices).
    const int dp = groups_->dp->size();
    const size_t n = params_->size();
    for (int r = 0; r < dp; ++r) {
      const size_t b = std::min(n, slice_ * r), e = std::min(n, b + slice_);
      if (b < e) groups_->dp->Broadcast(data + b, e - b, r);
    }
  }
  return result;
}

void Optimizer::GatherState(std::vector<float>* exp_avg, std::vector<float>* exp_avg_sq) {
  const size_t n = params_->size();
  exp_avg->assign(n, 0.0f);
  exp_avg_sq->assign(n, 0.0f);
  if (!(opt_.distributed && groups_->dp->size() > 1)) {
    ops_->CopyToHost(exp_avg->data(), exp_avg_, n * sizeof(float));
    ops_->CopyToHost(exp_avg_sq->data(), exp_avg_sq_, n * sizeof(float));
    return;
  }
  // Every DP rank broadcasts its slice into whole-shard backend buffers, then one copy out.
  for (auto [slice, host] : {std::pair{exp_avg_, exp_avg}, std::pair{exp_avg_sq_, exp_avg_sq}}) {
    float* whole = ops_->Alloc(n);
    ops_->Copy(whole + begin_, slice, end_ - begin_);
    for (int r = 0; r < groups_->dp->size(); ++r) {
      const size_t b = std::min(n, slice_ * r), e = std::min(n, b + slice_);
      if (b < e) groups_->dp->Broadcast(whole + b, e - b, r);
    }
    ops_->CopyToHost(host->data(), whole, n * sizeof(float));
    ops_->Free(whole);
  }
}

void Optimizer::ScatterState(const std::vector<float>& exp_avg,
                             const std::vector<float>& exp_avg_sq) {
  ops_->CopyFromHost(exp_avg_, exp_avg.data() + begin_, (end_ - begin_) * sizeof(float));
  ops_->CopyFromHost(exp_avg_sq_, exp_avg_sq.data() + begin_, (end_ - begin_) * sizeof(float));
}

}  // namespace leantron::trainer
