// What a Megatron-LM checkpoint's saved arguments (the pickled argparse.Namespace `args`) say about
// the model, its parallel layout and the run: the bridge from Megatron's names to ModelConfig and
// ParallelConfig. Architectures Leantron's model does not have (MoE, QK layer norm, latent
// attention, scaled or partial rotary positions, ...) are refused here with the argument named.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "libckpt/layout.h"
#include "libckpt/model_config.h"
#include "libckpt/pickle.h"

namespace leantron::ckpt {

struct MegatronRun {
  ModelConfig config;
  ParallelConfig parallel;
  int64_t consumed_samples = 0;
  // The distributed optimizer and what decides its buffer layout (Megatron's DDP buckets).
  bool distributed_optimizer = false;
  int64_t data_parallel_size = 1;
  std::optional<int64_t> bucket_size;  // Elements per DDP bucket; unset: one bucket.
  bool overlap_param_gather_with_optimizer_step = false;
  bool fp32_training = false;  // Neither --bf16 nor --fp16: the model params are the main params.
  // The plain-valued arguments (numbers, strings, booleans, None, lists of those) as one JSON
  // object: carried into CheckpointMetadata::args_json and back into a written Namespace.
  std::string args_json = "{}";
};

// Reads the run from Megatron's `args` (an argparse.Namespace placeholder). `source` names the
// file.
absl::StatusOr<MegatronRun> MegatronRunFromArgs(const PyValue* args, std::string_view source);

// Typed lookups into a Namespace's attributes: nullopt when absent or None; an error when present
// with another type.
absl::StatusOr<std::optional<int64_t>> ArgInt(const PyValue* args, std::string_view name);
absl::StatusOr<std::optional<double>> ArgFloat(const PyValue* args, std::string_view name);
absl::StatusOr<std::optional<bool>> ArgBool(const PyValue* args, std::string_view name);
absl::StatusOr<std::optional<std::string>> ArgStr(const PyValue* args, std::string_view name);

// A plain Python value (None, bool, int, float, str, list/tuple of those, nested to depth 4) as
// JSON; nullopt for anything else.
std::optional<std::string> PlainValueJson(const PyValue* value);

}  // namespace leantron::ckpt
