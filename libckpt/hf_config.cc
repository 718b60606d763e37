#include "libckpt/hf_config.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_format.h"
#include "libckpt/strings.h"
#include "simdjson.h"

namespace leantron::ckpt {
namespace {

absl::Status Missing(std::string_view source, std::string_view key) {
  return absl::InvalidArgumentError(Cat(source, ": missing or mistyped '", key, "'"));
}

// Absent and null differ for a few fields (Mistral's sliding_window, num_key_value_heads).
enum class Presence { kAbsent, kNull, kValue };

Presence Has(simdjson::dom::object o, const char* key) {
  simdjson::dom::element e;
  if (o[key].get(e) != simdjson::SUCCESS) return Presence::kAbsent;
  return e.is_null() ? Presence::kNull : Presence::kValue;
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

std::string RawOrEmpty(simdjson::dom::object o, const char* key) {
  simdjson::dom::element e;
  if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) return "";
  return simdjson::minify(e);
}

// Rotary positions on part of each head only (partial_rotary_factor < 1) are not implemented.
absl::Status CheckPartialRotary(simdjson::dom::object o, std::string_view source,
                                std::string_view key) {
  double partial = 1.0;
  if (!OptionalDouble(o, "partial_rotary_factor", &partial)) return Missing(source, key);
  if (partial != 1.0) {
    return absl::InvalidArgumentError(Cat(source, ": ", key, " ", partial,
                                          " is not supported (rotary positions on whole heads)"));
  }
  return absl::OkStatus();
}

// rope_theta and the rope scaling. transformers 4 writes "rope_theta" and "rope_scaling";
// transformers 5 folds both into "rope_parameters" (and reads "rope_scaling" first when both are
// there, as here). Of the scalings only Llama 3.1's ("llama3") is implemented; any other type is
// refused rather than carried along and ignored, which would compute another function.
absl::Status ParseRope(simdjson::dom::object o, std::string_view source, ModelConfig* c) {
  if (!OptionalDouble(o, "rope_theta", &c->rotary_base)) return Missing(source, "rope_theta");
  if (auto s = CheckPartialRotary(o, source, "partial_rotary_factor"); !s.ok()) return s;
  std::optional<simdjson::dom::object> llama3;
  const char* llama3_key = "";
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    simdjson::dom::element e;
    if (o[key].get(e) != simdjson::SUCCESS || e.is_null()) continue;
    simdjson::dom::object r;
    if (e.get(r) != simdjson::SUCCESS) return Missing(source, key);
    if (std::string_view(key) == "rope_parameters") {
      if (!OptionalDouble(r, "rope_theta", &c->rotary_base)) {
        return Missing(source, "rope_parameters.rope_theta");
      }
      if (auto s = CheckPartialRotary(r, source, "rope_parameters.partial_rotary_factor");
          !s.ok()) {
        return s;
      }
    }
    std::string_view type = "default";
    for (const char* type_key : {"type", "rope_type"}) {  // "type": older configs
      simdjson::dom::element t;
      if (r[type_key].get(t) != simdjson::SUCCESS || t.is_null()) continue;
      if (t.get(type) != simdjson::SUCCESS) return Missing(source, Cat(key, ".", type_key));
    }
    if (type != "default" && type != "llama3") {
      return absl::InvalidArgumentError(
          Cat(source, ": ", key, " of type '", type,
              "' is not supported (only unscaled rotary positions and Llama 3.1's 'llama3' "
              "scaling are implemented)"));
    }
    llama3.reset();
    if (type == "llama3") {
      llama3 = r;
      llama3_key = key;
    }
  }
  if (!llama3) return absl::OkStatus();
  RopeScaling& s = c->rope_scaling;
  s.llama3 = true;
  for (auto [field, out] : {std::pair{"factor", &s.factor},
                            {"low_freq_factor", &s.low_freq_factor},
                            {"high_freq_factor", &s.high_freq_factor}}) {
    simdjson::dom::element e;
    if ((*llama3)[field].get(e) != simdjson::SUCCESS || e.get(*out) != simdjson::SUCCESS) {
      return Missing(source, Cat(llama3_key, ".", field));
    }
  }
  if ((*llama3)["original_max_position_embeddings"].get(s.original_max_position_embeddings) !=
      simdjson::SUCCESS) {
    return Missing(source, Cat(llama3_key, ".original_max_position_embeddings"));
  }
  return absl::OkStatus();
}

absl::StatusOr<HfModelInfo> ParseGpt2(simdjson::dom::object o, std::string_view source) {
  HfModelInfo info;
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
  c.hf_architecture = HfArchitecture::kGpt2;
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

// What the trainer cannot compute: sliding-window attention (it attends to every earlier position,
// which differs from a window on sequences longer than it) and, for Llama, biases outside QKV.
absl::Status CheckLlamaFamilyAttention(simdjson::dom::object o, std::string_view source,
                                       HfArchitecture family) {
  constexpr const char* kFull =
      " is not supported: Leantron computes full causal attention, which differs from "
      "sliding-window attention on sequences longer than the window";
  simdjson::dom::element e;
  if (o["layer_types"].get(e) == simdjson::SUCCESS && !e.is_null()) {
    simdjson::dom::array types;
    if (e.get(types) != simdjson::SUCCESS) return Missing(source, "layer_types");
    size_t i = 0;
    for (simdjson::dom::element t : types) {
      std::string_view type;
      if (t.get(type) != simdjson::SUCCESS) return Missing(source, "layer_types");
      if (type != "full_attention") {
        return absl::InvalidArgumentError(
            Cat(source, ": layer_types[", i, "] = '", type, "'", kFull));
      }
      ++i;
    }
  }
  if (family == HfArchitecture::kMistral) {
    // MistralForCausalLM reads an absent sliding_window as 4096.
    int64_t window = 4096;
    switch (Has(o, "sliding_window")) {
      case Presence::kNull:
        break;
      case Presence::kAbsent:
        return absl::InvalidArgumentError(
            Cat(source, ": sliding_window is absent, which MistralForCausalLM reads as 4096;",
                " sliding_window", kFull, " (a config with \"sliding_window\": null converts)"));
      case Presence::kValue:
        if (o["sliding_window"].get(window) != simdjson::SUCCESS) {
          return Missing(source, "sliding_window");
        }
        return absl::InvalidArgumentError(
            Cat(source, ": sliding_window ", window, kFull,
                " (a config with \"sliding_window\": null converts)"));
    }
  }
  if (family == HfArchitecture::kQwen2) {
    bool sliding = false;
    if (!OptionalBool(o, "use_sliding_window", &sliding)) {
      return Missing(source, "use_sliding_window");
    }
    if (sliding)
      return absl::InvalidArgumentError(Cat(source, ": use_sliding_window = true", kFull));
  }
  if (family == HfArchitecture::kLlama) {
    // Megatron's linear biases are on every linear layer or on QKV alone; Llama's attention_bias
    // puts one on the output projection too, without the MLP.
    bool attention_bias = false, mlp_bias = false;
    if (!OptionalBool(o, "attention_bias", &attention_bias) || attention_bias) {
      return absl::InvalidArgumentError(Cat(source, ": attention_bias = true is not supported"));
    }
    if (!OptionalBool(o, "mlp_bias", &mlp_bias) || mlp_bias) {
      return absl::InvalidArgumentError(Cat(source, ": mlp_bias = true is not supported"));
    }
  }
  return absl::OkStatus();
}

// LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM: one decoder (RMSNorm, RoPE, GQA,
// SwiGLU); Qwen2 adds biases to q/k/v. Absent fields take the values each transformers class
// gives them.
absl::StatusOr<HfModelInfo> ParseLlamaFamily(simdjson::dom::object o, std::string_view source,
                                             HfArchitecture family) {
  HfModelInfo info;
  int64_t layers, hidden, ffn, heads, vocab;
  if (o["num_hidden_layers"].get(layers)) return Missing(source, "num_hidden_layers");
  if (o["hidden_size"].get(hidden)) return Missing(source, "hidden_size");
  if (o["intermediate_size"].get(ffn)) return Missing(source, "intermediate_size");
  if (o["num_attention_heads"].get(heads)) return Missing(source, "num_attention_heads");
  if (o["vocab_size"].get(vocab)) return Missing(source, "vocab_size");
  int64_t positions = family == HfArchitecture::kMistral ? 4096 * 32
                      : family == HfArchitecture::kQwen2 ? 32768
                                                         : 2048;
  if (!OptionalInt(o, "max_position_embeddings", &positions)) {
    return Missing(source, "max_position_embeddings");
  }
  // num_key_value_heads: null means multi-head attention in every class; absent means that for
  // Llama but 8 for Mistral and 32 for Qwen2.
  int64_t groups = family == HfArchitecture::kMistral ? 8
                   : family == HfArchitecture::kQwen2 ? 32
                                                      : heads;
  if (Has(o, "num_key_value_heads") == Presence::kNull) groups = heads;
  if (!OptionalInt(o, "num_key_value_heads", &groups)) {
    return Missing(source, "num_key_value_heads");
  }
  ModelConfig c = LlamaStyleConfig(layers, hidden, ffn, heads, groups, vocab, positions);
  c.hf_architecture = family;
  c.norm_epsilon = 1e-6;  // The default of all three classes.
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
  if (auto s = ParseRope(o, source, &c); !s.ok()) return s;
  if (auto s = CheckLlamaFamilyAttention(o, source, family); !s.ok()) return s;
  c.add_qkv_bias = family == HfArchitecture::kQwen2;
  bool tie = false;
  if (!OptionalBool(o, "tie_word_embeddings", &tie)) return Missing(source, "tie_word_embeddings");
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
    info = ParseLlamaFamily(o, source, HfArchitecture::kLlama);
  } else if (model_type == "mistral") {
    info = ParseLlamaFamily(o, source, HfArchitecture::kMistral);
  } else if (model_type == "qwen2") {
    info = ParseLlamaFamily(o, source, HfArchitecture::kQwen2);
  } else {
    return absl::InvalidArgumentError(Cat(source, ": model_type '", model_type,
                                          "' is not supported (gpt2, llama, mistral, qwen2)"));
  }
  if (!info.ok()) return info;
  if (auto s = ValidateModelConfig(info->config); !s.ok()) {
    return absl::InvalidArgumentError(Cat(source, ": ", std::string(s.message())));
  }
  return info;
}

absl::StatusOr<HfArchitecture> HfArchitectureFor(const ModelConfig& c) {
  const bool gpt2 = c.position_embedding_type == PositionEmbedding::kLearnedAbsolute &&
                    c.normalization == NormType::kLayerNorm && !c.swiglu() && c.add_bias_linear &&
                    c.add_qkv_bias && c.num_query_groups == c.num_attention_heads &&
                    c.kv_channels * c.num_attention_heads == c.hidden_size;
  const bool llama_family = c.position_embedding_type == PositionEmbedding::kRope &&
                            c.normalization == NormType::kRMSNorm && c.swiglu() &&
                            !c.add_bias_linear;
  switch (c.hf_architecture) {
    case HfArchitecture::kUnset:
      if (gpt2) return HfArchitecture::kGpt2;
      if (llama_family) return c.add_qkv_bias ? HfArchitecture::kQwen2 : HfArchitecture::kLlama;
      return absl::InvalidArgumentError(
          "model config matches none of GPT2LMHeadModel (learned positions, LayerNorm, GELU, "
          "biases, multi-head attention), LlamaForCausalLM (RoPE, RMSNorm, SwiGLU, no biases) and "
          "Qwen2ForCausalLM (the same with QKV biases)");
    case HfArchitecture::kGpt2:
      if (gpt2) return c.hf_architecture;
      break;
    case HfArchitecture::kLlama:
    case HfArchitecture::kMistral:
      if (llama_family && !c.add_qkv_bias) return c.hf_architecture;
      break;
    case HfArchitecture::kQwen2:
      if (llama_family && c.add_qkv_bias) return c.hf_architecture;
      break;
  }
  return absl::InvalidArgumentError(
      Cat("model config records hf_architecture ", HfArchitectureName(c.hf_architecture),
          " but its shape does not fit that class (", NormTypeName(c.normalization), ", ",
          ActivationName(c.activation), ", ", PositionEmbeddingName(c.position_embedding_type),
          " positions, ", c.add_bias_linear ? "linear biases" : "no linear biases",
          c.add_qkv_bias ? ", QKV bias" : ", no QKV bias", ")"));
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
  const HfArchitecture family = c.hf_architecture;
  std::string json = "{\n";
  auto add = [&](std::string_view key, const std::string& value) {
    CatAppend(&json, json.size() > 2 ? ",\n" : "", "  \"", key, "\": ", value);
  };
  const bool tie = !c.untie_embeddings_and_output_weights;
  add("architectures", Cat("[\"", HfArchitectureName(family), "\"]"));
  if (family == HfArchitecture::kGpt2) {
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
    add("model_type", family == HfArchitecture::kMistral ? "\"mistral\""
                      : family == HfArchitecture::kQwen2 ? "\"qwen2\""
                                                         : "\"llama\"");
    add("hidden_act", "\"silu\"");
    add("hidden_size", Cat(c.hidden_size));
    add("intermediate_size", Cat(c.ffn_hidden_size));
    add("num_hidden_layers", Cat(c.num_layers));
    add("num_attention_heads", Cat(c.num_attention_heads));
    add("num_key_value_heads", Cat(c.num_query_groups));
    // Qwen2's config class has no head_dim field (its attention reads one when present).
    if (family != HfArchitecture::kQwen2 ||
        c.kv_channels * c.num_attention_heads != c.hidden_size) {
      add("head_dim", Cat(c.kv_channels));
    }
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
    if (family == HfArchitecture::kLlama) {
      add("attention_bias", "false");
      add("mlp_bias", "false");
    } else if (family == HfArchitecture::kMistral) {
      add("sliding_window", "null");
    } else {
      add("use_sliding_window", "false");
      add("sliding_window", "null");
    }
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
