#include "libckpt/hf_config.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "libckpt/strings.h"
#include "simdjson.h"

namespace leantron::ckpt {
namespace {

absl::Status Missing(std::string_view source, const char* key) {
  return absl::InvalidArgumentError(Cat(source, ": missing or mistyped '", key, "'"));
}

// Optional integer: absent or null leaves `out` unchanged.
bool OptionalInt(simdjson::dom::object o, const char* key, int64_t* out) {
  simdjson::dom::element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return true;
  return e.get(*out) == simdjson::SUCCESS;
}

bool OptionalBool(simdjson::dom::object o, const char* key, bool* out) {
  simdjson::dom::element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return true;
  return e.get(*out) == simdjson::SUCCESS;
}

// Optional number: absent or null leaves `out` unchanged; anything else but a finite number fails.
bool OptionalDouble(simdjson::dom::object o, const char* key, double* out) {
  simdjson::dom::element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return true;
  double v;
  if (e.get(v) != simdjson::SUCCESS || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// Nothing but rotary positions as they are (no scaling) is applied by the trainer, so a config
// asking for another RoPE variant is refused here rather than carried along and ignored.
absl::Status CheckRopeScaling(simdjson::dom::object o, std::string_view source) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    simdjson::dom::element e;
    if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) continue;
    simdjson::dom::object scaling;
    if (e.get(scaling) != simdjson::SUCCESS) return Missing(source, key);
    std::string_view type = "default";
    for (const char* type_key : {"rope_type", "type"}) {
      simdjson::dom::element t;
      if (scaling[type_key].get(t) != simdjson::SUCCESS || t.is_null()) continue;
      if (t.get(type) != simdjson::SUCCESS) return Missing(source, key);
    }
    if (type != "default") {
      return absl::InvalidArgumentError(
          Cat(source, ": ", key, " of type '", type,
              "' is not supported (only unscaled rotary positions are implemented)"));
    }
  }
  return absl::OkStatus();
}

std::string RawOrEmpty(simdjson::dom::object o, const char* key) {
  simdjson::dom::element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return "";
  return simdjson::minify(e);
}

absl::StatusOr<HfModelInfo> ParseGpt2(simdjson::dom::object o, std::string_view source) {
  HfModelInfo info;
  info.architecture = HfArchitecture::kGpt2;
  int64_t layers, hidden, heads, vocab, positions;
  if (o["n_layer"].get(layers)) return Missing(source, "n_layer");
  if (o["n_embd"].get(hidden)) return Missing(source, "n_embd");
  if (o["n_head"].get(heads)) return Missing(source, "n_head");
  if (o["vocab_size"].get(vocab)) return Missing(source, "vocab_size");
  if (o["n_positions"].get(positions)) return Missing(source, "n_positions");
  if (heads <= 0 || hidden % heads != 0) {
    return absl::InvalidArgumentError(Cat(source, ": n_embd is not divisible by n_head"));
  }
  ModelConfig c = Gpt2StyleConfig(layers, hidden, heads, vocab, positions);
  if (!OptionalInt(o, "n_inner", &c.ffn_hidden_size)) return Missing(source, "n_inner");
  if (!OptionalDouble(o, "layer_norm_epsilon", &c.norm_epsilon)) {
    return Missing(source, "layer_norm_epsilon");
  }
  std::string_view act = "gelu_new";
  if (o["activation_function"].get(act) != simdjson::SUCCESS &&
      o["activation_function"].error() != simdjson::NO_SUCH_FIELD) {
    return Missing(source, "activation_function");
  }
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c.activation = Activation::kGeluTanh;
  } else if (act == "gelu") {
    c.activation = Activation::kGelu;
  } else {
    return absl::InvalidArgumentError(Cat(source, ": unsupported activation_function '", act, "'"));
  }
  bool tie = true;
  if (!OptionalBool(o, "tie_word_embeddings", &tie)) return Missing(source, "tie_word_embeddings");
  c.untie_embeddings_and_output_weights = !tie;
  info.config = c;
  info.bos_token_id_json = RawOrEmpty(o, "bos_token_id");
  info.eos_token_id_json = RawOrEmpty(o, "eos_token_id");
  return info;
}

