// Conversion between HuggingFace folders (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM) and the project's checkpoints. The checkpoint records the class it came from
// (ModelConfig::hf_architecture), which export writes back. Import reads HF tensors as a
// FullTensorSource, so it saves through the same writer as a reshard; export reads any checkpoint
// layout through CheckpointReader.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "libckpt/hf_files.h"
#include "libckpt/layout.h"

namespace leantron::ckpt {

struct HfImportOptions {
  ParallelConfig target;
  int64_t iteration = 0;
  int64_t make_vocab_size_divisible_by = 128;
  // Copy tokenizer files (vocab.json, merges.txt, tokenizer.json, ...) into <save>/tokenizer/.
  bool copy_tokenizer_files = false;
  bool overwrite = false;  // See CheckSaveDestination.
};

absl::Status ImportHfCheckpoint(const std::string& hf_dir, const std::string& save_dir,
                                const HfImportOptions& options);

struct HfExportOptions {
  std::optional<int64_t> iteration;  // The tracker's when unset.
  uint64_t max_shard_bytes = kHfDefaultMaxShardBytes;
  bool copy_tokenizer_files = false;
  std::string tokenizer_dir;  // Where to copy them from; <load>/tokenizer when empty.
  // The folder is written beside its destination and renamed into place when complete, so it
  // holds exactly this export. A destination that holds anything is refused unless `overwrite`,
  // which replaces the folder as a whole.
  bool overwrite = false;
  bool verify = true;  // Verify the checkpoint's checksums (CheckpointReader::Options).
};

absl::Status ExportHfCheckpoint(const std::string& load_dir, const std::string& hf_dir,
                                const HfExportOptions& options);

}  // namespace leantron::ckpt
