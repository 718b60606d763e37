// The parts of a Megatron `--ckpt-format torch` checkpoint that come from the run's arguments
// rather than its tensors (megatron_writer.h): the `args` argparse.Namespace, the optimizer's two
// param groups and the OptimizerParamScheduler state, pickled from the saved arguments (JSON) with
// the model and layout overridden by what the checkpoint holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "libckpt/checkpoint_metadata.h"
#include "libckpt/layout.h"
#include "libckpt/pickle_writer.h"
#include "simdjson.h"

namespace leantron::ckpt {

// Megatron's arguments as plain JSON values, for the Namespace and the scheduler.
class MegatronArgs {
 public:
  explicit MegatronArgs(const std::string& json) {
    ok_ = parser_.parse(json).get(object_) == simdjson::SUCCESS;
  }
  std::optional<double> Number(const char* key) const {
    simdjson::dom::element e;
    if (!ok_ || object_[key].get(e) != simdjson::SUCCESS) return std::nullopt;
    double d;
    if (e.get(d) == simdjson::SUCCESS) return d;
    int64_t i;
    if (e.get(i) == simdjson::SUCCESS) return static_cast<double>(i);
    return std::nullopt;
  }
  std::optional<std::string> String(const char* key) const {
    simdjson::dom::element e;
    std::string_view s;
    if (!ok_ || object_[key].get(e) != simdjson::SUCCESS || e.get(s) != simdjson::SUCCESS) {
      return std::nullopt;
    }
    return std::string(s);
  }
  const simdjson::dom::object& object() const { return object_; }
  bool ok() const { return ok_; }

 private:
  simdjson::dom::parser parser_;
  simdjson::dom::object object_;
  bool ok_ = false;
};

// The `args` Namespace: every saved argument, the model's and layout's set from `m` and `layout`.
void EmitMegatronArgs(PickleWriter& p, const MegatronArgs& args, const CheckpointMetadata& m,
                      const ModelLayout& layout, bool distributed_optimizer);
// Megatron's two param groups (weight decay on, off) as torch AdamW keeps them, plus Megatron's
// group keys; `params` the state indices (nullptr for the distributed optimizer, which saves the
// step in each group instead).
void EmitMegatronParamGroups(PickleWriter& p, const MegatronArgs& args, int64_t step,
                             const std::vector<std::vector<int64_t>>* params);
// OptimizerParamScheduler.state_dict() as Megatron's get_optimizer_param_scheduler sets it up.
void EmitMegatronScheduler(PickleWriter& p, const MegatronArgs& args, const CheckpointMetadata& m);

}  // namespace leantron::ckpt
