// The project's checkpoint directory (docs/checkpoint-format.md): Megatron's directory shape with
// safetensors shards and one metadata.json per iteration.
//
//   <dir>/latest_checkpointed_iteration.txt     "100"; written last
//   <dir>/iter_0000100/metadata.json            model config, layout, iteration, optimizer, args
//   <dir>/iter_0000100/mp_rank_{tp:02d}[_{pp:03d}]/model.safetensors
//   <dir>/iter_0000100/mp_rank_{tp:02d}[_{pp:03d}]/optimizer.safetensors   (when saved)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "libckpt/layout.h"
#include "libckpt/model_config.h"

namespace leantron::ckpt {

inline constexpr char kTrackerFileName[] = "latest_checkpointed_iteration.txt";
inline constexpr char kMetadataFileName[] = "metadata.json";
inline constexpr char kModelFileName[] = "model.safetensors";
inline constexpr char kOptimizerFileName[] = "optimizer.safetensors";
inline constexpr int kFormatVersion = 1;
// Largest TP, PP or VPP size a metadata.json may name.
inline constexpr int64_t kMaxParallelSize = 1 << 16;

// What a shard file holds for one parameter. Optimizer state is float32 and sharded exactly like
// the parameter, so it does not depend on the data-parallel size.
enum class TensorKind { kParam, kMainParam, kExpAvg, kExpAvgSq };
inline constexpr TensorKind kOptimizerKinds[] = {TensorKind::kMainParam, TensorKind::kExpAvg,
                                                 TensorKind::kExpAvgSq};
// "embedding.word_embeddings.weight" / "exp_avg.embedding.word_embeddings.weight" / ...
std::string StoredTensorName(std::string_view param, TensorKind kind);
const char* FileNameForKind(TensorKind kind);

struct CheckpointMetadata {
  ModelConfig config;
  ParallelConfig parallel;
  int64_t iteration = 0;  // -1 means Megatron's "release".
  int64_t consumed_samples = 0;
  bool has_optimizer = false;
  int64_t optimizer_step = 0;    // Adam step count (bias correction).
  std::string args_json = "{}";  // Training arguments, one JSON object kept verbatim.
  // Every shard file stores each tensor's XXH3-64 checksum and its (tp, pp) rank ("checksums":
  // "xxh3_64" in metadata.json); false for checkpoints written before checksums existed.
  bool checksums = false;
};

std::string CheckpointMetadataToJson(const CheckpointMetadata& metadata, const ModelLayout& layout);
absl::StatusOr<CheckpointMetadata> ParseCheckpointMetadata(std::string_view json,
                                                           std::string_view source);

// "iter_0000100", or "release" for -1.
std::string IterationDirName(int64_t iteration);
// Reads the tracker file: the iteration a loader should use by default.
absl::StatusOr<int64_t> ReadLatestIteration(const std::string& checkpoint_dir);
// Directory of `iteration` (or of the tracker's iteration when unset), checked to exist.
absl::StatusOr<std::string> ResolveIterationDir(const std::string& checkpoint_dir,
                                                std::optional<int64_t> iteration);

}  // namespace leantron::ckpt
