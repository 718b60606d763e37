#include "libckpt/checkpoint_metadata.h"

#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "libckpt/strings.h"
#include "libfs/atomic_file.h"
#include "simdjson.h"

namespace leantron::ckpt {

std::string StoredTensorName(std::string_view param, TensorKind kind) {
  switch (kind) {
    case TensorKind::kParam:
      return std::string(param);
    case TensorKind::kMainParam:
      return Cat("main_param.", param);
    case TensorKind::kExpAvg:
      return Cat("exp_avg.", param);
    case TensorKind::kExpAvgSq:
      return Cat("exp_avg_sq.", param);
  }
  return "";
}

const char* FileNameForKind(TensorKind kind) {
  return kind == TensorKind::kParam ? kModelFileName : kOptimizerFileName;
}

std::string CheckpointMetadataToJson(const CheckpointMetadata& m, const ModelLayout& layout) {
  const ParallelConfig& p = m.parallel;
  std::string json = "{\n";
  CatAppend(&json, "  \"format\": \"leantron-checkpoint\",\n  \"format_version\": ", kFormatVersion,
            ",\n  \"iteration\": ", m.iteration, ",\n  \"consumed_samples\": ", m.consumed_samples,
            ",\n  \"model\": ", ModelConfigToJson(m.config), ",\n");
  CatAppend(&json, "  \"parallel\": {\"tensor_model_parallel_size\": ", p.tp,
            ", \"pipeline_model_parallel_size\": ", p.pp,
            ", \"virtual_pipeline_model_parallel_size\": ", p.vpp);
  // Megatron's argument names; written only for an uneven split, so even layouts read as before.
  if (p.first_stage_layers != 0) {
    CatAppend(&json, ", \"decoder_first_pipeline_num_layers\": ", p.first_stage_layers);
  }
  if (p.last_stage_layers != 0) {
    CatAppend(&json, ", \"decoder_last_pipeline_num_layers\": ", p.last_stage_layers);
  }
  json += "},\n";
  // The layout block is descriptive (for people and other languages); loaders recompute it.
  CatAppend(&json, "  \"layout\": {\"padded_vocab_size\": ", layout.padded_vocab_size(),
            ", \"stages\": [");
  for (int pp = 0; pp < p.pp; ++pp) {
    CatAppend(&json, pp ? ", " : "", "{\"pp_rank\": ", pp, ", \"layers\": [");
    for (int v = 0; v < p.vpp; ++v) {
      auto [first, last] = layout.StageLayers(pp, v);
      CatAppend(&json, v ? ", " : "", "[", first, ", ", last, "]");
    }
    json += "]}";
  }
  json += "]},\n";
  if (m.has_optimizer) {
    CatAppend(&json, "  \"optimizer\": {\"type\": \"adam\", \"step\": ", m.optimizer_step,
              ", \"state\": [\"main_param\", \"exp_avg\", \"exp_avg_sq\"]},\n");
  } else {
    json += "  \"optimizer\": null,\n";
  }
  if (m.checksums) json += "  \"checksums\": \"xxh3_64\",\n";
  CatAppend(&json, "  \"args\": ", m.args_json.empty() ? "{}" : m.args_json, ",\n  \"shards\": [");
  bool first = true;
  for (int pp = 0; pp < p.pp; ++pp) {
    for (int tp = 0; tp < p.tp; ++tp) {
      CatAppend(&json, first ? "\n" : ",\n", "    {\"tp_rank\": ", tp, ", \"pp_rank\": ", pp,
                ", \"dir\": \"", layout.ShardDirName(tp, pp), "\"}");
      first = false;
    }
  }
  json += "\n  ]\n}\n";
  return json;
}

absl::StatusOr<CheckpointMetadata> ParseCheckpointMetadata(std::string_view json,
                                                           std::string_view source) {
  auto fail = [&](std::string_view what) {
    return absl::InvalidArgumentError(Cat(source, ": ", what));
  };
  simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (parser.parse(json.data(), json.size()).get(root) != simdjson::SUCCESS) {
    return fail("not a JSON object");
  }
  std::string_view format;
  int64_t version = 0;
  if (root["format"].get(format) != simdjson::SUCCESS || format != "leantron-checkpoint") {
    return fail("not a leantron checkpoint (\"format\" is not \"leantron-checkpoint\")");
  }
  if (root["format_version"].get(version) != simdjson::SUCCESS || version != kFormatVersion) {
    return fail(Cat("unsupported format_version (this build reads ", kFormatVersion, ")"));
  }
  CheckpointMetadata m;
  simdjson::dom::element model, args, optimizer;
  simdjson::dom::object parallel;
  if (root["iteration"].get(m.iteration) != simdjson::SUCCESS ||
      root["consumed_samples"].get(m.consumed_samples) != simdjson::SUCCESS ||
      root["model"].get(model) != simdjson::SUCCESS ||
      root["parallel"].get(parallel) != simdjson::SUCCESS) {
    return fail("missing iteration, consumed_samples, model or parallel");
  }
  auto config = ModelConfigFromJson(simdjson::minify(model));
  if (!config.ok()) return fail(std::string(config.status().message()));
  m.config = *config;
  int64_t tp, pp, vpp;
  if (parallel["tensor_model_parallel_size"].get(tp) != simdjson::SUCCESS ||
      parallel["pipeline_model_parallel_size"].get(pp) != simdjson::SUCCESS ||
      parallel["virtual_pipeline_model_parallel_size"].get(vpp) != simdjson::SUCCESS) {
    return fail("parallel sizes missing");
  }
  // Bounded before anything is sized by them (a layout allocates per stage and chunk).
  for (auto [name, n] :
       {std::pair{"tensor_model_parallel_size", tp}, std::pair{"pipeline_model_parallel_size", pp},
        std::pair{"virtual_pipeline_model_parallel_size", vpp}}) {
    if (n < 1 || n > kMaxParallelSize) {
      return fail(Cat("parallel.", name, " ", n, " is outside [1, ", kMaxParallelSize, "]"));
    }
  }
  if (pp * vpp > m.config.num_layers) {
    return fail(Cat("pipeline_model_parallel_size x virtual_pipeline_model_parallel_size ",
                    pp * vpp, " exceeds num_layers ", m.config.num_layers));
  }
  if (m.iteration < -1 || m.consumed_samples < 0) {
    return fail("iteration or consumed_samples is negative");
  }
  m.parallel = {static_cast<int>(tp), static_cast<int>(pp), static_cast<int>(vpp)};
  // Optional (absent: an even split); the layout checks the numbers when the checkpoint is opened.
  for (auto [key, out] :
       {std::pair{"decoder_first_pipeline_num_layers", &m.parallel.first_stage_layers},
        std::pair{"decoder_last_pipeline_num_layers", &m.parallel.last_stage_layers}}) {
    simdjson::dom::element value;
    if (parallel[key].get(value) != simdjson::SUCCESS || value.is_null()) continue;
    int64_t n;
    if (value.get(n) != simdjson::SUCCESS || n < 0 || n > std::numeric_limits<int>::max()) {
      return fail(Cat("parallel.", key, " is not a layer count"));
    }
    *out = static_cast<int>(n);
  }
  if (root["optimizer"].get(optimizer) == simdjson::SUCCESS && !optimizer.is_null()) {
    m.has_optimizer = true;
    if (optimizer["step"].get(m.optimizer_step) != simdjson::SUCCESS) {
      return fail("optimizer.step missing");
    }
  }
  if (root["args"].get(args) == simdjson::SUCCESS) m.args_json = simdjson::minify(args);
  simdjson::dom::element checksums;
  if (root["checksums"].get(checksums) == simdjson::SUCCESS && !checksums.is_null()) {
    std::string_view algorithm;
    if (checksums.get(algorithm) != simdjson::SUCCESS || algorithm != "xxh3_64") {
      return fail("unsupported \"checksums\" (this build reads \"xxh3_64\")");
    }
    m.checksums = true;
  }
  return m;
}

std::string IterationDirName(int64_t iteration) {
  if (iteration < 0) return "release";
  return absl::StrFormat("iter_%07d", iteration);
}

absl::StatusOr<int64_t> ReadLatestIteration(const std::string& checkpoint_dir) {
  const std::string path = (std::filesystem::path(checkpoint_dir) / kTrackerFileName).string();
  auto text = fs::ReadFileToString(path);
  if (!text.ok()) {
    return absl::NotFoundError(
        Cat(path, ": missing; is ", checkpoint_dir, " a checkpoint directory?"));
  }
  std::string trimmed(absl::StripAsciiWhitespace(*text));
  if (trimmed == "release") return -1;
  int64_t iteration;
  if (!absl::SimpleAtoi(trimmed, &iteration) || iteration < 0) {
    return absl::InvalidArgumentError(Cat(path, ": not an iteration number: '", trimmed, "'"));
  }
  return iteration;
}

absl::StatusOr<std::string> ResolveIterationDir(const std::string& checkpoint_dir,
                                                std::optional<int64_t> iteration) {
  int64_t it;
  if (iteration.has_value()) {
    it = *iteration;
  } else {
    auto latest = ReadLatestIteration(checkpoint_dir);
    if (!latest.ok()) return latest.status();
    it = *latest;
  }
  std::string dir = (std::filesystem::path(checkpoint_dir) / IterationDirName(it)).string();
  if (!std::filesystem::is_directory(dir)) {
    return absl::NotFoundError(Cat(dir, ": no such checkpoint iteration directory"));
  }
  return dir;
}

}  // namespace leantron::ckpt
