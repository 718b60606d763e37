// Copies of weights in another format that a model keeps and that the optimizer's step writes in
// the same pass as the update (the bf16 model's FP8 weights under delayed scaling), instead of the
// model casting them again from the bf16 copy before their next use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "trainer/core/adamw.h"

namespace leantron::trainer {

class StepCopies {
 public:
  virtual ~StepCopies() = default;
  // Whole weights [offset, offset + numel) of the ParamStore's flat buffer, whose copies Update
  // writes. The optimizer steps through Update those that lie inside what it steps on this rank
  // (all of them without the distributed optimizer and without offload); the model keeps casting
  // the others itself.
  virtual std::vector<std::pair<size_t, size_t>> CopiedWeights() const = 0;
  // Once per step that changes the weights, before the first of them changes (skipped steps do
  // not call it), whether or not any Update follows.
  virtual void WeightsWillStep() = 0;
  // AdamW (adamw.h's update, with these constants) of CopiedWeights()[i] from its fp32 values,
  // gradient and moments, writing the bf16 copy `bf16_out` and the model's own copies.
  virtual void Update(size_t i, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                      const AdamWConstants& c, uint16_t* bf16_out) = 0;
};

}  // namespace leantron::trainer
