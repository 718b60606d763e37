// Saving a checkpoint iteration atomically. A crash at any point leaves the previous iteration and
// the tracker untouched:
//   1. shards and metadata.json are written into <dir>/iter_XXXXXXX.tmp/ (each file itself via a
//      temporary name, fsynced);
//   2. every shard is verified present and complete against the layout, directories are fsynced;
//   3. the directory is renamed to iter_XXXXXXX (atomically exchanged if it already exists);
//   4. latest_checkpointed_iteration.txt is replaced via temporary file + rename, last.
//
// A distributed trainer runs the same steps split by rank: rank 0 calls PrepareCheckpointSave, each
// (tp, pp) rank of data-parallel rank 0 calls WriteRankShard, and after a barrier rank 0 calls
// CommitCheckpointSave. A single process (the tools) uses CheckpointWriter, which streams whole
// tensors into every rank's files.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "libckpt/checkpoint_metadata.h"
#include "libckpt/checkpoint_reader.h"
#include "libckpt/layout.h"
#include "libckpt/progress.h"
#include "libckpt/safetensors_writer.h"

namespace leantron::ckpt {

// Called at each step of a save ("shard", "metadata", "verified", "renamed", "tracker"), so callers
// can report progress; tests use it to kill the writer at every step.
using SaveProgress = std::function<void(std::string_view step)>;

// Whether a tool may save `iteration` into `checkpoint_dir`: yes when the directory is absent or
// empty, or is a checkpoint directory whose tracker is older than `iteration` and that lacks it;
// otherwise only with `overwrite` (which replaces the iteration and points the tracker at it).
// Refusing keeps a trained iteration (and its optimizer state) from being replaced by mistake.
absl::Status CheckSaveDestination(const std::string& checkpoint_dir, int64_t iteration,
                                  bool overwrite);

// Creates a fresh <dir>/iter_XXXXXXX.tmp (removing a stale one from a crashed save); returns it.
absl::StatusOr<std::string> PrepareCheckpointSave(const std::string& checkpoint_dir,
                                                  int64_t iteration);

// One rank's tensors, named by their Megatron-Core names and holding that rank's shard.
struct RankTensor {
  std::string name;
  std::span<const std::byte> data;
};
absl::Status WriteRankShard(const std::string& temp_dir, const ModelLayout& layout, int tp_rank,
                            int pp_rank, const std::vector<RankTensor>& params,
                            const std::vector<RankTensor>* main_params,
                            const std::vector<RankTensor>* exp_avg,
                            const std::vector<RankTensor>* exp_avg_sq);

absl::Status CommitCheckpointSave(const std::string& checkpoint_dir, const std::string& temp_dir,
                                  const CheckpointMetadata& metadata,
                                  const SaveProgress& progress = nullptr);

// Steps 3 and 4 of a save, for any format written into PrepareCheckpointSave's directory: moves
// the complete <dir>/iter_XXXXXXX.tmp into place (exchanging an iteration already there) and
// replaces the tracker, last.
absl::Status PublishIteration(const std::string& checkpoint_dir, const std::string& temp_dir,
                              int64_t iteration, const SaveProgress& progress = nullptr);

class CheckpointWriter {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(
      const std::string& checkpoint_dir, const CheckpointMetadata& metadata);

  const ModelLayout& layout() const { return layout_; }
  // A full tensor (shape `spec.shape`) split into every TP rank's shard of its stage and into the
  // tied copies of it: after BeginFull, its bytes arrive front to back in consecutive pieces of
  // any size (FullTensorSource::StreamFull), and each piece goes straight on to the shards that
  // hold its bytes; EndFull checks that all of them came.
  absl::Status BeginFull(const ParamSpec& spec, TensorKind kind);
  absl::Status AppendFull(std::span<const std::byte> piece);
  absl::Status EndFull();
  absl::Status Commit(const SaveProgress& progress = nullptr);

 private:
  CheckpointWriter(CheckpointMetadata metadata, ModelLayout layout)
      : metadata_(std::move(metadata)), layout_(std::move(layout)) {}
  // Bytes [at, at + piece.size()) of the full tensor, to every TP rank's shard of `target`.
  absl::Status AppendShards(const ParamSpec& target, std::span<const std::byte> piece, size_t at);
  // The tensor between BeginFull and EndFull.
  struct Streaming {
    const ParamSpec* spec = nullptr;
    std::vector<const ParamSpec*> targets;  // spec and its tied copies
    TensorKind kind = TensorKind::kParam;
    size_t element_size = 0;
    size_t at = 0, size = 0;
  };
  Streaming streaming_;
  std::string checkpoint_dir_;
  std::string temp_dir_;
  CheckpointMetadata metadata_;
  ModelLayout layout_;
  // [pp][tp]
  std::vector<std::vector<std::unique_ptr<SafetensorsWriter>>> model_writers_;
  std::vector<std::vector<std::unique_ptr<SafetensorsWriter>>> optimizer_writers_;
  std::vector<std::byte> shard_buffer_;
};

// Pulls every parameter (and optimizer state when both sides have it) from `source` and saves it
// in the layout of `metadata`, one full tensor in memory at a time. The reshard tool, the HF
// importer and tests share this path.
absl::Status SaveCheckpointFrom(FullTensorSource& source, const CheckpointMetadata& metadata,
                                const std::string& checkpoint_dir,
                                const SaveProgress& progress = nullptr,
                                const ProgressOptions& show_progress = {});

// What a tool writes: the project's format, or Megatron-LM's legacy torch format
// (megatron_writer.h); --save-format leantron|megatron.
enum class SaveFormat { kLeantron, kMegatron };
absl::StatusOr<SaveFormat> ParseSaveFormat(std::string_view name);

}  // namespace leantron::ckpt
