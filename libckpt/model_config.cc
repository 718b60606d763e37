#include "libckpt/model_config.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "libckpt/strings.h"
#include "simdjson.h"

namespace leantron::ckpt {

ModelConfig Gpt2StyleConfig(int64_t num_layers, int64_t hidden_size, int64_t num_heads,
                            int64_t vocab_size, int64_t max_positions) {
  ModelConfig c;
  c.num_layers = num_layers;
  c.hidden_size = hidden_size;
  c.ffn_hidden_size = 4 * hidden_size;
  c.num_attention_heads = num_heads;
  c.num_query_groups = num_heads;
  c.kv_channels = num_heads > 0 ? hidden_size / num_heads : 0;  // Validation refuses 0 heads.
  c.vocab_size = vocab_size;
  c.max_position_embeddings = max_positions;
  c.normalization = NormType::kLayerNorm;
  c.norm_epsilon = 1e-5;
  c.activation = Activation::kGeluTanh;
  c.position_embedding_type = PositionEmbedding::kLearnedAbsolute;
  c.add_bias_linear = true;
  c.add_qkv_bias = true;
  c.untie_embeddings_and_output_weights = false;
  return c;
}

ModelConfig LlamaStyleConfig(int64_t num_layers, int64_t hidden_size, int64_t ffn_hidden_size,
                             int64_t num_heads, int64_t num_query_groups, int64_t vocab_size,
                             int64_t max_positions) {
  ModelConfig c;
  c.num_layers = num_layers;
  c.hidden_size = hidden_size;
  c.ffn_hidden_size = ffn_hidden_size;
  c.num_attention_heads = num_heads;
  c.num_query_groups = num_query_groups;
  c.kv_channels = num_heads > 0 ? hidden_size / num_heads : 0;  // Validation refuses 0 heads.
  c.vocab_size = vocab_size;
  c.max_position_embeddings = max_positions;
  c.normalization = NormType::kRMSNorm;
  c.norm_epsilon = 1e-5;
  c.activation = Activation::kSwiGLU;
  c.position_embedding_type = PositionEmbedding::kRope;
  c.add_bias_linear = false;
  c.add_qkv_bias = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  // Bounded so that no shape product computed from them overflows int64.
  constexpr int64_t kMax = int64_t{1} << 31;
  auto positive = [&](int64_t v, const char* name) -> absl::Status {
    if (v <= 0) return absl::InvalidArgumentError(Cat("model config: ", name, " must be positive"));
    if (v > kMax) {
      return absl::InvalidArgumentError(Cat("model config: ", name, " ", v, " exceeds ", kMax));
    }
    return absl::OkStatus();
  };
  for (auto [v, name] : {std::pair{c.num_layers, "num_layers"},
                         {c.hidden_size, "hidden_size"},
                         {c.ffn_hidden_size, "ffn_hidden_size"},
                         {c.num_attention_heads, "num_attention_heads"},
                         {c.num_query_groups, "num_query_groups"},
                         {c.kv_channels, "kv_channels"},
                         {c.vocab_size, "vocab_size"},
                         {c.make_vocab_size_divisible_by, "make_vocab_size_divisible_by"}}) {
    if (auto s = positive(v, name); !s.ok()) return s;
  }
  if (c.position_embedding_type == PositionEmbedding::kLearnedAbsolute) {
    if (auto s = positive(c.max_position_embeddings, "max_position_embeddings"); !s.ok()) return s;
  } else if (c.max_position_embeddings < 0 || c.max_position_embeddings > kMax) {
    return absl::InvalidArgumentError("model config: max_position_embeddings out of range");
  }
  if (c.num_attention_heads % c.num_query_groups != 0) {
    return absl::InvalidArgumentError(Cat("model config: ", c.num_attention_heads,
                                          " attention heads are not divisible into ",
                                          c.num_query_groups, " query groups"));
  }
  // Written into metadata.json and config.json: NaN or infinity would not even be JSON, and -0
  // would come back as 0 (JSON's integer -0).
  if (!std::isfinite(c.norm_epsilon) || std::signbit(c.norm_epsilon)) {
    return absl::InvalidArgumentError(
        Cat("model config: norm_epsilon ", c.norm_epsilon, " is not a finite number >= 0"));
  }
  if (!std::isfinite(c.rotary_base) || c.rotary_base <= 0) {
    return absl::InvalidArgumentError(
        Cat("model config: rotary_base ", c.rotary_base, " is not a finite number > 0"));
  }
  if (const RopeScaling& r = c.rope_scaling; r.llama3) {
    if (!std::isfinite(r.factor) || r.factor <= 0 || !std::isfinite(r.low_freq_factor) ||
        !std::isfinite(r.high_freq_factor) || r.low_freq_factor <= 0 ||
        r.high_freq_factor <= r.low_freq_factor || r.original_max_position_embeddings <= 0 ||
        r.original_max_position_embeddings > kMax) {
      return absl::InvalidArgumentError(
          Cat("model config: llama3 rope_scaling needs factor > 0, 0 < low_freq_factor < "
              "high_freq_factor and original_max_position_embeddings > 0 (got ",
              r.factor, ", ", r.low_freq_factor, ", ", r.high_freq_factor, ", ",
              r.original_max_position_embeddings, ")"));
    }
  }
  if (DTypeSize(c.params_dtype) == 0) {
    return absl::InvalidArgumentError("model config: params_dtype must be a whole-byte type");
  }
  return absl::OkStatus();
}

std::string_view NormTypeName(NormType type) {
  return type == NormType::kLayerNorm ? "LayerNorm" : "RMSNorm";
}

std::string_view ActivationName(Activation activation) {
  switch (activation) {
    case Activation::kGelu:
      return "gelu";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kSwiGLU:
      return "swiglu";
  }
  return "";
}

std::string_view PositionEmbeddingName(PositionEmbedding type) {
  return type == PositionEmbedding::kLearnedAbsolute ? "learned_absolute" : "rope";
}

std::string_view HfArchitectureName(HfArchitecture architecture) {
  switch (architecture) {
    case HfArchitecture::kUnset:
      return "";
    case HfArchitecture::kGpt2:
      return "GPT2LMHeadModel";
    case HfArchitecture::kLlama:
      return "LlamaForCausalLM";
    case HfArchitecture::kMistral:
      return "MistralForCausalLM";
    case HfArchitecture::kQwen2:
      return "Qwen2ForCausalLM";
  }
  return "";
}

std::optional<HfArchitecture> ParseHfArchitecture(std::string_view name) {
  for (HfArchitecture a : {HfArchitecture::kGpt2, HfArchitecture::kLlama, HfArchitecture::kMistral,
                           HfArchitecture::kQwen2}) {
    if (name == HfArchitectureName(a)) return a;
  }
  return std::nullopt;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  // %.17g keeps doubles exact through a round trip.
  std::string json = absl::StrFormat(
      "{\"num_layers\": %d, \"hidden_size\": %d, \"ffn_hidden_size\": %d, "
      "\"num_attention_heads\": %d, \"num_query_groups\": %d, \"kv_channels\": %d, "
      "\"vocab_size\": %d, \"max_position_embeddings\": %d, \"make_vocab_size_divisible_by\": %d, "
      "\"normalization\": \"%s\", \"norm_epsilon\": %.17g, \"activation\": \"%s\", "
      "\"position_embedding_type\": \"%s\", \"rotary_base\": %.17g, \"add_bias_linear\": %s, "
      "\"add_qkv_bias\": %s, \"untie_embeddings_and_output_weights\": %s, \"params_dtype\": \"%s\"",
      c.num_layers, c.hidden_size, c.ffn_hidden_size, c.num_attention_heads, c.num_query_groups,
      c.kv_channels, c.vocab_size, c.max_position_embeddings, c.make_vocab_size_divisible_by,
      ToAbsl(NormTypeName(c.normalization)), c.norm_epsilon, ToAbsl(ActivationName(c.activation)),
      ToAbsl(PositionEmbeddingName(c.position_embedding_type)), c.rotary_base,
      c.add_bias_linear ? "true" : "false", c.add_qkv_bias ? "true" : "false",
      c.untie_embeddings_and_output_weights ? "true" : "false", ToAbsl(DTypeName(c.params_dtype)));
  if (c.rope_scaling.llama3) {
    const RopeScaling& r = c.rope_scaling;
    json += absl::StrFormat(
        ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": "
        "%.17g, \"high_freq_factor\": %.17g, \"original_max_position_embeddings\": %d}",
        r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings);
  }
  if (c.hf_architecture != HfArchitecture::kUnset) {
    json += absl::StrFormat(", \"hf_architecture\": \"%s\"",
                            ToAbsl(HfArchitectureName(c.hf_architecture)));
  }
  json += "}";
  return json;
}

namespace {

template <typename T>
absl::Status Field(simdjson::dom::object object, const char* key, T* out) {
  if (object[key].get(*out) != simdjson::SUCCESS) {
    return absl::InvalidArgumentError(Cat("model config: missing or mistyped field '", key, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromJson(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::object object;
  if (parser.parse(json.data(), json.size()).get(object) != simdjson::SUCCESS) {
    return absl::InvalidArgumentError("model config: not a JSON object");
  }
  ModelConfig c;
  std::string_view norm, activation, position, dtype;
  for (auto [key, out] : {std::pair{"num_layers", &c.num_layers},
                          {"hidden_size", &c.hidden_size},
                          {"ffn_hidden_size", &c.ffn_hidden_size},
                          {"num_attention_heads", &c.num_attention_heads},
                          {"num_query_groups", &c.num_query_groups},
                          {"kv_channels", &c.kv_channels},
                          {"vocab_size", &c.vocab_size},
                          {"max_position_embeddings", &c.max_position_embeddings},
                          {"make_vocab_size_divisible_by", &c.make_vocab_size_divisible_by}}) {
    if (auto s = Field(object, key, out); !s.ok()) return s;
  }
  absl::Status s;
  if (!(s = Field(object, "normalization", &norm)).ok()) return s;
  if (!(s = Field(object, "norm_epsilon", &c.norm_epsilon)).ok()) return s;
  if (!(s = Field(object, "activation", &activation)).ok()) return s;
  if (!(s = Field(object, "position_embedding_type", &position)).ok()) return s;
  if (!(s = Field(object, "rotary_base", &c.rotary_base)).ok()) return s;
  if (!(s = Field(object, "add_bias_linear", &c.add_bias_linear)).ok()) return s;
  if (!(s = Field(object, "add_qkv_bias", &c.add_qkv_bias)).ok()) return s;
  if (!(s = Field(object, "untie_embeddings_and_output_weights",
                  &c.untie_embeddings_and_output_weights))
           .ok()) {
    return s;
  }
  if (!(s = Field(object, "params_dtype", &dtype)).ok()) return s;
  if (norm == "LayerNorm") {
    c.normalization = NormType::kLayerNorm;
  } else if (norm == "RMSNorm") {
    c.normalization = NormType::kRMSNorm;
  } else {
    return absl::InvalidArgumentError(Cat("model config: unknown normalization '", norm, "'"));
  }
  if (activation == "gelu") {
    c.activation = Activation::kGelu;
  } else if (activation == "gelu_tanh") {
    c.activation = Activation::kGeluTanh;
  } else if (activation == "swiglu") {
    c.activation = Activation::kSwiGLU;
  } else {
    return absl::InvalidArgumentError(Cat("model config: unknown activation '", activation, "'"));
  }
  if (position == "learned_absolute") {
    c.position_embedding_type = PositionEmbedding::kLearnedAbsolute;
  } else if (position == "rope") {
    c.position_embedding_type = PositionEmbedding::kRope;
  } else {
    return absl::InvalidArgumentError(
        Cat("model config: unknown position_embedding_type '", position, "'"));
  }
  auto parsed_dtype = ParseDType(dtype);
  if (!parsed_dtype) return absl::InvalidArgumentError(Cat("model config: unknown dtype ", dtype));
  c.params_dtype = *parsed_dtype;
  simdjson::dom::element scaling;
  if (object["rope_scaling"].get(scaling) == simdjson::SUCCESS && !scaling.is_null()) {
    simdjson::dom::object r;
    std::string_view type;
    if (scaling.get(r) != simdjson::SUCCESS || r["rope_type"].get(type) != simdjson::SUCCESS ||
        type != "llama3") {
      return absl::InvalidArgumentError(
          "model config: rope_scaling must be {\"rope_type\": \"llama3\", ...}");
    }
    c.rope_scaling.llama3 = true;
    if (!(s = Field(r, "factor", &c.rope_scaling.factor)).ok()) return s;
    if (!(s = Field(r, "low_freq_factor", &c.rope_scaling.low_freq_factor)).ok()) return s;
    if (!(s = Field(r, "high_freq_factor", &c.rope_scaling.high_freq_factor)).ok()) return s;
    if (!(s = Field(r, "original_max_position_embeddings",
                    &c.rope_scaling.original_max_position_embeddings))
             .ok())
      return s;
  }
  simdjson::dom::element architecture;
  if (object["hf_architecture"].get(architecture) == simdjson::SUCCESS && !architecture.is_null()) {
    std::string_view name;
    std::optional<HfArchitecture> parsed;
    if (architecture.get(name) == simdjson::SUCCESS) parsed = ParseHfArchitecture(name);
    if (!parsed) {
      return absl::InvalidArgumentError(
          "model config: hf_architecture must be GPT2LMHeadModel, LlamaForCausalLM, "
          "MistralForCausalLM or Qwen2ForCausalLM");
    }
    c.hf_architecture = *parsed;
  }
  if (auto status = ValidateModelConfig(c); !status.ok()) return status;
  return c;
}

}  // namespace leantron::ckpt
