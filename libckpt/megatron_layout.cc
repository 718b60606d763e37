#include "libckpt/megatron_layout.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {
namespace {

constexpr std::string_view kLayers = "decoder.layers.";

// Megatron-Core layer suffixes with TransformerEngine's fused-norm spellings mapped to the local
// implementation's (which are the canonical names).
std::string CanonicalSuffix(std::string_view suffix) {
  static constexpr std::pair<std::string_view, std::string_view> kFused[] = {
      {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
      {"self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"},
      {"mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"},
      {"mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"},
  };
  for (const auto& [from, to] : kFused) {
    if (suffix == from) return std::string(to);
  }
  return std::string(suffix);
}

// Pre-Megatron-Core (`language_model.encoder`) layer suffixes.
std::string LegacyLayerSuffix(std::string_view suffix) {
  static constexpr std::pair<std::string_view, std::string_view> kOld[] = {
      {"self_attention.query_key_value.", "self_attention.linear_qkv."},
      {"self_attention.dense.", "self_attention.linear_proj."},
      {"post_attention_layernorm.", "pre_mlp_layernorm."},
      {"mlp.dense_h_to_4h.", "mlp.linear_fc1."},
      {"mlp.dense_4h_to_h.", "mlp.linear_fc2."},
      {"input_layernorm.", "input_layernorm."},
  };
  for (const auto& [from, to] : kOld) {
    if (absl::StartsWith(ToAbsl(suffix), ToAbsl(from))) {
      return Cat(to, suffix.substr(from.size()));
    }
  }
  return "";
}

// "<digits>.<rest>" -> (index, rest).
std::optional<std::pair<int64_t, std::string_view>> SplitIndex(std::string_view s) {
  const size_t dot = s.find('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  int64_t index = 0;
  if (!std::all_of(s.begin(), s.begin() + dot, [](char c) { return absl::ascii_isdigit(c); }) ||
      !absl::SimpleAtoi(ToAbsl(s.substr(0, dot)), &index)) {
    return std::nullopt;
  }
  return std::make_pair(index, s.substr(dot + 1));
}

bool IsExtraState(std::string_view name) {
  return name == "_extra_state" || absl::EndsWith(ToAbsl(name), "._extra_state");
}

// Order of a layer parameter within Megatron's TransformerLayer.named_parameters().
int MegatronSuffixRank(std::string_view suffix) {
  static constexpr std::string_view kOrder[] = {"input_layernorm.",
                                                "self_attention.linear_proj.",
                                                "self_attention.linear_qkv.",
                                                "pre_mlp_layernorm.",
                                                "mlp.linear_fc1.",
                                                "mlp.linear_fc2."};
  for (size_t i = 0; i < std::size(kOrder); ++i) {
    if (absl::StartsWith(ToAbsl(suffix), ToAbsl(kOrder[i]))) {
      return static_cast<int>(i) * 2 + (absl::EndsWith(ToAbsl(suffix), ".bias") ? 1 : 0);
    }
  }
  return 100;
}

int64_t PadTo(int64_t value, int64_t divisor) { return (value + divisor - 1) / divisor * divisor; }

}  // namespace

std::optional<std::string> CanonicalFromLegacyName(const ModelLayout& layout, int pp_rank,
                                                   int virtual_chunk, std::string_view name) {
  if (IsExtraState(name)) return std::nullopt;
  const auto stage_layers = layout.StageLayers(pp_rank, virtual_chunk);
  const int64_t first = stage_layers.first, last = stage_layers.second;
  auto layer_name = [&](int64_t local, std::string_view suffix) -> std::string {
    if (local < 0 || local >= last - first || suffix.empty()) return "";
    return Cat(kLayers, first + local, ".", suffix);
  };
  if (absl::StartsWith(ToAbsl(name), ToAbsl(kLayers))) {
    auto split = SplitIndex(name.substr(kLayers.size()));
    if (!split) return "";
    return layer_name(split->first, CanonicalSuffix(split->second));
  }
  constexpr std::string_view kOldLayers = "language_model.encoder.layers.";
  if (absl::StartsWith(ToAbsl(name), ToAbsl(kOldLayers))) {
    auto split = SplitIndex(name.substr(kOldLayers.size()));
    if (!split) return "";
    return layer_name(split->first, LegacyLayerSuffix(split->second));
  }
  static constexpr std::pair<std::string_view, std::string_view> kGlobal[] = {
      {"embedding.word_embeddings.weight", "embedding.word_embeddings.weight"},
      {"embedding.position_embeddings.weight", "embedding.position_embeddings.weight"},
      {"decoder.final_layernorm.weight", "decoder.final_layernorm.weight"},
      {"decoder.final_layernorm.bias", "decoder.final_layernorm.bias"},
      {"output_layer.weight", "output_layer.weight"},
      {"language_model.embedding.word_embeddings.weight", "embedding.word_embeddings.weight"},
      {"language_model.embedding.position_embeddings.weight",
       "embedding.position_embeddings.weight"},
      {"language_model.encoder.final_layernorm.weight", "decoder.final_layernorm.weight"},
      {"language_model.encoder.final_layernorm.bias", "decoder.final_layernorm.bias"},
      {"language_model.encoder.final_norm.weight", "decoder.final_layernorm.weight"},
      {"language_model.encoder.final_norm.bias", "decoder.final_layernorm.bias"},
      {"language_model.output_layer.weight", "output_layer.weight"},
      {"word_embeddings_for_head.weight", "output_layer.weight"},
  };
  for (const auto& [from, to] : kGlobal) {
    if (name == from) return std::string(to);
  }
  return "";
}

std::string LegacyNameOf(const ModelLayout& layout, const ParamSpec& spec) {
  if (spec.layer < 0) return spec.name;
  const int first = layout.StageLayers(spec.stage, spec.virtual_chunk).first;
  const std::string prefix = Cat(kLayers, spec.layer, ".");
  return Cat(kLayers, spec.layer - first, ".", std::string_view(spec.name).substr(prefix.size()));
}

std::optional<DistKeyTarget> CanonicalFromDistKey(std::string_view key) {
  if (absl::StartsWith(ToAbsl(key), ToAbsl(kLayers))) {
    const std::string_view rest = key.substr(kLayers.size());
    if (auto split = SplitIndex(rest)) {
      return DistKeyTarget{Cat(kLayers, split->first, ".", CanonicalSuffix(split->second)), false};
    }
    if (rest.empty()) return std::nullopt;
    return DistKeyTarget{CanonicalSuffix(rest), true};
  }
  static constexpr std::string_view kGlobal[] = {
      "embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
      "decoder.final_layernorm.weight", "decoder.final_layernorm.bias", "output_layer.weight"};
  for (std::string_view name : kGlobal) {
    if (key == name) return DistKeyTarget{std::string(name), false};
  }
  return std::nullopt;
}

std::vector<const ParamSpec*> MegatronParamOrder(const ModelLayout& layout, int pp_rank,
                                                 int virtual_chunk) {
  std::vector<const ParamSpec*> out;
  for (const ParamSpec& spec : layout.params()) {
    if (spec.stage == pp_rank && spec.virtual_chunk == virtual_chunk) out.push_back(&spec);
  }
  // Our layout lists a layer's parameters qkv first; Megatron registers linear_proj first.
  for (size_t begin = 0; begin < out.size();) {
    size_t end = begin + 1;
    while (end < out.size() && out[begin]->layer >= 0 && out[end]->layer == out[begin]->layer) {
      ++end;
    }
    if (out[begin]->layer >= 0) {
      const size_t prefix = Cat(kLayers, out[begin]->layer, ".").size();
      std::stable_sort(out.begin() + begin, out.begin() + end,
                       [&](const ParamSpec* a, const ParamSpec* b) {
                         return MegatronSuffixRank(std::string_view(a->name).substr(prefix)) <
                                MegatronSuffixRank(std::string_view(b->name).substr(prefix));
                       });
    }
    begin = end;
  }
  return out;
}

BufferLayout MegatronBufferLayout(const ModelLayout& layout, int pp_rank, int virtual_chunk,
                                  std::optional<int64_t> bucket_size, int64_t data_parallel_size) {
  const ParallelConfig& p = layout.parallel();
  const bool tied = !layout.config().untie_embeddings_and_output_weights;
  // A tied embedding kept on two pipeline stages has a bucket of its own (its gradient is
  // all-reduced across the stages).
  auto shared = [&](const ParamSpec& spec) {
    if (!tied || p.pp == 1) return false;
    if (spec.name == "embedding.word_embeddings.weight") return pp_rank == 0 && virtual_chunk == 0;
    return spec.name == "output_layer.weight";
  };
  const int64_t end_divisor = std::lcm(std::max<int64_t>(data_parallel_size, 1), int64_t{128});
  BufferLayout out;
  std::vector<int64_t> bucket_starts;
  int64_t param_start = 0, bucket_start = 0, param_end = 0;
  int bucket = 0;
  bool bucket_has_params = false;
  auto finalize = [&](int64_t end) {
    out.bucket_unpadded.push_back(end - bucket_start);
    bucket_starts.push_back(bucket_start);
    bucket_start = PadTo(end, end_divisor);
    ++bucket;
    bucket_has_params = false;
  };
  std::vector<const ParamSpec*> order = MegatronParamOrder(layout, pp_rank, virtual_chunk);
  std::vector<int64_t> starts(order.size());
  std::vector<int> buckets(order.size());
  for (size_t k = order.size(); k-- > 0;) {
    const ParamSpec& spec = *order[k];
    param_start = PadTo(param_start, 64);
    if (shared(spec) && bucket_has_params) {
      finalize(param_start);
      param_start = bucket_start;
    }
    param_end = param_start + NumElements(layout.ShardShape(spec));
    starts[k] = param_start;
    buckets[k] = bucket;
    bucket_has_params = true;
    if ((bucket_size && param_end - bucket_start >= *bucket_size) || shared(spec)) {
      finalize(param_end);
      param_start = bucket_start;
    } else {
      param_start = param_end;
    }
  }
  if (bucket_has_params) finalize(param_end);
  std::vector<int64_t> before(out.bucket_unpadded.size() + 1, 0);
  for (size_t b = 0; b < out.bucket_unpadded.size(); ++b) {
    before[b + 1] = before[b] + out.bucket_unpadded[b];
  }
  out.numel_unpadded = before.back();
  for (size_t k = 0; k < order.size(); ++k) {
    BufferParam param;
    param.spec = order[k];
    param.numel = NumElements(layout.ShardShape(*order[k]));
    param.bucket = buckets[k];
    param.bucket_offset = starts[k] - bucket_starts[buckets[k]];
    param.world_offset = before[buckets[k]] + param.bucket_offset;
    out.params.push_back(param);
  }
  return out;
}

bool MegatronNoWeightDecay(const ParamSpec& spec) {
  return spec.shape.size() == 1 || absl::EndsWith(ToAbsl(spec.name), ".bias");
}

}  // namespace leantron::ckpt
