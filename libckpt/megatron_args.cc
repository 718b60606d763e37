#include "libckpt/megatron_args.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "libckpt/json_quote.h"
#include "libckpt/strings.h"
#include "libckpt/torch_archive.h"

namespace leantron::ckpt {
namespace {

const PyValue* Attr(const PyValue* args, std::string_view name) {
  const PyValue* v = DictGet(ObjectDict(args), name);
  return v == nullptr || v->kind == PyKind::kNone ? nullptr : v;
}

absl::Status WrongType(std::string_view name, const PyValue* v, std::string_view want) {
  return absl::InvalidArgumentError(Cat("args.", name, " is ", PyRepr(v, 60), ", expected ", want));
}

std::optional<std::string> PlainJson(const PyValue* v, int depth) {
  if (v == nullptr || depth > 4) return std::nullopt;
  switch (v->kind) {
    case PyKind::kNone:
      return "null";
    case PyKind::kBool:
      return v->boolean ? "true" : "false";
    case PyKind::kInt:
      return Cat(v->integer);
    case PyKind::kFloat:
      if (!std::isfinite(v->real)) return std::nullopt;
      return absl::StrFormat("%.17g", v->real);
    case PyKind::kStr:
      return JsonQuote(v->s);
    case PyKind::kList:
    case PyKind::kTuple: {
      std::string out = "[";
      for (size_t i = 0; i < v->items.size(); ++i) {
        auto item = PlainJson(v->items[i], depth + 1);
        if (!item) return std::nullopt;
        CatAppend(&out, i ? ", " : "", *item);
      }
      return out + "]";
    }
    default:
      return std::nullopt;
  }
}

}  // namespace

std::optional<std::string> PlainValueJson(const PyValue* value) { return PlainJson(value, 0); }

absl::StatusOr<std::optional<int64_t>> ArgInt(const PyValue* args, std::string_view name) {
  const PyValue* v = Attr(args, name);
  if (v == nullptr) return std::nullopt;
  if (v->kind == PyKind::kInt) return v->integer;
  if (v->kind == PyKind::kBool) return int64_t{v->boolean};
  return WrongType(name, v, "an integer");
}

absl::StatusOr<std::optional<double>> ArgFloat(const PyValue* args, std::string_view name) {
  const PyValue* v = Attr(args, name);
  if (v == nullptr) return std::nullopt;
  if (v->kind == PyKind::kFloat) return v->real;
  if (v->kind == PyKind::kInt) return static_cast<double>(v->integer);
  return WrongType(name, v, "a number");
}

absl::StatusOr<std::optional<bool>> ArgBool(const PyValue* args, std::string_view name) {
  const PyValue* v = Attr(args, name);
  if (v == nullptr) return std::nullopt;
  if (v->kind == PyKind::kBool) return v->boolean;
  if (v->kind == PyKind::kInt) return v->integer != 0;
  return WrongType(name, v, "a boolean");
}

absl::StatusOr<std::optional<std::string>> ArgStr(const PyValue* args, std::string_view name) {
  const PyValue* v = Attr(args, name);
  if (v == nullptr) return std::nullopt;
  if (v->kind == PyKind::kStr) return v->s;
  return WrongType(name, v, "a string");
}

absl::StatusOr<MegatronRun> MegatronRunFromArgs(const PyValue* args, std::string_view source) {
  if (args == nullptr || !args->IsCallOf("argparse", "Namespace") || ObjectDict(args) == nullptr) {
    return absl::InvalidArgumentError(
        Cat(source, ": 'args' is not an argparse.Namespace but ", PyRepr(args, 80)));
  }
  absl::Status status;
  auto fail = [&](absl::Status s) {
    return absl::InvalidArgumentError(Cat(source, ": ", s.message()));
  };
  // Typed reads with defaults; the first wrong type is kept in `status`.
  auto get_int = [&](std::string_view name,
                     std::optional<int64_t> fallback) -> std::optional<int64_t> {
    auto v = ArgInt(args, name);
    if (!v.ok()) {
      if (status.ok()) status = v.status();
      return fallback;
    }
    return v->has_value() ? *v : fallback;
  };
  auto get_bool = [&](std::string_view name, bool fallback) {
    auto v = ArgBool(args, name);
    if (!v.ok()) {
      if (status.ok()) status = v.status();
      return fallback;
    }
    return v->value_or(fallback);
  };
  auto get_float = [&](std::string_view name, std::optional<double> fallback) {
    auto v = ArgFloat(args, name);
    if (!v.ok()) {
      if (status.ok()) status = v.status();
      return fallback;
    }
    return v->has_value() ? *v : fallback;
  };
  auto get_str = [&](std::string_view name, std::string fallback) {
    auto v = ArgStr(args, name);
    if (!v.ok()) {
      if (status.ok()) status = v.status();
      return fallback;
    }
    return v->value_or(fallback);
  };
  auto refuse = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        Cat(source, ": the checkpoint's model uses ", what,
            ", which Leantron's model does not have; it cannot be converted"));
  };

  // Architectures outside the model's spec.
  if (get_int("num_experts", 0).value_or(0) > 0) return refuse("mixture of experts (num_experts)");
  if (get_bool("qk_layernorm", false)) return refuse("QK layer norm (qk_layernorm)");
  if (get_bool("multi_latent_attention", false)) return refuse("multi-latent attention");
  if (get_int("mtp_num_layers", 0).value_or(0) > 0) return refuse("multi-token prediction");
  if (get_bool("apply_residual_connection_post_layernorm", false)) {
    return refuse("apply_residual_connection_post_layernorm");
  }
  if (get_bool("squared_relu", false)) return refuse("squared ReLU");
  if (get_bool("rotary_interleaved", false)) return refuse("interleaved rotary embeddings");
  if (get_bool("account_for_embedding_in_pipeline_split", false) ||
      get_bool("account_for_loss_in_pipeline_split", false)) {
    return refuse("account_for_embedding/loss_in_pipeline_split");
  }
  if (Attr(args, "pipeline_model_parallel_layout") != nullptr) {
    return refuse("a custom pipeline_model_parallel_layout");
  }
  if (Attr(args, "heterogeneous_layers_config_path") != nullptr ||
      Attr(args, "heterogeneous_layers_config_encoded_json") != nullptr) {
    return refuse("heterogeneous layers");
  }

  MegatronRun run;
  ModelConfig& c = run.config;
  c.num_layers = get_int("num_layers", 0).value_or(0);
  c.hidden_size = get_int("hidden_size", 0).value_or(0);
  c.num_attention_heads = get_int("num_attention_heads", 0).value_or(0);
  c.ffn_hidden_size = get_int("ffn_hidden_size", 4 * c.hidden_size).value_or(4 * c.hidden_size);
  c.num_query_groups = get_bool("group_query_attention", false)
                           ? get_int("num_query_groups", c.num_attention_heads).value_or(0)
                           : c.num_attention_heads;
  c.kv_channels = get_int("kv_channels", 0).value_or(0);
  if (c.kv_channels == 0 && c.num_attention_heads > 0) {
    c.kv_channels = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = get_int("max_position_embeddings", 0).value_or(0);
  c.make_vocab_size_divisible_by = get_int("make_vocab_size_divisible_by", 128).value_or(128);
  const std::string norm = get_str("normalization", "LayerNorm");
  if (norm == "LayerNorm") {
    c.normalization = NormType::kLayerNorm;
  } else if (norm == "RMSNorm") {
    c.normalization = NormType::kRMSNorm;
  } else {
    return refuse(Cat("normalization ", norm));
  }
  c.norm_epsilon = get_float("norm_epsilon", get_float("layernorm_epsilon", 1e-5)).value_or(1e-5);
  c.activation = get_bool("swiglu", false)        ? Activation::kSwiGLU
                 : get_bool("openai_gelu", false) ? Activation::kGeluTanh
                                                  : Activation::kGelu;
  std::string position = get_str("position_embedding_type", "");
  if (position.empty()) {
    position = get_bool("use_rotary_position_embeddings", false) ? "rope" : "learned_absolute";
  }
  if (position == "learned_absolute") {
    c.position_embedding_type = PositionEmbedding::kLearnedAbsolute;
  } else if (position == "rope") {
    c.position_embedding_type = PositionEmbedding::kRope;
    const double percent = get_float("rotary_percent", 1.0).value_or(1.0);
    if (percent != 1.0)
      return refuse(Cat("partial rotary embeddings (rotary_percent ", percent, ")"));
    c.rotary_base = get_float("rotary_base", 10000.0).value_or(10000.0);
    // --use-rope-scaling: Llama 3.1's scaling, Megatron's factor (default 8) and the rest fixed.
    if (get_bool("use_rope_scaling", false)) {
      c.rope_scaling.llama3 = true;
      c.rope_scaling.factor = get_float("rope_scaling_factor", 8.0).value_or(8.0);
      if (!(c.rope_scaling.factor > 0) || !std::isfinite(c.rope_scaling.factor)) {
        return absl::InvalidArgumentError(
            Cat(source, ": rope_scaling_factor ", c.rope_scaling.factor, " is not positive"));
      }
    }
  } else {
    return refuse(Cat("position_embedding_type ", position));
  }
  c.add_bias_linear = get_bool("add_bias_linear", true);
  c.add_qkv_bias = c.add_bias_linear || get_bool("add_qkv_bias", false);
  c.untie_embeddings_and_output_weights = get_bool("untie_embeddings_and_output_weights", false);
  const bool bf16 = get_bool("bf16", false), fp16 = get_bool("fp16", false);
  run.fp32_training = !bf16 && !fp16;
  c.params_dtype = bf16 ? DType::kBF16 : fp16 ? DType::kF16 : DType::kF32;
  if (const PyValue* dtype = Attr(args, "params_dtype")) {
    if (auto d = DTypeOfTorchDtype(dtype)) c.params_dtype = *d;
  }
  // The true vocabulary: --vocab-size when given (NullTokenizer, HF tokenizers), else GPT-2's for
  // its BPE tokenizer; checked against the padded size Megatron computed. When neither fits, the
  // padded size is taken as the vocabulary (HF export then keeps the padding rows).
  const int64_t padded = get_int("padded_vocab_size", 0).value_or(0);
  std::optional<int64_t> vocab = get_int("vocab_size", std::nullopt);
  if (!vocab && get_str("tokenizer_type", "") == "GPT2BPETokenizer") vocab = 50257;
  ParallelConfig& p = run.parallel;
  p.tp = static_cast<int>(get_int("tensor_model_parallel_size", 1).value_or(1));
  p.pp = static_cast<int>(get_int("pipeline_model_parallel_size", 1).value_or(1));
  p.vpp = static_cast<int>(get_int("virtual_pipeline_model_parallel_size", 1).value_or(1));
  if (const auto per_stage = get_int("num_layers_per_virtual_pipeline_stage", std::nullopt);
      per_stage && *per_stage > 0 && p.pp > 0 && c.num_layers % (p.pp * *per_stage) == 0) {
    p.vpp = static_cast<int>(c.num_layers / (p.pp * *per_stage));
  }
  p.first_stage_layers =
      static_cast<int>(get_int("decoder_first_pipeline_num_layers", 0).value_or(0));
  p.last_stage_layers =
      static_cast<int>(get_int("decoder_last_pipeline_num_layers", 0).value_or(0));
  if (get_int("expert_model_parallel_size", 1).value_or(1) > 1) return refuse("expert parallelism");
  c.vocab_size = vocab.value_or(padded);
  if (padded > 0 && p.tp > 0 &&
      PaddedVocabSize(c.vocab_size, c.make_vocab_size_divisible_by, p.tp) != padded) {
    c.vocab_size = padded;
  }
  run.consumed_samples = get_int("consumed_train_samples", 0).value_or(0);
  run.distributed_optimizer = get_bool("use_distributed_optimizer", false);
  run.data_parallel_size = get_int("data_parallel_size", 1).value_or(1) *
                           get_int("context_parallel_size", 1).value_or(1);
  if (get_bool("overlap_grad_reduce", false)) {
    if (get_int("ddp_num_buckets", std::nullopt).has_value()) {
      return absl::InvalidArgumentError(
          Cat(source, ": a distributed-optimizer layout from --ddp-num-buckets is not supported"));
    }
    run.bucket_size = get_int("ddp_bucket_size", std::nullopt)
                          .value_or(std::max<int64_t>(40000000, 1000000 * run.data_parallel_size));
  }
  run.overlap_param_gather_with_optimizer_step =
      get_bool("overlap_param_gather_with_optimizer_step", false);
  if (!status.ok()) return fail(status);
  if (auto s = ValidateModelConfig(c); !s.ok()) return fail(s);

  std::string json = "{";
  const PyValue* dict = ObjectDict(args);
  bool first = true;
  for (size_t i = 0; i + 1 < dict->items.size(); i += 2) {
    if (dict->items[i]->kind != PyKind::kStr) continue;
    auto value = PlainValueJson(dict->items[i + 1]);
    if (!value) continue;
    CatAppend(&json, first ? "" : ", ", JsonQuote(dict->items[i]->s), ": ", *value);
    first = false;
  }
  run.args_json = json + "}";
  return run;
}

}  // namespace leantron::ckpt
