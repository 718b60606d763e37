#include "trainer/core/slot_grad_reducer.h"

#include <cstdio>
#include <cstdlib>

namespace leantron::trainer {

SlotGradReducer::SlotGradReducer(Ops* ops, Communicator* dp, const GradBuffers* grads,
                                 const std::vector<DpBucket>& buckets)
    : ops_(ops), dp_(dp) {
  for (const DpBucket& b : buckets) {
    const GradBuffers::Bucket* k = grads->Find(b.offset);
    if (k == nullptr) {
      std::fprintf(stderr, "SlotGradReducer: the gradients are not sharded over these buckets\n");
      std::abort();
    }
    if (k->slot >= 0) layer_buckets_.push_back(k);
  }
}

void SlotGradReducer::Prepare(int layer) {
  for (const GradBuffers::Bucket* k : layer_buckets_)
    if (k->bucket.last_layer == layer) ops_->Zero(k->at, k->bucket.numel);
}

void SlotGradReducer::BackwardBegins() {
  if (!layer_buckets_.empty()) Prepare(layer_buckets_.front()->bucket.last_layer);
}

void SlotGradReducer::LayerBackwardDone(int layer) {
  for (const GradBuffers::Bucket* k : layer_buckets_) {
    if (k->bucket.first_layer != layer) continue;
    // Gloo's reduce-scatter is an all-reduce underneath: the same sums, and the part is used.
    if (dp_->size() > 1) dp_->AllReduceSum(k->at, k->bucket.numel);
    if (k->part_end > k->part_begin)
      ops_->AddInPlace(k->sum, k->at + (k->part_begin - k->bucket.offset),
                       k->part_end - k->part_begin);
  }
  Prepare(layer - 1);
}

}  // namespace leantron::trainer
