// The model hyper-parameters a checkpoint needs to name, shape and convert its tensors. Field names
// follow Megatron-LM's arguments so a Megatron user recognises them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libckpt/dtype.h"

namespace leantron::ckpt {

enum class NormType { kLayerNorm, kRMSNorm };
// kGelu is erf GELU (Megatron's default); kGeluTanh is GPT-2's "gelu_new" (--openai-gelu);
// kSwiGLU is silu(gate) * up with linear_fc1 holding gate rows then up rows.
enum class Activation { kGelu, kGeluTanh, kSwiGLU };
enum class PositionEmbedding { kLearnedAbsolute, kRope };

// Scaling of the rotary frequencies. Llama 3.1's ("rope_type": "llama3" in HF, Megatron's
// --use-rope-scaling): wavelengths longer than original/low_freq_factor are divided by `factor`,
// shorter than original/high_freq_factor kept, those between interpolated smoothly.
struct RopeScaling {
  bool llama3 = false;
  double factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  bool operator==(const RopeScaling&) const = default;
};

// The HuggingFace class a checkpoint came from and converts back to (config.json's
// "architectures"). kUnset: not recorded (a model trained here); export then picks the class by
// the model's shape (HfArchitectureFor in hf_config.h).
enum class HfArchitecture { kUnset, kGpt2, kLlama, kMistral, kQwen2 };

struct ModelConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;  // == num_attention_heads without grouped-query attention.
  int64_t kv_channels = 0;       // Head dimension.
  int64_t vocab_size = 0;        // True vocabulary size, before padding.
  int64_t max_position_embeddings = 0;
  int64_t make_vocab_size_divisible_by = 128;
  NormType normalization = NormType::kLayerNorm;
  double norm_epsilon = 1e-5;
  Activation activation = Activation::kGelu;
  PositionEmbedding position_embedding_type = PositionEmbedding::kLearnedAbsolute;
  double rotary_base = 10000.0;
  RopeScaling rope_scaling;
  bool add_bias_linear = true;  // Biases on linear_proj / linear_fc1 / linear_fc2.
  bool add_qkv_bias = true;     // Bias on linear_qkv.
  bool untie_embeddings_and_output_weights = false;
  DType params_dtype = DType::kF32;
  // Where the weights came from; changes nothing the trainer computes (Mistral without a sliding
  // window is Llama), only what `convert_hf --to-hf` writes.
  HfArchitecture hf_architecture = HfArchitecture::kUnset;

  bool swiglu() const { return activation == Activation::kSwiGLU; }
  bool has_norm_bias() const { return normalization == NormType::kLayerNorm; }
};

// GPT-2 style: learned positions, LayerNorm, tanh GELU, biases, tied embeddings.
ModelConfig Gpt2StyleConfig(int64_t num_layers, int64_t hidden_size, int64_t num_heads,
                            int64_t vocab_size, int64_t max_positions);
// Llama style: RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied.
ModelConfig LlamaStyleConfig(int64_t num_layers, int64_t hidden_size, int64_t ffn_hidden_size,
                             int64_t num_heads, int64_t num_query_groups, int64_t vocab_size,
                             int64_t max_positions);

// Internal consistency (positive sizes, heads divisible by groups, ...), independent of layout.
absl::Status ValidateModelConfig(const ModelConfig& config);

std::string_view NormTypeName(NormType type);
std::string_view ActivationName(Activation activation);
std::string_view PositionEmbeddingName(PositionEmbedding type);
// "GPT2LMHeadModel", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"; "" for kUnset.
std::string_view HfArchitectureName(HfArchitecture architecture);
// The inverse for the four names; nullopt for anything else (kUnset included).
std::optional<HfArchitecture> ParseHfArchitecture(std::string_view name);

// One JSON object (the "model" entry of a checkpoint's metadata.json).
std::string ModelConfigToJson(const ModelConfig& config);
absl::StatusOr<ModelConfig> ModelConfigFromJson(std::string_view json);

}  // namespace leantron::ckpt
