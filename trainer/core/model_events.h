// What a stage model announces as a step goes, for components that hang on its progress instead of
// living inside it: the data-parallel gradient reduction and parameter gathering
// (trainer/cuda/parallel/grad_reduce.h) and the offloaded optimizer's step beside the next forward
// (core/host_step_waits.h) today. A model fires them; a listener does its own work
// (launching a bucket's reduction once its layers are done, making the forward wait for a layer's
// gathered weights). Layers are counted within the model chunk.
#pragma once

#include <string>

namespace leantron::trainer {

class ModelEvents {
 public:
  virtual ~ModelEvents() = default;
  // Before the step's first forward (the optimizer has stepped, or the weights were rewritten).
  virtual void StepBegins() {}
  // The forward is about to use chunk layer `layer`'s weights; -1: the embeddings, final norm and
  // output layer.
  virtual void WeightsNeeded(int layer) {}
  // The forward has issued its last use of chunk layer `layer`'s weights (the bf16 model adds the
  // layer's last bias in the residual add that the next layer's norm begins with).
  virtual void LayerForwardDone(int layer) {}
  // The last stage's forward is about to use the final norm and the output layer, whose loss
  // computation writes the first gradients of the micro-batch.
  virtual void HeadWeightsNeeded() {}
  // A micro-batch's backward begins.
  virtual void BackwardBegins() {}
  // The backward (recomputing the layer's forward first, if it does) is about to use chunk layer
  // `layer`'s weights.
  virtual void LayerBackwardBegins(int layer) {}
  // The backward has finished chunk layer `layer` (and every layer above it).
  virtual void LayerBackwardDone(int layer) {}
  // A micro-batch's backward is done, the embeddings' gradients included.
  virtual void BackwardDone() {}

  // For the end-of-run report: a line on what the component did (empty: nothing to say), and the
  // mean time per step the compute waited for it after the backward.
  virtual std::string Report() const { return {}; }
  virtual double ExposedMsPerStep() const { return 0.0; }
};

}  // namespace leantron::trainer
