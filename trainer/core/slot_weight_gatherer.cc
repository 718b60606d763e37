#include "trainer/core/slot_weight_gatherer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_format.h"

namespace leantron::trainer {

SlotWeightGatherer::SlotWeightGatherer(Ops* ops, Communicator* dp, const ParamStore* params,
                                       const std::vector<DpBucket>& buckets)
    : ops_(ops), dp_(dp), params_(params), weights_(params->weights()) {
  if (weights_ == nullptr || weights_->element_bytes() != sizeof(float)) {
    std::fprintf(stderr, "SlotWeightGatherer: the fp32 weights are not WeightBuffers\n");
    std::abort();
  }
  for (const SlotLayout::Place* k : weights_->layout().PlacesOf(buckets, "SlotWeightGatherer"))
    (k->slot >= 0 ? layer_buckets_ : whole_buckets_).push_back(k);
}

void SlotWeightGatherer::StepBegins() {
  ++steps_;
  if (params_->weights_version() == weights_seen_) return;
  for (const SlotLayout::Place*& h : held_) h = nullptr;
  // Stepped (not rewritten, which writes the whole buffers whole): every rank stepped its parts.
  if (params_->weights_rewritten() <= weights_seen_ && dp_->size() > 1) {
    for (const SlotLayout::Place* k : whole_buckets_) {
      for (int q = 0; q < dp_->size(); ++q) {
        const auto [first, last] = k->bucket.Part(q, dp_->size());
        if (first < last) dp_->Broadcast(weights_->At<float>(first), last - first, q);
      }
    }
  }
  weights_seen_ = params_->weights_version();
}

void SlotWeightGatherer::Ensure(int layer) {
  if (layer < 0) return;
  for (const SlotLayout::Place* k : layer_buckets_) {
    const DpBucket& b = k->bucket;
    if (layer < b.first_layer || layer > b.last_layer || held_[k->slot] == k) continue;
    float* slot = weights_->At<float>(b.offset);
    if (k->part_end > k->part_begin)
      ops_->Copy(slot + (k->part_begin - b.offset), weights_->Owned<float>(k->part_begin),
                 k->part_end - k->part_begin);
    for (int q = 0; q < dp_->size() && dp_->size() > 1; ++q) {
      const auto [first, last] = b.Part(q, dp_->size());
      if (first < last) dp_->Broadcast(slot + (first - b.offset), last - first, q);
    }
    held_[k->slot] = k;
    ++gathers_;
  }
}

std::string SlotWeightGatherer::Report() const {
  if (steps_ == 0 || layer_buckets_.empty()) return {};
  const size_t slots = std::min<size_t>(SlotLayout::kSlots, layer_buckets_.size());
  return absl::StrFormat(
      "sharded weights (optim_grads_params): %zu layer buckets' fp32 weights gathered into %zu "
      "slot%s before use, %.1f gathers per step",
      layer_buckets_.size(), slots, slots > 1 ? "s" : "",
      static_cast<double>(gathers_) / static_cast<double>(steps_));
}

}  // namespace leantron::trainer
