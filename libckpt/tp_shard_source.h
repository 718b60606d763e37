// A checkpoint source whose tensors are per-TP-rank shards held somewhere in mapped files (the
// legacy Megatron reader's tensors inside torch.save archives): ReadFull merges a parameter's
// shards into its full tensor the way CheckpointReader does for the project's own files, dropping
// source pages as the copy passes them.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "libckpt/checkpoint_reader.h"
#include "libckpt/mapped_file.h"
#include "libckpt/torch_archive.h"

namespace leantron::ckpt {

struct ShardRef {
  std::span<const std::byte> data;   // The shard's bytes, row-major in its shard shape.
  const MappedFile* file = nullptr;  // Whose pages to release once copied.
  // The torch.save storage record holding `data`, checked against its CRC-32 before the first
  // copy out of it when the source verifies (CheckpointReadOptions::verify).
  const TorchArchive* archive = nullptr;
  std::string storage_key;
};

class TpShardSource : public CheckpointSource {
 public:
  absl::Status ReadFull(const ParamSpec& target, TensorKind kind, Tensor* out) override;

 protected:
  TpShardSource(CheckpointMetadata metadata, ModelLayout layout)
      : CheckpointSource(std::move(metadata), std::move(layout)) {}
  // Registers rank `tp_rank`'s shard of canonical parameter `name` for `kind`; the shard must
  // already be checked against the layout (shape and dtype).
  void AddShard(TensorKind kind, const std::string& name, int tp_rank, ShardRef shard);
  // Whether every parameter (tied copies aside) has a shard on every TP rank for `kind`; returns
  // the first missing one otherwise.
  std::optional<std::pair<std::string, int>> FirstMissing(TensorKind kind) const;
  bool verify_storages_ = false;  // Check each ShardRef's record before copying from it.

 private:
  // [kind][canonical name][tp rank]
  absl::flat_hash_map<std::string, std::vector<ShardRef>> shards_[4];
};

}  // namespace leantron::ckpt
