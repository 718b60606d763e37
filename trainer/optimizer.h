// Gradient reduction and AdamW over the flat buffers.
//   Finalize: sequence-parallel partial gradients summed over TP, the tied embedding copies'
//   gradients summed over the first and last stage, then data-parallel averaging in buckets
//   (all-reduce, or reduce-scatter with the distributed optimizer).
//   Step: the true global gradient norm (each parameter counted once, whatever its sharding),
//   NaN/Inf → skip, clipping, AdamW (no decay on biases and norms) with fp32 main weights, and with
//   the distributed optimizer (ZeRO-1) each DP rank stepping only its slice, then all-gathering.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "trainer/comm.h"
#include "trainer/ops.h"
#include "trainer/params.h"

namespace leantron::trainer {

struct OptimizerOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.01f;
  float clip_grad = 1.0f;  // 0 disables clipping
  bool distributed = false;
  int64_t bucket_elements = 40000000;  // Megatron's default DDP bucket size
  // The model has already summed the gradient over DP (overlapped with its backward): only the
  // averaging is left.
  bool dp_reduced_by_model = false;
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

  void ZeroGrad();
  void FinalizeGrads();
  StepResult Step(float lr);

  int64_t step() const { return step_; }
  size_t state_elements() const { return end_ - begin_; }  // per Adam moment, on this rank
  void set_step(int64_t s) { step_ = s; }
  // Adam moments for the whole of this rank's (tp, pp) shard, in the ParamStore's flat order. With
  // the distributed optimizer these gather every DP rank's slice (collective over DP).
  void GatherState(std::vector<float>* exp_avg, std::vector<float>* exp_avg_sq);
  // Sets the moments from whole-shard arrays (each DP rank keeps its slice).
  void ScatterState(const std::vector<float>& exp_avg, const std::vector<float>& exp_avg_sq);

 private:
  // [begin, end) of the flat buffer this rank updates.
  size_t begin_ = 0, end_ = 0;
  Ops* ops_;
  ParamStore* params_;
  ProcessGroups* groups_;
  OptimizerOptions opt_;
  float* exp_avg_ = nullptr;  // [end_ - begin_]
  float* exp_avg_sq_ = nullptr;
  size_t slice_ = 0;  // per-DP-rank slice length (distributed; last slices may be shorter)
  struct Range {
    size_t begin, end;
    bool decay;
  };
  std::vector<std::pair<size_t, size_t>> norm_ranges_;  // counted in the gradient norm
  std::vector<Range> adam_ranges_;                      // this rank's slice, by weight decay
  int64_t step_ = 0;
};

}  // namespace leantron::trainer
