// Human-readable summary of a checkpoint: `inspect checkpoint DIR`.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace leantron::ckpt {

// Prints the model config and its architecture (HF class, norm, MLP, positions with rope base and
// scaling, heads and query groups, biases, tied embeddings), the layout (stages and their layers),
// optimizer and training state, every shard file with its size, and every parameter's full shape,
// dtype, split rule and L2 norm (merged over tensor-parallel ranks, so the same model gives the
// same norms in any layout). `verify`: check the contents first (CheckpointReadOptions).
absl::Status PrintCheckpointSummary(const std::string& checkpoint_dir,
                                    std::optional<int64_t> iteration, std::ostream& out,
                                    bool verify = true);

}  // namespace leantron::ckpt
