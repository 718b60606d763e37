// Data-parallel communication of the bf16 model, on a communication stream beside the compute:
//   gradients: the flat fp32 gradient is reduced bucket by bucket (trainer/params.h DpBucket) on
//   the step's last micro-batch; with --overlap-grad-reduce while the backward goes on with the
//   layers below a bucket's lowest layer, otherwise all at the end. Overlapped, the buckets start
//   as late as still lets the reduction end with the backward (DpReduceStartLayer: a reduction
//   slows the compute beside it for as long as it runs, not by its bytes): the first step each as
//   soon as its layers are done; from then on, planned from the step before, those above the
//   start layer wait until the backward has finished it. Summed everywhere (all-reduce), or with
//   the distributed optimizer only into the part of each bucket this rank owns (reduce-scatter).
//   The compute stream waits for the last bucket only when the backward is done; that wait is the
//   exposed part of the communication, measured with events and reported per step. With
//   reduce_in_bf16 (--grad-reduce-in-bf16) what crosses is each rank's gradient rounded to bf16,
//   summed and rounded to bf16 again (half the bytes of fp32); every rank keeps that sum, in fp32.
//   parameters (distributed optimizer): after the step every rank holds its parts of the fp32
//   weights (and of the bf16 copy) stepped; GatherParams sends them to the other ranks, buckets
//   in the forward's order, converting what arrives to bf16, and WaitParams makes the forward
//   wait for a layer's bucket only (--overlap-param-gather), or for all of them at once. With the
//   fp32 weights sharded (ParamStore kSharded: no `data`) the parts of the bf16 copy go as they
//   are, and the fp32 ones only for the tensors the model reads in fp32 (the store's mirror).
//   sharded gradients (--data-parallel-sharding-strategy optim_grads; GradBuffers): the layer
//   buckets live in slots that two buckets take turns in. Every micro-batch's backward zeroes a
//   bucket's slot just before it writes the first gradient there (the compute stream waiting
//   until the slot's previous bucket has been summed), and reduces the bucket as soon as its
//   layers are done, whatever --overlap-grad-reduce says, adding this rank's part to the step's
//   sum. The embeddings' and head's buckets are reduced on the last micro-batch, as whole ones.
//   With one data-parallel rank there is nothing to sum with; the parts are still added.
// Two data-parallel ranks of one node move the data by copy engine (PeerExchange; no SM taken
// from the compute except for the additions), unless options.copy_engine is off (then NCCL, as
// for more ranks or several nodes).
// It is not part of the model: it listens to the model's events (core/model_events.h) — a layer's
// backward is done, a layer's weights are needed, a step begins.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/core/grad_buffers.h"
#include "trainer/core/model_events.h"
#include "trainer/core/params.h"
#include "trainer/cuda/cuda_util.h"
#include "trainer/cuda/parallel/peer_exchange.h"
#include "trainer/dist/nccl_comm.h"

namespace leantron::trainer::cuda {

// The communication stream of data-parallel group `group` (null: one rank), one per group and
// shared by everything that issues its collectives: NCCL calls on one communicator must run in the
// order every rank issued them, which two streams would not guarantee.
std::shared_ptr<cudaStream_t> DataParallelStream(NcclCommunicator* group);

class GradReducer final : public ModelEvents {
 public:
  struct Options {
    bool overlap_grad_reduce = false;
    bool distributed = false;           // reduce-scatter gradients, gather parameters
    bool overlap_param_gather = false;  // wait per layer in the forward
    bool reduce_in_bf16 = false;
    bool copy_engine = true;  // two ranks of one node: by copy engine, else NCCL
    // Micro-batches per step: the reduction runs during the last one's backward.
    int num_micro_batches = 1;
    int first_layer = 0;  // the chunk's first global layer (for the report)
    // Fixed instead of planned (tests): the layer whose end starts the held-back buckets, -1 none.
    std::optional<int> start_layer;
    // The gradients are these sharded ones (`grad` is not used; needs `distributed`).
    const GradBuffers* sharded_grads = nullptr;
  };
  // `grad`, `data` and `low` (the bf16 copy) are the flat buffers the buckets index; `data` is
  // null where the fp32 weights are on the host or sharded. `dp` may be null (one rank) only
  // with sharded gradients.
  GradReducer(NcclCommunicator* dp, float* grad, float* data, bf16* low,
              std::vector<DpBucket> buckets, const Options& options);
  ~GradReducer() override;
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;
  // After a distributed-optimizer step (a new weights_version() that is not a rewrite) StepBegins
  // gathers the other ranks' parts; without `params` it never does.
  void Follow(const ParamStore* params) { params_ = params; }

