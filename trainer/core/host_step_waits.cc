#include "trainer/core/host_step_waits.h"

#include <algorithm>
#include <string>

#include "absl/strings/match.h"

namespace leantron::trainer {

HostStepWaits::HostStepWaits(Optimizer* optimizer, const ParamStore& params, int first_layer,
                             int last_layer)
    : optimizer_(optimizer), layer_end_(std::max(0, last_layer - first_layer), 0) {
  for (const ParamView& v : params.views()) {
    const size_t end = v.offset + v.numel;
    if (absl::StartsWith(v.name, "embedding.")) {
      embeddings_end_ = std::max(embeddings_end_, end);
      continue;
    }
    for (int l = first_layer; l < last_layer; ++l) {
      if (absl::StartsWith(v.name, "decoder.layers." + std::to_string(l) + ".")) {
        size_t& e = layer_end_[l - first_layer];
        e = std::max(e, end);
      }
    }
  }
}

size_t HostStepWaits::end_of(int layer) const {
  if (layer < 0) return embeddings_end_;
  return static_cast<size_t>(layer) < layer_end_.size() ? layer_end_[layer] : 0;
}

void HostStepWaits::WeightsNeeded(int layer) {
  if (const size_t end = end_of(layer); end > 0) optimizer_->WaitHostWeights(end);
}

}  // namespace leantron::trainer
