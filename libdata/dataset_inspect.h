// `inspect dataset PREFIX`: what is in an indexed dataset, and which tokens a GPT sample holds.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "libdata/gpt2_tokenizer.h"

namespace leantron::data {

struct InspectDatasetOptions {
  std::string prefix;
  // Print the tokens of document k (all of its sequences), decoded when a vocabulary is given.
  std::optional<int64_t> document;
  VocabFiles vocab;  // empty: print ids only
  int histogram_buckets = 12;
};

// Writes a summary (counts, dtype, token total, a power-of-two length histogram) and the
// requested document to `out`.
absl::Status InspectDataset(const InspectDatasetOptions& options, std::ostream& out);

}  // namespace leantron::data
