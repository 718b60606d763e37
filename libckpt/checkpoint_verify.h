// Content checks of a checkpoint iteration, on top of the structural ones (names, shapes, dtypes)
// CheckpointReader always makes: what a load must not accept silently.
//   - every tensor's bytes against the XXH3-64 checksum its shard stored at save (checkpoints
//     whose metadata.json names "checksums"; older ones have none to compare);
//   - each shard file names the (tp, pp) rank directory it sits in (swapped directories);
//   - no NaN or infinity in any floating-point tensor;
//   - replicated tensors equal on every tensor-parallel rank;
//   - a parameter and its fp32 main_param agree to bf16 rounding.
// One pass over the data; a failure names the file and the tensor.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "libckpt/checkpoint_metadata.h"
#include "libckpt/layout.h"
#include "libckpt/safetensors.h"

namespace leantron::ckpt {

// The "__metadata__" entries a shard file carries (besides the checksums).
inline constexpr char kShardTpRankKey[] = "tp_rank";
inline constexpr char kShardPpRankKey[] = "pp_rank";
inline constexpr char kChecksumAlgorithm[] = "xxh3_64";

// `model_files` / `optimizer_files`: [pp][tp], the latter empty without optimizer state.
absl::Status VerifyCheckpointContent(
    const CheckpointMetadata& metadata, const ModelLayout& layout,
    const std::vector<std::vector<std::unique_ptr<SafetensorsFile>>>& model_files,
    const std::vector<std::vector<std::unique_ptr<SafetensorsFile>>>& optimizer_files);

// The checks on one tensor's bytes alone: its stored checksum (when `file` has one for it) and
// no NaN or infinity. Exposed for tests.
absl::Status VerifyTensorBytes(const SafetensorsFile& file, const TensorView& view);

}  // namespace leantron::ckpt