absl::StatusOr<HfModelInfo> ParseLlama(simdjson::dom::object o, std::string_view source) {
  HfModelInfo info;
  info.architecture = HfArchitecture::kLlama;
  int64_t layers, hidden, ffn, heads, vocab, positions = 0;
  if (o["num_hidden_layers"].get(layers)) return Missing(source, "num_hidden_layers");
  if (o["hidden_size"].get(hidden)) return Missing(source, "hidden_size");
  if (o["intermediate_size"].get(ffn)) return Missing(source, "intermediate_size");
  if (o["num_attention_heads"].get(heads)) return Missing(source, "num_attention_heads");
  if (o["vocab_size"].get(vocab)) return Missing(source, "vocab_size");
  if (!OptionalInt(o, "max_position_embeddings", &positions)) {
    return Missing(source, "max_position_embeddings");
  }
  int64_t groups = heads;
  if (!OptionalInt(o, "num_key_value_heads", &groups))
    return Missing(source, "num_key_value_heads");
  ModelConfig c = LlamaStyleConfig(layers, hidden, ffn, heads, groups, vocab, positions);
  if (heads > 0) c.kv_channels = hidden / heads;
  if (!OptionalInt(o, "head_dim", &c.kv_channels)) return Missing(source, "head_dim");
  std::string_view act = "silu";
  if (o["hidden_act"].get(act) != simdjson::SUCCESS &&
      o["hidden_act"].error() != simdjson::NO_SUCH_FIELD) {
    return Missing(source, "hidden_act");
  }
  if (act != "silu") {
    return absl::InvalidArgumentError(
        Cat(source, ": unsupported hidden_act '", act, "' (need silu)"));
  }
  if (!OptionalDouble(o, "rms_norm_eps", &c.norm_epsilon)) return Missing(source, "rms_norm_eps");
  if (!OptionalDouble(o, "rope_theta", &c.rotary_base)) return Missing(source, "rope_theta");
  simdjson::dom::object rope_parameters;
  if (o["rope_parameters"].get(rope_parameters) == simdjson::SUCCESS &&
      !OptionalDouble(rope_parameters, "rope_theta", &c.rotary_base)) {
    return Missing(source, "rope_parameters.rope_theta");
  }
  if (auto s = CheckRopeScaling(o, source); !s.ok()) return s;
  bool tie = false, attention_bias = false, mlp_bias = false;
  if (!OptionalBool(o, "tie_word_embeddings", &tie)) return Missing(source, "tie_word_embeddings");
  if (!OptionalBool(o, "attention_bias", &attention_bias) || attention_bias) {
    return absl::InvalidArgumentError(Cat(source, ": attention_bias = true is not supported"));
  }
  if (!OptionalBool(o, "mlp_bias", &mlp_bias) || mlp_bias) {
    return absl::InvalidArgumentError(Cat(source, ": mlp_bias = true is not supported"));
  }
  c.untie_embeddings_and_output_weights = !tie;
  info.config = c;
  info.bos_token_id_json = RawOrEmpty(o, "bos_token_id");
  info.eos_token_id_json = RawOrEmpty(o, "eos_token_id");
  return info;
}

}  // namespace

absl::StatusOr<HfModelInfo> ParseHfConfig(std::string_view json, std::string_view source) {
  simdjson::dom::parser parser;
  simdjson::dom::object o;
  if (parser.parse(json.data(), json.size()).get(o) != simdjson::SUCCESS) {
    return absl::InvalidArgumentError(Cat(source, ": not a JSON object"));
  }
  std::string_view model_type;
  if (o["model_type"].get(model_type) != simdjson::SUCCESS) return Missing(source, "model_type");
  absl::StatusOr<HfModelInfo> info;
  if (model_type == "gpt2") {
    info = ParseGpt2(o, source);
  } else if (model_type == "llama") {
    info = ParseLlama(o, source);
  } else {
    return absl::InvalidArgumentError(
        Cat(source, ": model_type '", model_type, "' is not supported (gpt2, llama)"));
  }
  if (!info.ok()) return info;
  if (auto s = ValidateModelConfig(info->config); !s.ok()) {
    return absl::InvalidArgumentError(Cat(source, ": ", std::string(s.message())));
  }
  return info;
}

