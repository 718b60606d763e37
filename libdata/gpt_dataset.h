// The GPT sample dataset, computed exactly as Megatron-Core's GPTDataset, BlendedDataset and
// BlendedMegatronDatasetBuilder do (../shared/specs/data.md §4), so the same --data-path, --split,
// --seq-length and --seed give the same samples in the same order.
//
// Per (dataset, split): the document index (split's sequences tiled over epochs, shuffled with
// numpy's RandomState), the sample index (where each sample starts), the shuffle index. They are
// cached next to the data in one file per configuration — written atomically, named and checked
// by a key holding everything they depend on (the .idx identity, split range, sample count,
// sequence length, seed, ...) — and memory-mapped when found.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "libdata/indexed_dataset.h"
#include "libdata/mapped_file.h"

namespace leantron::data {

enum class SplitKind { kTrain = 0, kValid = 1, kTest = 2 };

// numpy.sum on a float64 vector (pairwise summation), then division: Megatron's normalize().
std::vector<double> NormalizeWeights(const std::vector<double>& weights);
// Megatron's parse_and_normalize_split: numbers by regex [.0-9]+, padded to 3, normalized.
absl::StatusOr<std::array<double, 3>> ParseSplit(const std::string& split);
// Cumulative bookends; a split of zero width is absent.
std::array<std::optional<std::pair<double, double>>, 3> SplitMatrix(const std::array<double, 3>& w);
// [round(lo*n), round(hi*n)) with round-half-to-even.
std::pair<int64_t, int64_t> SplitRange(const std::pair<double, double>& bookends, int64_t n);
// Megatron's train/valid/test sample counts from iteration counts.
std::array<int64_t, 3> RequestedSamples(int64_t train_iters, int64_t eval_interval,
                                        int64_t eval_iters, int64_t global_batch_size);

struct GptIndexParams {
  int64_t begin = 0;  // the split's sequences: [begin, end)
  int64_t end = 0;
  std::optional<int64_t> num_samples;  // none: exactly one epoch
  int32_t seq_length = 0;
  uint32_t seed = 1234;
  int32_t add_extra_token = 1;
  bool drop_last_partial_sequence = true;
};

// The three index arrays of one GPTDataset, in memory.
struct GptIndices {
  std::vector<int32_t> document_index;
  std::vector<int64_t> sample_index;  // [rows][2] flattened: (position in document_index, offset)
  std::vector<int64_t> shuffle_index;
  int64_t num_epochs = 0;
  bool separate_final_epoch = false;
};
absl::StatusOr<GptIndices> BuildGptIndices(const IndexedDataset& dataset, const GptIndexParams& p);

// Something that yields samples: a GptDataset or a blend of them.
class GptSampleSource {
 public:
  virtual ~GptSampleSource() = default;
  virtual int64_t size() const = 0;
  // Sets `text` to the seq_length + add_extra_token ids of sample i (tokens = text[:-1],
  // labels = text[1:]); a short final sample is padded with -1 as Megatron does.
  virtual absl::Status GetSample(int64_t i, std::vector<int64_t>* text) const = 0;
};

class GptDataset : public GptSampleSource {
 public:
  // cache_dir: where the index cache lives; empty disables caching.
  static absl::StatusOr<std::unique_ptr<GptDataset>> Build(
      std::shared_ptr<const IndexedDataset> dataset, const GptIndexParams& params,
      const std::string& cache_dir);

  int64_t size() const override { return static_cast<int64_t>(shuffle_index_.size()); }
  absl::Status GetSample(int64_t i, std::vector<int64_t>* text) const override;

  absl::Span<const int32_t> document_index() const { return document_index_; }
  absl::Span<const int64_t> sample_index() const { return sample_index_; }
  absl::Span<const int64_t> shuffle_index() const { return shuffle_index_; }
  int64_t num_epochs() const { return num_epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  std::optional<int64_t> num_samples() const { return params_.num_samples; }
  const std::string& cache_path() const { return cache_path_; }  // empty when not cached
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  GptDataset() = default;
  std::shared_ptr<const IndexedDataset> dataset_;
  GptIndexParams params_;
  GptIndices owned_;   // used when not memory-mapped
  MappedFile mapped_;  // the cache file, when mapped
  absl::Span<const int32_t> document_index_;
  absl::Span<const int64_t> sample_index_;
  absl::Span<const int64_t> shuffle_index_;
  int64_t num_epochs_ = 0;
  bool separate_final_epoch_ = false;
  std::string cache_path_;
  bool loaded_from_cache_ = false;
};

// Megatron's helpers.build_blending_indices.
void BuildBlendingIndices(const std::vector<double>& weights, int64_t size,
                          std::vector<int16_t>* dataset_index,
                          std::vector<int64_t>* dataset_sample_index);

class BlendedGptDataset : public GptSampleSource {
 public:
  // `weights` as BlendedDataset receives them (it normalizes them once more).
  static absl::StatusOr<std::unique_ptr<BlendedGptDataset>> Build(
      std::vector<std::unique_ptr<GptDataset>> datasets, const std::vector<double>& weights,
      int64_t size);

  int64_t size() const override { return static_cast<int64_t>(dataset_index_.size()); }
  absl::Status GetSample(int64_t i, std::vector<int64_t>* text) const override;
  const std::vector<int16_t>& dataset_index() const { return dataset_index_; }
  const std::vector<int64_t>& dataset_sample_index() const { return dataset_sample_index_; }
  const GptDataset& dataset(size_t i) const { return *datasets_[i]; }
  size_t num_datasets() const { return datasets_.size(); }

 private:
  std::vector<std::unique_ptr<GptDataset>> datasets_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

struct GptDataConfig {
  // Megatron's --data-path: "PREFIX", or "W1 PREFIX1 W2 PREFIX2 ...", or several prefixes.
  std::vector<std::string> data_path;
  std::string split = "969, 30, 1";
  int32_t seq_length = 1024;
  uint32_t seed = 1234;
  int32_t add_extra_token = 1;
  std::array<int64_t, 3> num_samples = {0, 0, 0};  // train, valid, test (RequestedSamples)
  bool drop_last_partial_validation_sequence = true;
  bool use_cache = true;
  std::string cache_dir;  // empty: beside each dataset's .idx
};

struct GptDataSplits {
  std::array<std::unique_ptr<GptSampleSource>, 3> split;  // null where the split is empty
};

// Megatron's BlendedMegatronDatasetBuilder(GPTDataset, sizes, ...).build() for config.blend.
absl::StatusOr<GptDataSplits> BuildGptDatasets(const GptDataConfig& config);

}  // namespace leantron::data
