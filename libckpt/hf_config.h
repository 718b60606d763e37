// HuggingFace config.json for GPT2LMHeadModel, LlamaForCausalLM (Llama 2, 3, 3.1 with its
// "llama3" rope scaling, 3.2 tied), MistralForCausalLM (without a sliding window) and
// Qwen2ForCausalLM (QKV biases), to and from ModelConfig (spec §3-4).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "libckpt/model_config.h"

namespace leantron::ckpt {

struct HfModelInfo {
  ModelConfig config;  // config.hf_architecture: the class config.json names.
  // Kept verbatim (JSON text) so an export restores them; empty when absent.
  std::string bos_token_id_json;
  std::string eos_token_id_json;
};

// Reads config.json. `params_dtype` is not taken from it (the tensors decide). What the trainer
// does not compute (a sliding window, a rope scaling other than llama3, biases Megatron has no
// place for) is refused with the field named, never carried along and ignored.
absl::StatusOr<HfModelInfo> ParseHfConfig(std::string_view json, std::string_view source);
// The HF class `config` converts to: the one it records if the model fits that class, else the
// one its shape implies (GPT-2: learned positions, LayerNorm, GELU, biases, MHA; Llama: RoPE,
// RMSNorm, SwiGLU, no biases; Qwen2: the same with QKV biases). Refuses what none can hold.
absl::StatusOr<HfArchitecture> HfArchitectureFor(const ModelConfig& config);
// config.json for info.config, whose hf_architecture must be set (HfArchitectureFor).
std::string HfConfigJson(const HfModelInfo& info);

}  // namespace leantron::ckpt
