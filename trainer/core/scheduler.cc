#include "trainer/core/scheduler.h"

#include <cmath>

#include "absl/status/status.h"

namespace leantron::trainer {

double LrSchedule::At(int64_t steps) const {
  if (warmup_iters > 0 && steps <= warmup_iters)
    return init_lr + (max_lr - init_lr) * static_cast<double>(steps) / warmup_iters;
  if (style == DecayStyle::kConstant) return max_lr;
  if (steps > decay_iters) return min_lr;
  const double delta = max_lr - min_lr;
  double coeff = 0.0;
  if (style == DecayStyle::kWsd) {
    const int64_t anneal_start = decay_iters - wsd_decay_iters;
    if (steps <= anneal_start) {
      coeff = 1.0;
    } else {
      const double r = static_cast<double>(steps - anneal_start) / wsd_decay_iters;
      switch (wsd_style) {
        case WsdDecayStyle::kLinear:
          coeff = 1.0 - r;
          break;
        case WsdDecayStyle::kCosine:
          coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
          break;
        case WsdDecayStyle::kExponential:
          coeff = std::pow(0.5, r);
          break;
        case WsdDecayStyle::kMinusSqrt:
          coeff = 1.0 - std::sqrt(r);
          break;
      }
    }
    return min_lr + coeff * delta;
  }
  const double ratio =
      static_cast<double>(steps - warmup_iters) / static_cast<double>(decay_iters - warmup_iters);
  coeff = style == DecayStyle::kLinear ? 1.0 - ratio : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return min_lr + coeff * delta;
}

absl::StatusOr<DecayStyle> ParseDecayStyle(const std::string& s) {
  if (s == "constant") return DecayStyle::kConstant;
  if (s == "linear") return DecayStyle::kLinear;
  if (s == "cosine") return DecayStyle::kCosine;
  if (s == "WSD") return DecayStyle::kWsd;
  return absl::InvalidArgumentError(
      "--lr-decay-style must be constant, linear, cosine or WSD, not '" + s + "'");
}

absl::StatusOr<WsdDecayStyle> ParseWsdDecayStyle(const std::string& s) {
  if (s == "linear") return WsdDecayStyle::kLinear;
  if (s == "cosine") return WsdDecayStyle::kCosine;
  if (s == "exponential") return WsdDecayStyle::kExponential;
  if (s == "minus_sqrt") return WsdDecayStyle::kMinusSqrt;
  return absl::InvalidArgumentError(
      "--lr-wsd-decay-style must be linear, cosine, exponential or minus_sqrt, not '" + s + "'");
}

}  // namespace leantron::trainer
