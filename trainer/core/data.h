// Micro-batches for the training loop: libdata's GPT sample dataset (Megatron's GPTDataset and
// blending: --data-path, --split, --seq-length, --seed) or deterministic mock samples. Sample
// numbering follows Megatron's MegatronPretrainingSampler: iteration k's global batch is samples
// [consumed, consumed + global_batch); DP rank r's micro-batch j of it starts at
// consumed + j·micro·DP + r·micro. Every CP rank of a DP rank reads the same samples and keeps
// its chunks of them (Megatron's get_batch_on_this_cp_rank), after the long-context companions
// (Megatron's get_ltor_masks_and_position_ids) have been worked out on the whole samples.
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
  // --reset-position-ids, --reset-attention-mask, --eod-mask-loss, by the tokenizer's EOD.
  bool reset_position_ids = false, reset_attention_mask = false, eod_mask_loss = false;
  int64_t eod = -1;
  int cp_rank = 0, cp_size = 1;  // this rank's chunks of every sample (context_parallel.h)
};

// Megatron's get_ltor_masks_and_position_ids on whole samples `mb` (tokens and labels [count, T]):
// with eod_mask_loss no loss (label −1) where the input token is EOD; with reset_position_ids the
// positions restart at 0 after each EOD (the EOD ends its document); with reset_attention_mask
// every token's document (the number of EODs before it). Then this CP rank's chunks of tokens,
// labels and positions (documents stay whole: attention looks keys up by position).
void ShapeSamples(const DataOptions& options, int64_t count, MicroBatch* mb);

class BatchSource {
 public:
  static absl::StatusOr<std::unique_ptr<BatchSource>> Create(const DataOptions& options);

  bool has_split(data::SplitKind kind) const;
  // Samples [first, first + count) of `kind` as tokens/labels (padding → token 0, label −1),
  // shaped by ShapeSamples.
  absl::Status Get(data::SplitKind kind, int64_t first, int64_t count, MicroBatch* mb) const;

 private:
  DataOptions opt_;
  data::GptDataSplits splits_;
};

}  // namespace leantron::trainer
