// Gradient reduction and AdamW over the flat buffers.
//   Finalize: sequence-parallel partial gradients summed over TP, the tied embedding copies'
//   gradients summed over the first and last stage, then the sum over data × context parallel
//   ranks in buckets (unless the model has summed them already, overlapped with its backward).
//   Step: the true global gradient norm (each parameter counted once, whatever its sharding),
//   NaN/Inf → skip, then AdamW (no decay on biases and norms) with fp32 main weights on the
//   gradient times 1/DP and the clipping coefficient (one multiply inside the update, no separate
//   pass), writing the model's bf16 copy beside. With the distributed optimizer (ZeRO-1) each
//   rank of the data × context parallel group (Megatron shards over the data-parallel group with
//   context parallel) keeps Adam moments for, and steps, only its part of every bucket (DpOwned-
//   Parts); the parts are then broadcast, or gathered by the model overlapped with the next
//   forward. The bf16 model's store keeps only those parts of the fp32 weights too (ParamStore
//   kSharded, as Megatron's); what is gathered is then the bf16 copy and the fp32 mirror.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "trainer/core/host_adamw.h"
#include "trainer/core/params.h"
#include "trainer/core/step_copies.h"
#include "trainer/dist/process_groups.h"
#include "trainer/reference/ops.h"

namespace leantron::trainer {

struct OptimizerOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.01f;
  float clip_grad = 1.0f;  // 0 disables clipping
  bool distributed = false;
  // The data-parallel buckets of this rank's buffers (every model chunk's PlanDpBuckets). Empty:
  // the whole buffer is one bucket.
  std::vector<DpBucket> buckets;
  // A gradient reducer listening to the models (GPU) has already summed the gradient over DP,
  // overlapped with the backward, and with the distributed optimizer it gathers the stepped parts
  // itself before the next forward.
  bool dp_by_reducer = false;
  // Elements of the flat order GatherState assembles at a time (64 MiB of floats).
  size_t gather_window = size_t{16} << 20;
  // --optimizer-cpu-offload: the moments and the step on the host (HostAdamW), over a ParamStore
  // with its master weights on the host (kHost; with --optimizer-offload-fraction below 1 those
  // from its host_begin() on, the backend stepping the rest), with `host_threads` threads. Not
  // with the distributed optimizer's parts (DP × CP > 1).
  bool cpu_offload = false;
  int host_threads = 1;
  // The offloaded step runs beside what the caller issues next (the next forward): Step returns
  // once it has started, the model's listeners (HostStepWaits) make each layer wait for its own
  // weights and call FinishHostStep before the first gradient is written; ZeroGrad's zeroing
  // waits until then.
  bool overlap_host_step = false;
  size_t offload_piece = HostAdamW::kPiece;  // gradient elements moved down at a time
};

struct StepResult {
  double grad_norm = 0.0;  // before clipping
  bool skipped = false;    // NaN/Inf gradient: no update
};

class Optimizer {
 public:
  Optimizer(Ops* ops, ParamStore* params, ProcessGroups* groups, const OptimizerOptions& options);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Zeroes the gradients (with an overlapped host step under way, once FinishHostStep has run).
  void ZeroGrad();
  void FinalizeGrads();
  StepResult Step(float lr);
  // With an overlapped host step (overlap_host_step) under way: backend work issued later waits
  // for the new weights in [0, end) of the flat buffers (blocking until the step has queued
  // them), or FinishHostStep for all of it, after which the deferred zeroing of the gradients
  // runs. Nothing to do otherwise.
  void WaitHostWeights(size_t end);
  void FinishHostStep();
  // A model's copies of weights that the step writes as it updates them (step_copies.h), told of
  // every step that changes the weights.
  void AddStepCopies(StepCopies* copies);

