// The offloaded optimizer's step beside the next forward (--optimizer-cpu-offload): the host steps
// the weights piece by piece in flat order while the model runs its next forward, and each part of
// the forward waits for the weights it reads only. One listener per model chunk (ModelEvents):
//   WeightsNeeded(-1): the embeddings (the first stage's first chunk; nothing on the others);
//   WeightsNeeded(l): chunk layer l's tensors (and, the flat order being the forward's, everything
//     before them in the buffers);
//   HeadWeightsNeeded, BackwardBegins: the whole step, and the gradients zeroed (the loss's
//     computation and the backward write them).
// The flat buffers hold the stage's tensors in the order the forward reads them (embeddings,
// decoder layers, final norm, output layer), so waiting for a prefix is waiting for what is read.
#pragma once

#include <cstddef>
#include <vector>

#include "trainer/core/model_events.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/params.h"

namespace leantron::trainer {

class HostStepWaits final : public ModelEvents {
 public:
  // The chunk's decoder layers are [first_layer, last_layer) (global indices).
  HostStepWaits(Optimizer* optimizer, const ParamStore& params, int first_layer, int last_layer);

  void WeightsNeeded(int layer) override;
  void HeadWeightsNeeded() override { optimizer_->FinishHostStep(); }
  void BackwardBegins() override { optimizer_->FinishHostStep(); }

  // Where the prefix of the flat buffers a forward reads up to ends: the embeddings' tensors
  // (layer -1) or chunk layer `layer`'s (0 when the chunk holds none).
  size_t end_of(int layer) const;

 private:
  Optimizer* optimizer_;
  size_t embeddings_end_ = 0;
  std::vector<size_t> layer_end_;  // per chunk layer
};

}  // namespace leantron::trainer
