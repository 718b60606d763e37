// Opening a checkpoint of any format the tools read: the project's own (checkpoint_reader.h) or
// Megatron-LM's `torch` and `torch_dist` (megatron_reader.h), told apart by the iteration's files.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "libckpt/checkpoint_reader.h"

namespace leantron::ckpt {

// Opens `iteration` of `checkpoint_dir` (the tracker's when unset). With options.format kAuto the
// format is detected; kLeantron or kMegatron refuse the other kind with a clear error.
absl::StatusOr<std::unique_ptr<CheckpointSource>> OpenCheckpoint(
    const std::string& checkpoint_dir, std::optional<int64_t> iteration,
    CheckpointReadOptions options = {});

// "leantron" | "megatron" -> the option value; an error names the accepted values.
absl::StatusOr<CheckpointFormat> ParseCheckpointFormat(std::string_view name);

}  // namespace leantron::ckpt
