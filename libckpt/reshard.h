// Moving checkpoints between parallel layouts. Both entry points go through the same path:
// CheckpointReader::ReadFull merges a parameter's shards into its full tensor (resizing padded
// vocabulary rows), and ModelLayout::ExtractShard cuts it for the target rank.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libckpt/checkpoint_metadata.h"
#include "libckpt/checkpoint_reader.h"
#include "libckpt/checkpoint_writer.h"
#include "libckpt/layout.h"
#include "libckpt/progress.h"
#include "libckpt/tensor.h"

namespace leantron::ckpt {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// One (tp, pp) rank's share of a checkpoint in a target layout: what a trainer rank loads.
struct RankState {
  CheckpointMetadata metadata;      // The saved metadata with `parallel` set to the target layout.
  std::vector<NamedTensor> params;  // ModelLayout::StageParams order; tied copies included.
  // Empty when the checkpoint has no optimizer state; else same order as params.
  std::vector<NamedTensor> main_params, exp_avg, exp_avg_sq;
};

// Loads the checkpoint saved under any layout (and in any format OpenCheckpoint reads) into rank
// (tp_rank, pp_rank) of `target`.
absl::StatusOr<RankState> LoadRankState(const std::string& checkpoint_dir,
                                        std::optional<int64_t> iteration,
                                        const ParallelConfig& target, int tp_rank, int pp_rank);

struct ReshardOptions {
  std::optional<int64_t> iteration;  // The tracker's when unset.
  ParallelConfig target;
  bool overwrite = false;  // See CheckSaveDestination.
  bool verify = true;      // Verify the source's checksums (CheckpointReader::Options).
  CheckpointFormat load_format = CheckpointFormat::kAuto;  // --load-format
  SaveFormat save_format = SaveFormat::kLeantron;          // --save-format
  // Megatron output: write the distributed optimizer's files (default: as the source's run did,
  // its args' use_distributed_optimizer).
  std::optional<bool> distributed_optimizer = std::nullopt;
  ProgressOptions progress = {};
};

// Rewrites a checkpoint in another layout (and, with save_format kMegatron, as Megatron-LM's torch
// format), optimizer state included, streaming one parameter at a
// time. The saved iteration becomes the target directory's latest. A destination that holds data
// is refused unless options.overwrite (CheckSaveDestination).
absl::Status ReshardCheckpoint(const std::string& load_dir, const std::string& save_dir,
                               const ReshardOptions& options);

}  // namespace leantron::ckpt
