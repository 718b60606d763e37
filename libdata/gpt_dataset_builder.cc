// BuildGptDatasets: Megatron's BlendedMegatronDatasetBuilder for GPTDataset with config.blend
// (one --data-path for all splits): single dataset, weighted blend, or unweighted blend.
#include <cmath>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libdata/gpt_dataset.h"

namespace leantron::data {
namespace {

// Megatron's mid_level_dataset_surplus default: each blended dataset builds 0.5% extra samples.
constexpr double kMidLevelSurplus = 0.005;

struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;
};

// Megatron's get_blend_from_list: pairs "weight prefix" when every weight parses as a float.
Blend ParseBlend(const std::vector<std::string>& list) {
  Blend blend;
  if (list.size() % 2 == 0) {
    std::vector<double> weights;
    std::vector<std::string> prefixes;
    bool all = true;
    for (size_t i = 0; i < list.size(); i += 2) {
      double w;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(list[i]), &w)) {
        all = false;
        break;
      }
      weights.push_back(w);
      prefixes.emplace_back(absl::StripAsciiWhitespace(list[i + 1]));
    }
    if (all) {
      blend.prefixes = std::move(prefixes);
      blend.weights = std::move(weights);
      return blend;
    }
  }
  for (const std::string& p : list) blend.prefixes.emplace_back(absl::StripAsciiWhitespace(p));
  return blend;
}

std::string CacheDirFor(const GptDataConfig& config, const std::string& prefix) {
  if (!config.use_cache) return "";
  if (!config.cache_dir.empty()) return config.cache_dir;
  const std::filesystem::path parent = std::filesystem::path(prefix).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

using Splits = std::array<std::unique_ptr<GptDataset>, 3>;

// _build_megatron_dataset_splits for one prefix.
absl::StatusOr<Splits> BuildSplits(const GptDataConfig& config, const std::string& prefix,
                                   const std::array<std::optional<std::pair<double, double>>, 3>& m,
                                   const std::array<std::optional<int64_t>, 3>& sizes) {
  absl::StatusOr<IndexedDataset> opened = IndexedDataset::Open(prefix);
  if (!opened.ok()) return opened.status();
  auto ds = std::make_shared<const IndexedDataset>(*std::move(opened));
  if (ds->num_sequences() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix,
                     ": the dataset is empty (0 documents): nothing to make samples from (was the "
                     "corpus empty, or every document blank?)"));
  }
  Splits out;
  for (int j = 0; j < 3; ++j) {
    if (!m[j]) continue;
    const auto [begin, end] = SplitRange(*m[j], ds->num_sequences());
    // Megatron would loop forever on a split that rounds to no sequence; leave it absent.
    if (begin == end) continue;
    GptIndexParams params;
    params.begin = begin;
    params.end = end;
    params.num_samples = sizes[j];
    params.seq_length = config.seq_length;
    params.seed = config.seed;
    params.add_extra_token = config.add_extra_token;
    params.drop_last_partial_sequence = j == static_cast<int>(SplitKind::kValid)
                                            ? config.drop_last_partial_validation_sequence
                                            : true;
    absl::StatusOr<std::unique_ptr<GptDataset>> built =
        GptDataset::Build(ds, params, CacheDirFor(config, prefix));
    if (!built.ok()) return built.status();
    out[j] = *std::move(built);
  }
  return out;
}

}  // namespace

absl::StatusOr<GptDataSplits> BuildGptDatasets(const GptDataConfig& config) {
  if (config.data_path.empty()) return absl::InvalidArgumentError("no --data-path");
  const Blend blend = ParseBlend(config.data_path);
  absl::StatusOr<std::array<double, 3>> split = ParseSplit(config.split);
  if (!split.ok()) return split.status();
  const auto matrix = SplitMatrix(*split);
  GptDataSplits result;

  if (blend.prefixes.size() == 1 && !blend.weights) {
    const std::array<std::optional<int64_t>, 3> sizes = {
        config.num_samples[0], config.num_samples[1], config.num_samples[2]};
    absl::StatusOr<Splits> splits = BuildSplits(config, blend.prefixes[0], matrix, sizes);
    if (!splits.ok()) return splits.status();
    for (int j = 0; j < 3; ++j) result.split[j] = std::move((*splits)[j]);
    return result;
  }

  const size_t n = blend.prefixes.size();
  std::vector<double> weights;
  std::vector<std::array<int64_t, 3>> target(n);
  std::vector<Splits> per_dataset;
  if (blend.weights) {
    weights = NormalizeWeights(*blend.weights);
    for (size_t i = 0; i < n; ++i) {
      std::array<std::optional<int64_t>, 3> buffer;
      for (int j = 0; j < 3; ++j) {
        const double t = std::ceil(static_cast<double>(config.num_samples[j]) * weights[i]);
        target[i][j] = static_cast<int64_t>(t);
        buffer[j] = static_cast<int64_t>(std::ceil(t * (1.0 + kMidLevelSurplus)));
      }
      absl::StatusOr<Splits> splits = BuildSplits(config, blend.prefixes[i], matrix, buffer);
      if (!splits.ok()) return splits.status();
      per_dataset.push_back(*std::move(splits));
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      absl::StatusOr<Splits> splits = BuildSplits(config, blend.prefixes[i], matrix, {});
      if (!splits.ok()) return splits.status();
      per_dataset.push_back(*std::move(splits));
    }
  }
  for (int j = 0; j < 3; ++j) {
    if (!matrix[j]) continue;
    std::vector<std::unique_ptr<GptDataset>> datasets;
    std::vector<double> weights_j;
    int64_t size = 0;
    bool complete = true;
    for (size_t i = 0; i < n; ++i) complete = complete && per_dataset[i][j] != nullptr;
    if (!complete) continue;  // Some dataset is too small to have this split at all.
    for (size_t i = 0; i < n; ++i) {
      if (blend.weights) {
        weights_j.push_back(weights[i]);
        size += target[i][j];
      } else {
        weights_j.push_back(static_cast<double>(per_dataset[i][j]->size()));
        size += per_dataset[i][j]->size();
      }
      datasets.push_back(std::move(per_dataset[i][j]));
    }
    if (!blend.weights) size = std::min(size, config.num_samples[j]);
    absl::StatusOr<std::unique_ptr<BlendedGptDataset>> blended =
        BlendedGptDataset::Build(std::move(datasets), weights_j, size);
    if (!blended.ok()) return blended.status();
    result.split[j] = *std::move(blended);
  }
  return result;
}

}  // namespace leantron::data
