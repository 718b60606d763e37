// Megatron's `torch_dist` checkpoint format (megatron_reader.h).
#include "libckpt/megatron_reader.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {

absl::StatusOr<std::unique_ptr<CheckpointSource>> OpenMegatronDistCheckpoint(
    const std::string& iteration_dir, CheckpointReadOptions options) {
  return absl::UnimplementedError(Cat(iteration_dir, ": torch_dist not yet"));
}

}  // namespace leantron::ckpt
