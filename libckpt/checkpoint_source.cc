#include "libckpt/checkpoint_source.h"

#include "libckpt/megatron_reader.h"
#include "libckpt/strings.h"

namespace leantron::ckpt {

absl::StatusOr<CheckpointFormat> ParseCheckpointFormat(std::string_view name) {
  if (name.empty() || name == "auto") return CheckpointFormat::kAuto;
  if (name == "leantron") return CheckpointFormat::kLeantron;
  if (name == "megatron") return CheckpointFormat::kMegatron;
  return absl::InvalidArgumentError(
      Cat("unknown checkpoint format '", name, "' (auto, leantron or megatron)"));
}

absl::StatusOr<std::unique_ptr<CheckpointSource>> OpenCheckpoint(const std::string& checkpoint_dir,
                                                                 std::optional<int64_t> iteration,
                                                                 CheckpointReadOptions options) {
  auto dir = ResolveIterationDir(checkpoint_dir, iteration);
  if (!dir.ok()) return dir.status();
  const std::string format = DetectIterationFormat(*dir);
  const bool megatron = format == "torch" || format == "torch_dist";
  if (options.format == CheckpointFormat::kMegatron && !megatron) {
    return absl::InvalidArgumentError(
        Cat(*dir, format == "leantron" ? ": is a Leantron checkpoint, not a Megatron one"
                                       : ": holds no Megatron checkpoint (neither .metadata nor "
                                         "mp_rank_*/model_optim_rng.pt)"));
  }
  if (options.format == CheckpointFormat::kLeantron && megatron) {
    return absl::InvalidArgumentError(
        Cat(*dir, ": is a Megatron ", format, " checkpoint (read it with --load-format megatron)"));
  }
  if (format == "torch") return OpenMegatronTorchCheckpoint(*dir, options);
  if (format == "torch_dist") return OpenMegatronDistCheckpoint(*dir, options);
  auto reader = CheckpointReader::Open(checkpoint_dir, iteration, options);
  if (!reader.ok()) return reader.status();
  return std::unique_ptr<CheckpointSource>(*std::move(reader));
}

}  // namespace leantron::ckpt
