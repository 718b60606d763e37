// The bf16 model's weights under --data-parallel-sharding-strategy optim_grads_params (ZeRO-3):
// each layer bucket's bf16 weights are gathered from the data-parallel ranks' parts
// (WeightBuffers, written by the step) into the bucket's slot just before a pass uses it, on the
// data-parallel communication stream, and the next bucket of the pass is prefetched into the
// other slot as soon as the compute has left it: in the forward once the previous bucket's last
// use is issued, in the backward when the bucket is taken. The compute stream waits for a
// bucket's gather only when it takes the bucket; a gather waits for the slot's previous bucket's
// last use. A bucket still in its slot from the pass before (the backward ends where the next
// forward begins) is not gathered again until the weights change. With one rank the part is
// copied into the slot. The embeddings' and head's buckets, and the fp32 mirror of the norms,
// are gathered whole after each step by the GradReducer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/core/model_events.h"
#include "trainer/core/params.h"
#include "trainer/core/weight_buffers.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/dist/nccl_comm.h"

namespace leantron::trainer::cuda {

class WeightGatherer final : public ModelEvents {
 public:
  // `buckets`: the chunk's (PlanDpBuckets, in the backward's order), over which `params` keeps its
  // bf16 copy as WeightBuffers. `dp` may be null (one rank).
  WeightGatherer(NcclCommunicator* dp, const ParamStore* params,
                 const std::vector<DpBucket>& buckets);
  ~WeightGatherer() override;
  WeightGatherer(const WeightGatherer&) = delete;
  WeightGatherer& operator=(const WeightGatherer&) = delete;

  void StepBegins() override;
  void WeightsNeeded(int layer) override;
  void LayerForwardDone(int layer) override;
  void BackwardBegins() override;
  void LayerBackwardBegins(int layer) override;
  void LayerBackwardDone(int layer) override;
  std::string Report() const override;

  // Gathers issued so far (tests: a pass gathers each bucket once, but the two its predecessor
  // left in the slots).
  int64_t gathers() const { return gathers_; }

 private:
  int size() const { return dp_ != nullptr ? dp_->size() : 1; }
  // The layer bucket (index into buckets_) holding chunk layer `layer`.
  int BucketOf(int layer) const;
  // The pass's bucket after `i` (-1: none).
  int Next(int i) const;
  void Take(int i);
  void Leave(int i);
  void Prefetch(int i);
  void Gather(int i);
  NcclCommunicator* dp_;
  const ParamStore* params_;
  const WeightBuffers* weights_;
  std::vector<const SlotLayout::Place*> buckets_;  // the chunk's layer buckets, top layers first
  std::shared_ptr<cudaStream_t> stream_;
  cudaStream_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::vector<cudaEvent_t> gathered_;          // per bucket, on comm_
  cudaEvent_t free_[SlotLayout::kSlots] = {};  // per slot, on the compute stream
  int held_[SlotLayout::kSlots] = {-1, -1};    // the bucket each slot holds (or is receiving)
  bool taken_[SlotLayout::kSlots] = {};        // in use by the pass
  int current_ = -1;                           // the bucket the pass took last
  bool forward_ = true;                        // the pass's direction: up the layers
  uint64_t weights_seen_ = 0;
  int64_t gathers_ = 0, passes_ = 0;
};

}  // namespace leantron::trainer::cuda