  // ModelEvents.
  void StepBegins() override;
  void WeightsNeeded(int layer) override { WaitParams(layer); }
  void BackwardBegins() override;
  void LayerBackwardDone(int layer) override;
  void BackwardDone() override;
  std::string Report() const override;
  double ExposedMsPerStep() const override {
    return measured_steps_ > 0 ? exposed_ms_ / measured_steps_ : 0.0;
  }

  // Milliseconds of the last step: reduction time on the communication stream, and how long the
  // compute stream had to wait for it after the backward (call after the step has finished).
  // Plans the next step's start from the last one (collective over the data-parallel group).
  void LastStep(double* comm_ms, double* exposed_ms);
  // The planned start: the layer whose end starts the buckets (-1: each when ready) and how much
  // of the backward was left after it in the measured step.
  int start_layer() const { return start_layer_; }
  double start_left_ms() const { return start_left_ms_; }

  // Distributed optimizer: starts gathering the stepped parts (after the work on the compute
  // stream so far); without overlap the compute stream waits for all of it at once.
  void GatherParams();
  // The compute stream waits for the gathered weights of chunk layer `layer`, or with layer < 0
  // for the embeddings, final norm and output layer. Nothing once the step's forward has them.
  void WaitParams(int layer);
  // How gradients move: "copy engine" or "NCCL".
  const char* transport() const { return exchange_ != nullptr ? "copy engine" : "NCCL"; }

 private:
  void Launch(size_t bucket);
  void PrepareSlot(int layer);
  int size() const { return dp_ != nullptr ? dp_->size() : 1; }
  // Where the gradient of flat index `flat` of bucket `b` is.
  float* Grad(const DpBucket& b, size_t flat) const {
    return opt_.sharded_grads != nullptr ? opt_.sharded_grads->At(b.offset) + (flat - b.offset)
                                         : grad_ + flat;
  }
  // The sharded gradients' bucket `i` when it lives in a slot, else null.
  const GradBuffers::Bucket* InSlot(size_t i) const {
    return !place_.empty() && place_[i]->slot >= 0 ? place_[i] : nullptr;
  }
  void Plan();
  void CopyEngineAllReduce(const DpBucket& b);
  void CopyEngineReduceScatter(const DpBucket& b);
  void NcclReduce(const DpBucket& b);
  void SendGrad(const DpBucket& b, size_t first, size_t len);
  void AddArrived(const DpBucket& b, size_t first, size_t len, bool stage_sum);
  bf16* Stage(size_t first, const DpBucket& b) const { return stage_ + (first - b.offset); }
  void Gather(const DpBucket& b);
  NcclCommunicator* dp_;
  float* grad_;
  float* data_;
  bf16* low_;
  std::vector<DpBucket> buckets_;
  Options opt_;
  const ParamStore* params_ = nullptr;
  uint64_t weights_seen_ = 0;  // params_->weights_version() at the last StepBegins
  int backwards_ = 0;          // this step
  bool active_ = false;        // the step's last backward: the one that reduces
  bool measured_ = false;      // a reduction ran since LastStep
  int64_t measured_steps_ = 0;
  double comm_ms_ = 0.0, exposed_ms_ = 0.0;  // summed over the measured steps
  // One communication stream per DP group, shared by the model chunks' reducers: NCCL calls on
  // one communicator must run in the order every rank issued them, which two streams would not
  // guarantee.
  std::shared_ptr<cudaStream_t> stream_;
  cudaStream_t comm_ = nullptr;
  cudaEvent_t ready_ = nullptr, comm_start_ = nullptr, compute_done_ = nullptr,
              comm_done_ = nullptr;
  bool started_ = false;
  int start_layer_ = -1;
  double start_left_ms_ = 0.0;
  std::vector<bool> launched_;                          // per bucket, this backward
  std::vector<cudaEvent_t> layer_done_;                 // per chunk layer, on the compute stream
  int layers_recorded_ = 0;                             // layer_done_ recorded this backward
  std::vector<cudaEvent_t> bucket_begin_, bucket_end_;  // per bucket, on comm_
  float* plan_buf_ = nullptr;                           // the reduction time, shared by the ranks
  std::vector<cudaEvent_t> gathered_;                   // per bucket
  std::vector<bool> gather_pending_;                    // per bucket: not waited for yet this step
  std::unique_ptr<PeerExchange> exchange_;
  std::vector<const GradBuffers::Bucket*> place_;    // sharded gradients: per bucket
  cudaEvent_t slot_free_[GradBuffers::kSlots] = {};  // recorded on comm_ when a slot is summed
  bf16* stage_ = nullptr;  // reduce_in_bf16: the bucket's gradient rounded to bf16 (largest bucket)
  // Elements reduced per copy-engine round (the inbox holds half of it twice: 64 MiB each).
  static constexpr size_t kPieceElements = size_t{32} << 20;
};

}  // namespace leantron::trainer::cuda