  int64_t step() const { return step_; }
  size_t state_elements() const { return state_elements_; }  // per Adam moment, on this rank
  // Of them, those on the host (offloaded).
  size_t host_state_elements() const { return host_ ? state_elements_ - host_begin_ : 0; }
  bool state_on_host() const { return host_ != nullptr; }
  int host_threads() const { return host_ ? host_->threads() : 0; }
  // Mean milliseconds per offloaded step: the whole of it, and the host threads' stepping.
  double host_step_ms() const { return host_ ? host_->step_ms() : 0.0; }
  double host_compute_ms() const { return host_ ? host_->compute_ms() : 0.0; }
  // Mean milliseconds per step the caller blocked for the overlapped host step.
  double host_waited_ms() const { return host_ ? host_->waited_ms() : 0.0; }
  bool host_step_overlapped() const { return host_ != nullptr && opt_.overlap_host_step; }
  void set_step(int64_t s) { step_ = s; }
  // Makes every DP rank's fp32 weights whole again where the model gathers only before its next
  // forward (collective over DP × CP; nothing to do otherwise). Before reading them, as a save
  // does.
  void GatherParams();
  // The whole fp32 weights of this rank's (tp, pp) shard in host memory, in the flat order: with
  // the weights sharded (ParamStore kSharded) gathered from every DP × CP rank's part, bit for
  // bit; otherwise after GatherParams, the store's copy. Collective over DP × CP; a rank that
  // does not need them passes null.
  void GatherMaster(std::vector<float>* out);
  // Adam moments for the whole of this rank's (tp, pp) shard, in the ParamStore's flat order. With
  // the distributed optimizer these gather every DP × CP rank's slice (collective over DP × CP);
  // a rank that does not need them passes null for both.
  void GatherState(std::vector<float>* exp_avg, std::vector<float>* exp_avg_sq);
  // Sets the moments from whole-shard arrays (each DP rank keeps its slice).
  void ScatterState(const std::vector<float>& exp_avg, const std::vector<float>& exp_avg_sq);
  // Sets the moments of flat range [begin, end) from arrays holding just that range (each DP rank
  // keeps what it owns of it): a load tensor by tensor, never the whole shard in host memory.
  void SetState(size_t begin, size_t end, const float* exp_avg, const float* exp_avg_sq);
  // Where the moments are whole in host memory in the flat order (the offloaded step): true with
  // pointers to them, to read or write in place; false otherwise (use GatherState/ScatterState).
  bool HostState(float** exp_avg, float** exp_avg_sq);

 private:
  Communicator& dp_cp() const { return groups_->data_parallel_with_cp(); }
  bool sharded() const { return opt_.distributed && dp_cp().size() > 1; }
  // Each bucket's part owned by DP rank r broadcast from it: the fp32 weights, or with them
  // sharded the bf16 copy and the mirror.
  void BroadcastParts();

  Ops* ops_;
  ParamStore* params_;
  ProcessGroups* groups_;
  OptimizerOptions opt_;
  // The flat ranges this rank steps (all of it, or its part of every bucket), in flat order, and
  // where each one's moments start in exp_avg_/exp_avg_sq_.
  struct Owned {
    size_t begin, end, state;
  };
  std::vector<Owned> owned_;
  size_t state_elements_ = 0;
  float* exp_avg_ = nullptr;  // backend memory (offloaded: [0, host_begin_) only; or none)
  float* exp_avg_sq_ = nullptr;
  std::unique_ptr<HostAdamW> host_;
  std::vector<std::pair<size_t, size_t>> norm_ranges_;  // counted in the gradient norm
  std::vector<AdamRange> adam_ranges_;  // the owned ranges the backend steps, by weight decay
  std::vector<AdamRange> host_ranges_;  // those the host steps (offloaded), moments from 0
  // The moments on the backend: [0, host_begin_) of the flat order where the host steps the
  // rest (offloaded), else all state_elements_.
  size_t host_begin_ = 0;
  // Weights inside one adam range whose update a StepCopies writes, sorted by `begin`.
  struct Copied {
    size_t begin, end;
    StepCopies* copies;
    size_t index;  // in copies->CopiedWeights()
  };
  std::vector<StepCopies*> step_copies_;
  std::vector<Copied> copied_;
  bool params_partial_ = false;  // only the owned parts are current (the model gathers)
  bool zero_pending_ = false;    // ZeroGrad came while the host step was under way
  int64_t step_ = 0;
};

}  // namespace leantron::trainer
