// The data-parallel sum of sharded gradients (GradBuffers; --data-parallel-sharding-strategy
// optim_grads) for a model without a reducer of its own: the float32 reference model, on any
// backend. Listening to one model chunk, it zeroes a layer bucket's slot before the backward
// writes into it and, once the backward has finished the bucket's lowest layer, sums the slot
// over the data-parallel group (with context parallel) and adds this rank's part to the step's
// sum, every micro-batch. It works synchronously, so the slot is free when it returns. The
// embeddings' and the head's buckets keep whole buffers: the optimizer sums them (FinalizeGrads).
#pragma once

#include <vector>

#include "trainer/core/grad_buffers.h"
#include "trainer/core/model_events.h"
#include "trainer/dist/comm.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {

class SlotGradReducer final : public ModelEvents {
 public:
  // `buckets`: the chunk's (PlanDpBuckets), which `grads` keeps sharded.
  SlotGradReducer(Ops* ops, Communicator* dp, const GradBuffers* grads,
                  const std::vector<DpBucket>& buckets);

  void BackwardBegins() override;
  void LayerBackwardDone(int layer) override;

 private:
  // Zeroes the slot of the bucket whose highest layer is `layer`, if there is one.
  void Prepare(int layer);
  Ops* ops_;
  Communicator* dp_;
  std::vector<const GradBuffers::Bucket*> layer_buckets_;  // the chunk's, in the backward's order
};

}  // namespace leantron::trainer
