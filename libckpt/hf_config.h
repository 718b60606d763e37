// HuggingFace config.json for GPT2LMHeadModel and LlamaForCausalLM, to and from ModelConfig
// (spec §3-4).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "libckpt/model_config.h"

namespace leantron::ckpt {

enum class HfArchitecture { kGpt2, kLlama };

struct HfModelInfo {
  HfArchitecture architecture = HfArchitecture::kGpt2;
  ModelConfig config;
  // Kept verbatim (JSON text) so an export restores them; empty when absent.
  std::string bos_token_id_json;
  std::string eos_token_id_json;
};

// Reads config.json. `params_dtype` is not taken from it (the tensors decide).
absl::StatusOr<HfModelInfo> ParseHfConfig(std::string_view json, std::string_view source);
// Which HF class can hold `config`; refuses configs neither can represent.
absl::StatusOr<HfArchitecture> HfArchitectureFor(const ModelConfig& config);
std::string HfConfigJson(const HfModelInfo& info);

}  // namespace leantron::ckpt
