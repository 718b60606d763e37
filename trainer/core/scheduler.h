// Megatron's OptimizerParamScheduler learning-rate rule (warm-up, then constant, linear, cosine or
// WSD decay to min_lr), as a pure function of the iteration: resuming needs no scheduler state.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace leantron::trainer {

enum class DecayStyle { kConstant, kLinear, kCosine, kWsd };
enum class WsdDecayStyle { kLinear, kCosine, kExponential, kMinusSqrt };

struct LrSchedule {
  double max_lr = 0.0;
  double min_lr = 0.0;
  double init_lr = 0.0;  // warm-up starts here (Megatron's --lr-warmup-init)
  int64_t warmup_iters = 0;
  int64_t decay_iters = 0;  // Megatron: --lr-decay-iters, default --train-iters
  DecayStyle style = DecayStyle::kLinear;
  int64_t wsd_decay_iters = 0;
  WsdDecayStyle wsd_style = WsdDecayStyle::kExponential;

  // The learning rate after `steps` optimizer steps (Megatron counts in samples; the ratios are
  // the same in iterations).
  double At(int64_t steps) const;
};

absl::StatusOr<DecayStyle> ParseDecayStyle(const std::string& s);
absl::StatusOr<WsdDecayStyle> ParseWsdDecayStyle(const std::string& s);

}  // namespace leantron::trainer
