// `inspect dataset`: what is in an indexed dataset, and which tokens a GPT sample holds.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "libdata/gpt_dataset.h"
#include "libdata/tokenizer.h"

namespace leantron::data {

struct InspectDatasetOptions {
  // One prefix, or a Megatron --data-path blend ("W1 P1 W2 P2 ..."): each prefix is summarized.
  std::vector<std::string> data_path;
  // Print the tokens of document k (all of its sequences) of the first prefix.
  std::optional<int64_t> document;
  // With a tokenizer's files (any --tokenizer-type), the text is printed beside the ids.
  TokenizerOptions tokenizer;
  int histogram_buckets = 12;

  // GPT samples: the dataset Megatron's training would build from data_path with these settings.
  std::optional<int64_t> sample;  // print sample k of `split_kind`
  GptDataConfig gpt;              // data_path is filled from the field above
  SplitKind split_kind = SplitKind::kTrain;
  // Write the index arrays and the first `export_samples` samples as .npy files into this
  // directory (for comparing with numpy): see docs/data.md for the file names.
  std::string export_dir;
  int64_t export_samples = 0;
};

absl::Status InspectDataset(const InspectDatasetOptions& options, std::ostream& out);

}  // namespace leantron::data
