#include "libckpt/inspect.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libckpt/checkpoint_reader.h"
#include "libckpt/hf_config.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {
namespace {

const char* SplitName(TpSplit split) {
  switch (split) {
    case TpSplit::kReplicated:
      return "replicated";
    case TpSplit::kRows:
      return "rows";
    case TpSplit::kColumns:
      return "columns";
    case TpSplit::kSwigluRows:
      return "swiglu-rows";
    case TpSplit::kVocabRows:
      return "vocab-rows";
  }
  return "";
}

double L2Norm(const Tensor& tensor) {
  double sum = 0;
  const size_t n = tensor.data.size() / DTypeSize(tensor.dtype);
  for (size_t i = 0; i < n; ++i) {
    const double v = ElementAsDouble(tensor.dtype, tensor.data.data(), i).value_or(0.0);
    sum += v * v;
  }
  return std::sqrt(sum);
}

// The architecture in the words a model card uses: which HF class it is, then norm, MLP,
// positions, attention, biases and embeddings.
std::string DescribeArchitecture(const ModelConfig& c) {
  std::string family;
  if (c.hf_architecture != HfArchitecture::kUnset) {
    family = Cat(HfArchitectureName(c.hf_architecture), " (recorded in the checkpoint)");
  } else if (auto inferred = HfArchitectureFor(c); inferred.ok()) {
    family = Cat(HfArchitectureName(*inferred), " (by its shape; no HF class recorded)");
  } else {
    family = "no HF class fits";
  }
  std::string positions;
  if (c.position_embedding_type == PositionEmbedding::kLearnedAbsolute) {
    positions = absl::StrFormat("learned_absolute, %d positions", c.max_position_embeddings);
  } else {
    positions = absl::StrFormat("rope, base %g", c.rotary_base);
    if (const RopeScaling& r = c.rope_scaling; r.llama3) {
      positions += absl::StrFormat(
          ", llama3 scaling (factor %g, low_freq_factor %g, high_freq_factor %g, "
          "original_max_position_embeddings %d)",
          r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position_embeddings);
    } else {
      positions += ", no scaling";
    }
  }
  const char* kind = c.num_query_groups == c.num_attention_heads ? "multi-head"
                     : c.num_query_groups == 1                   ? "multi-query"
                                                                 : "grouped-query";
  const char* biases = c.add_bias_linear && c.add_qkv_bias ? "every linear layer"
                       : c.add_qkv_bias                    ? "QKV only"
                       : c.add_bias_linear                 ? "every linear layer but QKV"
                                                           : "none";
  return absl::StrFormat(
      "architecture: %s\n  norm: %s, eps %g | MLP: %s, ffn %d | positions: %s\n"
      "  attention: %d heads / %d query groups (%s), head dim %d | biases: %s | embeddings: %s\n",
      family, ToAbsl(NormTypeName(c.normalization)), c.norm_epsilon,
      ToAbsl(ActivationName(c.activation)), c.ffn_hidden_size, positions, c.num_attention_heads,
      c.num_query_groups, kind, c.kv_channels, biases,
      c.untie_embeddings_and_output_weights ? "untied output layer" : "tied");
}

}  // namespace

absl::Status PrintCheckpointSummary(const std::string& checkpoint_dir,
                                    std::optional<int64_t> iteration, std::ostream& out,
                                    bool verify) {
  auto reader = CheckpointReader::Open(checkpoint_dir, iteration, {.verify = verify});
  if (!reader.ok()) return reader.status();
  const CheckpointMetadata& m = (*reader)->metadata();
  const ModelLayout& layout = (*reader)->layout();
  const ModelConfig& c = m.config;
  out << "checkpoint: " << (*reader)->iteration_dir() << "\n";
  out << "iteration: " << m.iteration << "   consumed samples: " << m.consumed_samples << "\n";
  out << absl::StrFormat(
      "model: %d layers, hidden %d, ffn %d, %d heads / %d query groups (head dim %d), vocab %d "
      "(padded %d), %s, %s, %s positions%s, %s embeddings, params %s\n",
      c.num_layers, c.hidden_size, c.ffn_hidden_size, c.num_attention_heads, c.num_query_groups,
      c.kv_channels, c.vocab_size, layout.padded_vocab_size(),
      ToAbsl(NormTypeName(c.normalization)), ToAbsl(ActivationName(c.activation)),
      ToAbsl(PositionEmbeddingName(c.position_embedding_type)),
      c.add_bias_linear ? ", biases" : ", no biases",
      c.untie_embeddings_and_output_weights ? "untied" : "tied", ToAbsl(DTypeName(c.params_dtype)));
  out << DescribeArchitecture(c);
  out << absl::StrFormat("layout: TP=%d PP=%d VPP=%d", m.parallel.tp, m.parallel.pp,
                         m.parallel.vpp);
  if (m.parallel.first_stage_layers > 0)
    out << "   decoder_first_pipeline_num_layers " << m.parallel.first_stage_layers;
  if (m.parallel.last_stage_layers > 0)
    out << "   decoder_last_pipeline_num_layers " << m.parallel.last_stage_layers;
  out << "\n";
  for (int pp = 0; pp < m.parallel.pp; ++pp) {
    std::vector<std::string> chunks;
    for (int v = 0; v < m.parallel.vpp; ++v) {
      auto [first, last] = layout.StageLayers(pp, v);
      chunks.push_back(absl::StrFormat("[%d, %d)", first, last));
    }
    out << "  stage " << pp << ": layers " << absl::StrJoin(chunks, " ") << "\n";
  }
  if (m.has_optimizer) {
    out << "optimizer: adam, step " << m.optimizer_step
        << " (fp32 main_param, exp_avg, exp_avg_sq per parameter)\n";
  } else {
    out << "optimizer: none\n";
  }
  out << "args: " << m.args_json << "\n";
  out << "files:\n";
  for (int pp = 0; pp < m.parallel.pp; ++pp) {
    for (int tp = 0; tp < m.parallel.tp; ++tp) {
      for (bool optimizer : {false, true}) {
        if (optimizer && !m.has_optimizer) continue;
        const SafetensorsFile& file = (*reader)->shard_file(tp, pp, optimizer);
        std::filesystem::path path(file.path());
        out << absl::StrFormat("  %-40s %12d bytes %5d tensors\n",
                               (path.parent_path().filename() / path.filename()).string(),
                               std::filesystem::file_size(path), file.tensors().size());
      }
    }
  }
  out << "parameters (full shapes, merged over TP):\n";
  Tensor full;
  for (const ParamSpec& spec : layout.params()) {
    if (!spec.tied_to.empty()) {
      out << absl::StrFormat("  %-52s tied copy of %s, in %s\n", spec.name, spec.tied_to,
                             layout.ShardDirName(0, spec.stage));
      continue;
    }
    if (auto s = (*reader)->ReadFull(spec, TensorKind::kParam, &full); !s.ok()) return s;
    // Which shard directories hold it: every TP rank of its stage.
    std::string files = layout.ShardDirName(0, spec.stage);
    if (m.parallel.tp > 1) files += ".." + layout.ShardDirName(m.parallel.tp - 1, spec.stage);
    out << absl::StrFormat("  %-52s %-14s %-5s %-12s %-32s norm %.6g\n", spec.name,
                           Cat("[", absl::StrJoin(spec.shape, ", "), "]"),
                           ToAbsl(DTypeName(full.dtype)), SplitName(spec.split), files,
                           L2Norm(full));
  }
  return absl::OkStatus();
}

}  // namespace leantron::ckpt