absl::StatusOr<HfArchitecture> HfArchitectureFor(const ModelConfig& c) {
  if (c.position_embedding_type == PositionEmbedding::kLearnedAbsolute &&
      c.normalization == NormType::kLayerNorm && !c.swiglu() && c.add_bias_linear &&
      c.add_qkv_bias && c.num_query_groups == c.num_attention_heads &&
      c.kv_channels * c.num_attention_heads == c.hidden_size) {
    return HfArchitecture::kGpt2;
  }
  if (c.position_embedding_type == PositionEmbedding::kRope &&
      c.normalization == NormType::kRMSNorm && c.swiglu() && !c.add_bias_linear &&
      !c.add_qkv_bias) {
    return HfArchitecture::kLlama;
  }
  return absl::InvalidArgumentError(
      "model config matches neither GPT2LMHeadModel (learned positions, LayerNorm, GELU, biases, "
      "multi-head attention) nor LlamaForCausalLM (RoPE, RMSNorm, SwiGLU, no biases)");
}

namespace {

std::string TorchDtype(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    default:
      return "float32";
  }
}

}  // namespace

std::string HfConfigJson(const HfModelInfo& info) {
  const ModelConfig& c = info.config;
  std::string json = "{\n";
  auto add = [&](std::string_view key, const std::string& value) {
    CatAppend(&json, json.size() > 2 ? ",\n" : "", "  \"", key, "\": ", value);
  };
  const bool tie = !c.untie_embeddings_and_output_weights;
  if (info.architecture == HfArchitecture::kGpt2) {
    add("architectures", "[\"GPT2LMHeadModel\"]");
    add("model_type", "\"gpt2\"");
    add("activation_function", c.activation == Activation::kGelu ? "\"gelu\"" : "\"gelu_new\"");
    add("n_embd", Cat(c.hidden_size));
    add("n_layer", Cat(c.num_layers));
    add("n_head", Cat(c.num_attention_heads));
    add("n_inner", c.ffn_hidden_size == 4 * c.hidden_size ? "null" : Cat(c.ffn_hidden_size));
    add("n_positions", Cat(c.max_position_embeddings));
    add("n_ctx", Cat(c.max_position_embeddings));
    add("layer_norm_epsilon", absl::StrFormat("%.17g", c.norm_epsilon));
  } else {
    add("architectures", "[\"LlamaForCausalLM\"]");
    add("model_type", "\"llama\"");
    add("hidden_act", "\"silu\"");
    add("hidden_size", Cat(c.hidden_size));
    add("intermediate_size", Cat(c.ffn_hidden_size));
    add("num_hidden_layers", Cat(c.num_layers));
    add("num_attention_heads", Cat(c.num_attention_heads));
    add("num_key_value_heads", Cat(c.num_query_groups));
    add("head_dim", Cat(c.kv_channels));
    add("max_position_embeddings", Cat(c.max_position_embeddings));
    add("rms_norm_eps", absl::StrFormat("%.17g", c.norm_epsilon));
    add("rope_theta", absl::StrFormat("%.17g", c.rotary_base));
    if (const RopeScaling& r = c.rope_scaling; r.llama3) {
      add("rope_scaling",
          absl::StrFormat("{\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": "
                          "%.17g, \"high_freq_factor\": %.17g, "
                          "\"original_max_position_embeddings\": %d}",
                          r.factor, r.low_freq_factor, r.high_freq_factor,
                          r.original_max_position_embeddings));
    } else {
      add("rope_scaling", "null");
    }
    add("attention_bias", "false");
    add("mlp_bias", "false");
  }
  add("vocab_size", Cat(c.vocab_size));
  add("tie_word_embeddings", tie ? "true" : "false");
  if (!info.bos_token_id_json.empty()) add("bos_token_id", info.bos_token_id_json);
  if (!info.eos_token_id_json.empty()) add("eos_token_id", info.eos_token_id_json);
  add("torch_dtype", Cat("\"", TorchDtype(c.params_dtype), "\""));
  json += "\n}\n";
  return json;
}

}  // namespace leantron::ckpt
