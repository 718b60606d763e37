// Micro-batches for the training loop: libdata's GPT sample dataset (Megatron's GPTDataset and
// blending: --data-path, --split, --seq-length, --seed) or deterministic mock samples. Sample
// numbering follows Megatron's MegatronPretrainingSampler: iteration k's global batch is samples
// [consumed, consumed + global_batch); DP rank r's micro-batch j of it starts at
// consumed + j·micro·DP + r·micro.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "libdata/gpt_dataset.h"
#include "trainer/core/stage_model.h"

namespace leantron::trainer {

struct DataOptions {
  bool mock = false;
  std::vector<std::string> data_path;
  std::string split = "969, 30, 1";
  int64_t seq_length = 0;
  uint32_t seed = 1234;
  int64_t train_iters = 0, eval_interval = 1000, eval_iters = 100, global_batch = 1;
  int64_t vocab_size = 0;  // true vocabulary; every token id must be below it
  std::string cache_dir;   // index cache; empty: beside the data
};

class BatchSource {
 public:
  static absl::StatusOr<std::unique_ptr<BatchSource>> Create(const DataOptions& options);

  bool has_split(data::SplitKind kind) const;
  // Samples [first, first + count) of `kind` as tokens/labels (padding → token 0, label −1).
  absl::Status Get(data::SplitKind kind, int64_t first, int64_t count, MicroBatch* mb) const;

 private:
  DataOptions opt_;
  data::GptDataSplits splits_;
};

}  // namespace leantron::trainer
