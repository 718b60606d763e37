// The gathering of the weights a model computes with under --data-parallel-sharding-strategy
// optim_grads_params (WeightBuffers) for a model without a reducer of its own: the float32
// reference model (ParamStore kShardedCompute), on any backend. Listening to one model chunk, it
// gathers a layer bucket's parts from every data-parallel rank (with context parallel) into the
// bucket's slot just before a pass uses the bucket, unless the slot holds it already, and after
// each step the other ranks' parts of the whole buffers (the embeddings and head). It works
// synchronously: a gather has ended when it returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/core/model_events.h"
#include "trainer/core/params.h"
#include "trainer/core/weight_buffers.h"
#include "trainer/dist/comm.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {

class SlotWeightGatherer final : public ModelEvents {
 public:
  // `buckets`: the chunk's (PlanDpBuckets), over which `params`' fp32 weights are WeightBuffers.
  SlotWeightGatherer(Ops* ops, Communicator* dp, const ParamStore* params,
                     const std::vector<DpBucket>& buckets);

  void StepBegins() override;
  void WeightsNeeded(int layer) override { Ensure(layer); }
  void LayerBackwardBegins(int layer) override { Ensure(layer); }
  // Gathers made (for tests: a pass over the layers needs each bucket once, the next pass in the
  // other direction reuses the last two).
  int64_t gathers() const { return gathers_; }
  // The buckets, slots and gathers per step, for the rank's report.
  std::string Report() const override;

 private:
  // The slot of the bucket holding chunk layer `layer` gets that bucket's weights.
  void Ensure(int layer);
  Ops* ops_;
  Communicator* dp_;
  const ParamStore* params_;
  const WeightBuffers* weights_;
  std::vector<const SlotLayout::Place*> layer_buckets_, whole_buckets_;
  const SlotLayout::Place* held_[SlotLayout::kSlots] = {};  // what each slot holds now
  uint64_t weights_seen_ = 0;
  int64_t gathers_ = 0, steps_ = 0;
};

}  // namespace leantron::trainer
